"""The drop-in module inside a compiled model (GPU): the example model file
(python/examples/muse_spark.py) with 3 MoE layers at the model's widths (H
8192, P 4096; formats bf16, nvfp4, nvfp4_swizzled), loaded the way vLLM
loads one (weight_loader, then processing and attach), run under
torch.compile(fullgraph=True, dynamic=True) and inference_mode, then
captured into a CUDA graph and replayed 100 times with new inputs. Every
replay's output must equal, bit for bit, the same model run eagerly and the
same model built on the stock path (Workspace(path="stock"): this library's
GEMM engines without the mailbox, the stock all-gather, ExpertNorm, the
stock quantizer; the same bits at b <= 16, see test_ops_gpu.py). At tp 1;
at tp 2 as two processes sharing one GPU (gloo rendezvous, CUDA IPC
mailboxes, the stock all-gather through host memory); at tp 2 on two GPUs
with an NCCL device group where a machine has two.

Then b = 17, 32, 64: the fast model takes the stock path (its counters say
so, and b = 1..16 counted fast), still equal to the stock model and to
eager, and captured too where the stock all-gather can be (tp 1, NCCL).

The model's stand-in experts use exact arithmetic only (see the example),
and the model is compiled with Inductor's emulate_precision_casts
(ms.COMPILE_OPTIONS), so that its residual adds round as eager's do: the
comparisons see the boundaries, not torch.compile's rounding. (Without it
Inductor may fuse the residual adds of consecutive layers into one FP32
sum with one BF16 rounding, x + y0 + y1, where eager rounds x + y0 first:
other bits than eager, as docs/python.md records.)

Run: PYTHONPATH=<build>/python python -m pytest python/tests/test_model_gpu.py
"""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible: the compiled model needs one", allow_module_level=True)
if torch.cuda.get_device_capability(0)[0] < 9:
    pytest.skip("the library needs compute capability 9.0 or newer", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import muse_spark as ms  # noqa: E402
from _gpu_util import no_multicast_env, same_bits, seed  # noqa: E402
from spark_decode.moe import Workspace  # noqa: E402

CONFIG = ms.MuseSparkConfig(num_hidden_layers=3, layer_formats=("bf16", "nvfp4", "nvfp4_swizzled"))
FAST_BATCHES = (7, 1, 16)  # 7 first: the dynamic graph; 1 is specialised by torch.compile
STOCK_BATCHES = (17, 32, 64)
REPLAYS = 100
# A peer still compiling (or capturing) is late by far more than the
# default spin timeout; vLLM's ranks compile at startup the same way.
SPIN_TIMEOUT_S = 900.0


def model_input(s: int, b: int, i: int, device: int) -> torch.Tensor:
    """The same [b, H] hidden rows on every rank (a function of the seed)."""
    g = torch.Generator(device=torch.device("cuda", device))
    g.manual_seed((s * 1000003 + b * 1009 + i) % (2**63))
    return torch.randn(b, CONFIG.hidden_size, generator=g, device=torch.device("cuda", device)).to(torch.bfloat16)


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


def model_checks(group, device: int, s: int, *, capture_fallback: bool, replays: int = REPLAYS) -> list[str]:
    """Every check on this rank (every rank runs the same calls in the same
    order); returns what failed."""
    failures: list[str] = []
    torch.cuda.set_device(device)
    H, P = CONFIG.hidden_size, CONFIG.moe_hidden_size
    fast_ws = Workspace(group, hidden=H, pooled=P, device=device, spin_timeout_s=SPIN_TIMEOUT_S)
    stock_ws = Workspace(group, hidden=H, pooled=P, device=device, spin_timeout_s=SPIN_TIMEOUT_S, path="stock")
    checkpoint = ms.random_checkpoint(CONFIG, s, torch.device("cuda", device))
    fast = ms.MuseSparkForCausalLM(CONFIG, workspace=fast_ws)
    stock = ms.MuseSparkForCausalLM(CONFIG, workspace=stock_ws)
    fast.load_weights(checkpoint.items())
    stock.load_weights(checkpoint.items())
    del checkpoint
    compiled = torch.compile(fast, fullgraph=True, dynamic=True, options=ms.COMPILE_OPTIONS)
    stream = torch.cuda.current_stream(device)
    tp = fast_ws.tp

    def counts():
        c = {"pooler": dict(fast_ws.pooler.path_counts), "stock pooler": dict(stock_ws.pooler.path_counts)}
        if fast_ws.mailbox is not None:
            c["mailbox"] = dict(fast_ws.mailbox.path_counts)
        return c

    with torch.inference_mode():
        for b in FAST_BATCHES + STOCK_BATCHES:
            path = "fast" if b <= fast_ws.capacity else "stock"
            before = counts()
            x = model_input(s, b, -1, device)
            eager = fast(x)
            reference = stock(x)
            got = compiled(x)
            stream.synchronize()
            after = counts()
            # Three layers, each called by the eager and the compiled model.
            if delta(before["pooler"], after["pooler"]) != {"fast": 0, "stock": 0, path: 6}:
                failures.append(f"b={b}: the fast model's pooler paths {delta(before['pooler'], after['pooler'])}")
            if delta(before["stock pooler"], after["stock pooler"]) != {"fast": 0, "stock": 3}:
                failures.append(f"b={b}: the stock model's pooler paths")
            if "mailbox" in after and delta(before["mailbox"], after["mailbox"]) != {"fast": 0, "stock": 0, path: 6}:
                failures.append(f"b={b}: the fast model's mailbox paths {delta(before['mailbox'], after['mailbox'])}")
            if not same_bits(eager, reference):
                failures.append(f"tp {tp} b={b}: eager differs from the stock path")
            if not same_bits(got, eager):
                failures.append(f"tp {tp} b={b}: compiled differs from eager")
            if b > fast_ws.capacity and not capture_fallback:
                continue
            x_static = x.clone()
            compiled(x_static)  # any recompile for this b happens here, not under capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out_static = compiled(x_static)
            wrong = []
            for i in range(replays):
                xi = model_input(s, b, i, device)
                x_static.copy_(xi)
                graph.replay()
                want, want_stock = fast(xi), stock(xi)
                stream.synchronize()
                if not (same_bits(out_static, want) and same_bits(out_static, want_stock)):
                    wrong.append(i)
            if wrong:
                failures.append(f"tp {tp} b={b}: replays {wrong[:10]} (of {len(wrong)}) differ from eager or stock")
            del graph
    stream.synchronize()
    fast_ws.barrier()
    stock_ws.barrier()
    return failures


def test_compiled_captured_model_tp1():
    torch.cuda.set_device(0)
    failures = model_checks(None, 0, seed("test_compiled_captured_model_tp1"), capture_fallback=True)
    assert not failures, failures


def _rank_main(rank, init_file, result_dir, s, distinct_gpus):
    no_multicast_env()
    import torch.distributed as dist

    device = rank if distinct_gpus else 0
    torch.cuda.set_device(device)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        # NCCL refuses two ranks on one GPU: there the stock all-gather goes
        # through host memory over the gloo group.
        device_group = dist.new_group(backend="nccl") if distinct_gpus else None
        coordinator = ms.GroupCoordinator(2, rank, cpu_group=dist.group.WORLD, device_group=device_group)
        failures = model_checks(coordinator, device, s, capture_fallback=distinct_gpus)
        with open(os.path.join(result_dir, f"rank{rank}"), "w") as f:
            f.write("\n".join(failures))
    finally:
        dist.destroy_process_group()


def _two_ranks(distinct_gpus: bool, name: str):
    import torch.multiprocessing as mp

    no_multicast_env()
    s = seed(name)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank_main, args=(os.path.join(tmp, "rendezvous"), tmp, s, distinct_gpus), nprocs=2, join=True)
        for rank in range(2):
            with open(os.path.join(tmp, f"rank{rank}")) as f:
                report = f.read()
            assert report == "", f"rank {rank}:\n{report}"


def test_compiled_captured_model_tp2_sharing_one_gpu():
    _two_ranks(False, "test_compiled_captured_model_tp2_sharing_one_gpu")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (tp 2 across GPUs, NCCL device group)")
def test_compiled_captured_model_tp2_two_gpus():
    _two_ranks(True, "test_compiled_captured_model_tp2_two_gpus")
