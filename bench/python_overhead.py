"""Host cost of one eager call through the PyTorch binding, against the same
call replayed from a CUDA graph (where Python costs nothing per call).

    PYTHONPATH=<build>/python python bench/python_overhead.py

Eager: 5000 back-to-back calls, wall time per call (the host issues faster
than a tiny GEMM runs only if its cost per call is below the kernel's). Graph:
the same 5000 calls captured once and replayed, CUDA events. The shape is
tp 8's unpooler (N = 1024, K = 4096, M = 1), the smallest the model runs.
"""

import time

import torch

import spark_decode as sd

CALLS = 5000


def main() -> None:
    n, k = 1024, 4096
    w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    out = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
    u = sd.Unpooler(w, enable_pdl=False)
    mb = sd.LamportMailbox(None, tp=1, rank=0, capacity=16, width=n, device=0)
    mb.warm_up()
    rows = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")

    def timed(label, fn):
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        host = (time.perf_counter() - t0) / CALLS * 1e6
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / CALLS * 1e6
        print(f"{label:40s} eager: host {host:6.2f} us/call, wall {wall:6.2f} us/call")

    timed("Unpooler.run (m=1, 1024x4096)", lambda: u.run(x, out))
    timed("LamportMailbox.publish + gather (b=1)", lambda: (mb.publish(out), mb.gather(rows)))
    timed("torch.matmul (same shape, reference)", lambda: torch.matmul(x, w.T, out=out))

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(100):
            u.run(x, out)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(CALLS // 100):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    print(f"{'Unpooler.run in a CUDA graph (warm L2)':40s} graph: {start.elapsed_time(end) * 1e3 / CALLS:6.2f} us/call")
    mb.barrier()


if __name__ == "__main__":
    main()
