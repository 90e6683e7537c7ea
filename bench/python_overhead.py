"""The PyTorch binding's cost, in one run on one GPU (docs/python.md):

1. Eager host cost per call: the class methods as before the torch ops
   (Unpooler.run, LamportMailbox.publish + gather, Pooler.run into scratch)
   against the same steps through torch.ops.spark_decode.* (the ops
   allocate their outputs and pick the path), and torch.matmul as a
   reference. 5000 back-to-back calls, wall time per call on the host
   (the GPU keeps up only if the host is slower than the kernels).
2. Inside a CUDA graph the ops must add nothing: the same boundary kernels
   captured three ways (the class calls into preallocated tensors, the
   eager model through the ops, the compiled model) and replayed; CUDA
   events per replay.
3. The example model (python/examples/muse_spark.py, tp 1, --layers MoE
   layers at the model's widths, distinct weights: cold L2), compiled with
   torch.compile(fullgraph=True) and graph-captured, against the same model
   on the stock path (Workspace(path="stock")), per step at each b.

    PYTHONPATH=<build>/python python bench/python_overhead.py [--out DIR] [--layers 16]

Writes python_overhead.json and .md (docs/design.md, "Benchmark records")
under --out (./spark-decode-out unless given; commit them under
bench/results/<machine kind>/; SPARK_DECODE_COMMIT names the commit where
the tree has no git history).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import torch

import spark_decode as sd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "examples"))
import muse_spark as ms  # noqa: E402

CALLS = 5000
H, P = 8192, 4096


def commit() -> str:
    if os.environ.get("SPARK_DECODE_COMMIT"):
        return os.environ["SPARK_DECODE_COMMIT"]
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=HERE, capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def host_us(fn) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    host = (time.perf_counter() - t0) / CALLS * 1e6
    torch.cuda.synchronize()
    return host


def capture(fn) -> torch.cuda.CUDAGraph:
    """A CUDA graph of one fn() call (warmed up on a side stream first)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    return graph


def graphs_us(fns: dict, replays: int = 200, repeats: int = 7) -> dict:
    """{name: us per replay} of a graph of each fn: the graphs captured first,
    then timed in turn, round after round (so that no variant gets the
    clock's or the caches' better moment), the median of the rounds' means."""
    graphs = {name: capture(fn) for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, graph in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / replays)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def eager_overhead(records: list) -> None:
    n = 1024  # tp 8's unpooler shard, the smallest the model runs
    w = torch.randn(n, P, device="cuda").to(torch.bfloat16)
    m = torch.randn(1, P, device="cuda").to(torch.bfloat16)
    y = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
    rows = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
    u = sd.Unpooler(w, enable_pdl=False)
    mb = sd.LamportMailbox(None, tp=1, rank=0, capacity=16, width=n, device=0)
    mb.warm_up()
    pooler = sd.Pooler(None, tp=1, rank=0, device=0, hidden=H, pooled=P, batches=(1,))
    pooler.attach(0, sd.PoolerLayer(torch.randn(P, H, device="cuda").to(torch.bfloat16) / 90,
                                    torch.randn(P, device="cuda").to(torch.bfloat16), 1e-5, 1.0,
                                    torch.tensor([300.0], device="cuda"), "nvfp4"))
    pooler.warm_up()
    x = torch.randn(1, H, device="cuda").to(torch.bfloat16)
    ops = torch.ops.spark_decode
    cases = [
        ("unpooler", "class", "Unpooler.run (m=1, 1024x4096)", lambda: u.run(m, y)),
        ("unpooler", "op", "torch.ops.spark_decode.unpool", lambda: ops.unpool(m, u.handle, n)),
        ("gather", "class", "LamportMailbox.publish + gather (b=1)", lambda: (mb.publish(y), mb.gather(rows))),
        ("gather", "op", "torch.ops.spark_decode.gather", lambda: ops.gather(y, mb.handle, 1)),
        ("pooler", "class", "Pooler.run into scratch (b=1, NVFP4)", lambda: pooler.run(0, x)),
        ("pooler", "op", "torch.ops.spark_decode.pool_nvfp4", lambda: ops.pool_nvfp4(x, pooler.handle, 0, P, False)),
        ("unpooler", "torch", "torch.matmul (same shape, reference)", lambda: torch.matmul(m, w.T, out=y)),
    ]
    for op, impl, label, fn in cases:
        us = host_us(fn)
        records.append({"op": "python_overhead", "impl": impl, "variant": label, "target": op, "mode": "eager",
                        "b": 1, "us": us})
        print(f"{label:46s} eager host {us:6.2f} us/call")
    mb.barrier()
    pooler.barrier()


def graph_overhead(records: list) -> None:
    """One MoE layer's boundary kernels, captured three ways, b = 8."""
    config = ms.MuseSparkConfig(num_hidden_layers=1, layer_formats=("nvfp4",))
    ws = sd.moe.Workspace(None, hidden=H, pooled=P)
    model = ms.MuseSparkForCausalLM(config, workspace=ws)
    model.load_weights(ms.random_checkpoint(config, 7, torch.device("cuda", 0)).items())
    layer = model.layers[0]
    b = 8
    x = torch.randn(b, H, device="cuda").to(torch.bfloat16)
    a, a_sf = ws.pooler.empty_outputs(0, b)
    y = torch.empty(b, H, dtype=torch.bfloat16, device="cuda")
    unpooler = layer.mlp._unpooler

    def classes():  # the same kernels, no op in between
        ws.pooler.run(0, x, (a, a_sf))
        m = layer.experts((a, a_sf))
        unpooler.run(m, y)
        return x + y

    compiled = torch.compile(model, fullgraph=True, options=ms.COMPILE_OPTIONS)
    timed = graphs_us({"class calls": classes, "eager model (ops)": lambda: model(x),
                       "compiled model (ops)": lambda: compiled(x)})
    for label, us in timed.items():
        records.append({"op": "python_overhead", "impl": "graph", "variant": label, "mode": "graph", "b": b,
                        "us": us})
        print(f"{'one layer, graph replay: ' + label:46s} {us:6.2f} us/step")
    ws.barrier()


def model_steps(records: list, layers: int) -> None:
    config = ms.MuseSparkConfig(num_hidden_layers=layers)
    device = torch.device("cuda", 0)
    checkpoint = ms.random_checkpoint(config, 11, device)
    models = {}
    for path in ("fast", "stock"):
        ws = sd.moe.Workspace(None, hidden=H, pooled=P, path=path)
        model = ms.MuseSparkForCausalLM(config, workspace=ws)
        model.load_weights(checkpoint.items())
        # Compiled as the example's main() and test_model_gpu.py compile it.
        models[path] = (ws, torch.compile(model, fullgraph=True, dynamic=True, options=ms.COMPILE_OPTIONS))
    del checkpoint
    with torch.inference_mode():
        for b in (1, 4, 8, 16):
            x = torch.randn(b, H, device=device).to(torch.bfloat16)
            times = graphs_us({path: (lambda c=compiled: c(x)) for path, (ws, compiled) in models.items()},
                              replays=20)
            for path in models:
                records.append({"op": "model_step", "impl": "spark" if path == "fast" else "stock",
                                "variant": f"compiled+graph, {layers} MoE layers", "mode": "graph", "tp": 1,
                                "b": b, "us": times[path]})
            print(f"model step, {layers} layers, b={b:2d}: compiled+graph {times['fast']:8.1f} us, "
                  f"stock {times['stock']:8.1f} us ({times['stock'] / times['fast']:.2f}x)")
    for ws, _ in models.values():
        ws.barrier()


def write(records: list, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    doc = {"gpu": torch.cuda.get_device_name(0), "date": datetime.date.today().isoformat(), "commit": commit(),
           "torch": torch.__version__, "records": records}
    with open(os.path.join(out, "python_overhead.json"), "w") as f:
        json.dump(doc, f, indent=1)
    lines = [f"# PyTorch binding overhead ({doc['gpu']}, {doc['date']}, {doc['commit']}, torch {doc['torch']})", "",
             "| what | impl | mode | b | us |", "| --- | --- | --- | --- | --- |"]
    for r in records:
        lines.append(f"| {r['variant']} | {r['impl']} | {r['mode']} | {r['b']} | {r['us']:.2f} |")
    with open(os.path.join(out, "python_overhead.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out}/python_overhead.json and .md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="spark-decode-out")
    parser.add_argument("--layers", type=int, default=16, help="MoE layers of the model benchmark")
    args = parser.parse_args()
    torch.cuda.set_device(0)
    records: list = []
    eager_overhead(records)
    graph_overhead(records)
    model_steps(records, args.layers)
    write(records, args.out)


if __name__ == "__main__":
    main()
