"""The PyTorch binding on a GPU: the spark_decode package over torch tensors.

The kernels themselves are checked exhaustively by the C++ GPU tests
(tests/gpu); these tests check what the binding adds: tensors, dtypes,
strides and devices described correctly, torch's current stream (and CUDA
graph capture) honoured, scratch views wrapped without copies, errors raised
as InvalidArgument / ValueError with the library's reasons, and the
torch.distributed group. Fresh random inputs every run; the seed is printed
and SPARK_TEST_SEED replays it.

Run: PYTHONPATH=<build>/python python -m pytest python/tests
"""

from __future__ import annotations

import os
import tempfile
import types

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible: the binding's GPU tests need one", allow_module_level=True)
if torch.cuda.get_device_capability(0)[0] < 9:
    pytest.skip("the library needs compute capability 9.0 or newer", allow_module_level=True)

import spark_decode as sd  # noqa: E402

from _gpu_util import POISON, check_gemm, generator, poisoned, randn, seed  # noqa: E402


@pytest.fixture
def gen(request):
    return generator(seed(request.node.name))


# ---- Unpooler ------------------------------------------------------------------


@pytest.mark.parametrize("n,k", [(48, 256), (1024, 4096)])
def test_unpooler_every_m_against_fp64_with_guard_rows(gen, n, k):
    w = randn(gen, n, k)
    u = sd.Unpooler(w)
    assert (u.n, u.k, u.max_m) == (n, k, 16)
    for m in range(1, 17):
        x = randn(gen, m, k, scale=4.0)
        x[0, :7] = -0.0
        full = poisoned(m + 2, n)
        out = full[1 : m + 1]
        assert u.run(x, out) is out
        torch.cuda.synchronize()
        check_gemm(x, w, out)
        guards = torch.cat([full[:1], full[m + 1 :]]).view(torch.int16)
        assert (guards == POISON).all(), f"m={m}: a guard row was written"


def test_unpooler_graph_replay_and_side_stream_equal_eager(gen):
    n, k = 2048, 4096
    w = randn(gen, n, k)
    u = sd.Unpooler(w)
    for m in (1, 9, 16):
        x_static, out_static = randn(gen, m, k), poisoned(m, n)
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            u.run(x_static, out_static)  # warm the tile before capture
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            u.run(x_static, out_static)
        for _ in range(3):
            x = randn(gen, m, k)
            x_static.copy_(x)
            out_static.fill_(0)
            graph.replay()
            eager = poisoned(m, n)
            # The run must go to the side stream, held back by a sleep: once
            # the current stream is done, `eager` is still poison. (The side
            # stream waits for the stream that wrote x and poisoned `eager`.)
            main = torch.cuda.current_stream()
            with torch.cuda.stream(side):
                side.wait_stream(main)
                torch.cuda._sleep(50_000_000)
                u.run(x, eager)
            torch.cuda.current_stream().synchronize()
            assert (eager.view(torch.int16) == POISON).all(), "run did not enqueue on torch's current stream"
            torch.cuda.synchronize()
            assert torch.equal(out_static.view(torch.int16), eager.view(torch.int16))
            check_gemm(x, w, eager)


def test_unpooler_pdl_off_and_reproducible(gen):
    n, k = 4096, 4096
    w = randn(gen, n, k)
    on, off = sd.Unpooler(w), sd.Unpooler(w, enable_pdl=False)
    assert on.enable_pdl and not off.enable_pdl
    x = randn(gen, 16, k)
    first = on.run(x, poisoned(16, n)).clone()
    check_gemm(x, w, first)  # every element written and right, so the equalities below mean something
    for _ in range(20):
        assert torch.equal(on.run(x, poisoned(16, n)).view(torch.int16), first.view(torch.int16))
    assert torch.equal(off.run(x, poisoned(16, n)).view(torch.int16), first.view(torch.int16))
    # Batch invariance: row i alone equals row i of the batch.
    for i in (0, 7, 15):
        alone = on.run(x[i : i + 1].contiguous(), poisoned(1, n))
        assert torch.equal(alone.view(torch.int16), first[i : i + 1].view(torch.int16))


def test_unpooler_from_moe_takes_the_rank_rows(gen):
    hidden, k, tp = 2048, 4096, 2
    full = randn(gen, hidden, k)
    moe = types.SimpleNamespace(unpooler=types.SimpleNamespace(weight=full))
    u = sd.Unpooler.from_moe(moe, tp, 1)
    assert u.weight.data_ptr() == full[hidden // 2 :].data_ptr()
    x = randn(gen, 3, k)
    got = u.run(x, poisoned(3, hidden // 2))
    want = sd.Unpooler(full[hidden // 2 :]).run(x, poisoned(3, hidden // 2))
    check_gemm(x, full[hidden // 2 :], got)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    with pytest.raises(ValueError, match=r"does not split into tp=3 row blocks"):
        sd.Unpooler.from_moe(full, 3, 0)
    with pytest.raises(ValueError, match=r"rank 2 outside \[0, 2\)"):
        sd.Unpooler.from_moe(full, 2, 2)


def test_unpooler_errors_carry_the_library_reasons(gen):
    w = randn(gen, 64, 256)
    assert sd.Unpooler.unsupported(w) is None
    reason = sd.Unpooler.unsupported(w[:40])
    assert reason is not None and "N % 16" in reason
    with pytest.raises(ValueError, match="N % 16"):
        sd.Unpooler(w[:40])
    with pytest.raises(sd.InvalidArgument, match="dtype"):
        sd.Unpooler(w.half())
    assert "dtype" in sd.Unpooler.unsupported(w.half())  # says why, never raises
    assert sd.launch_unsupported(64, 256, 3, 64, 1) is not None
    assert sd.Unpooler.unsupported(w, sd.UnpoolerShape(splits=3)) is not None
    u = sd.Unpooler(w)
    with pytest.raises(ValueError, match=r"x \[17, 256\].*needs \[1\.\.16, 256\]"):
        u.run(randn(gen, 17, 256), poisoned(17, 64))  # m > 16
    with pytest.raises(ValueError, match=r"x \[2, 128\].*needs \[1\.\.16, 256\]"):
        u.run(randn(gen, 2, 128), poisoned(2, 64))  # wrong K
    with pytest.raises(ValueError, match=r"out \[3, 64\].* != \[2, 64\]"):
        u.run(randn(gen, 2, 256), poisoned(3, 64))  # out rows != m
    with pytest.raises(ValueError, match=r"x and out must be on cuda:0"):
        u.run(randn(gen, 2, 256).cpu(), poisoned(2, 64))  # host memory
    ticket = torch.zeros(1, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="a ticket stage needs a mailbox"):
        sd.Unpooler(w, ticket=ticket)


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the refused capture, on purpose
def test_unpooler_rows_limit_what_is_prepared(gen):
    n, k = 1024, 4096
    w = randn(gen, n, k)
    u = sd.Unpooler(w, rows=[1])
    t = u.tactic
    assert u.prepared(t["token_tile"][0], t["row_tiles"][0])
    tile9, rows9 = t["token_tile"][8], t["row_tiles"][8]
    assert (tile9, rows9) != (t["token_tile"][0], t["row_tiles"][0])
    assert not u.prepared(tile9, rows9)
    x, out = randn(gen, 9, k), poisoned(9, n)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="cannot be under CUDA graph capture"):
        with torch.cuda.graph(graph):
            u.run(x, out)
    u.run(x, out)  # eager: prepares the tile now
    torch.cuda.synchronize()
    assert u.prepared(tile9, rows9)
    check_gemm(x, w, out)
    # rows=() prepares no tile (as documented); the first eager run does.
    lazy = sd.Unpooler(w, rows=())
    assert not lazy.prepared(t["token_tile"][0], t["row_tiles"][0])
    lazy.run(x[:1], out[:1])
    torch.cuda.synchronize()
    assert lazy.prepared(t["token_tile"][0], t["row_tiles"][0])
    # The shape a tactic reports is one the constructor takes back.
    same = sd.Unpooler(w, shape=sd.UnpoolerShape(**t))
    assert same.tactic == t


def test_unpooler_shape_overrides_the_table(gen):
    w = randn(gen, 1024, 4096)
    u = sd.Unpooler(w, shape=sd.UnpoolerShape(splits=1, kw=128, accs=2))
    assert (u.tactic["splits"], u.tactic["kw"], u.tactic["accs"]) == (1, 128, 2)
    x = randn(gen, 5, 4096)
    check_gemm(x, w, u.run(x, poisoned(5, 1024)))


# ---- ExpertNorm ------------------------------------------------------------------


def test_expert_norm_within_one_ulp_of_fp64(gen):
    cols, eps, gc = 4096, 1e-5, 1.0
    w = randn(gen, cols, scale=0.1)
    norm = sd.ExpertNorm(w, eps, gc)
    x = randn(gen, 7, cols, scale=3.0)
    y = norm.run(x, poisoned(7, cols))
    torch.cuda.synchronize()
    xd = x.double()
    exact = xd * torch.rsqrt((xd * xd).mean(dim=1, keepdim=True) + eps) * (w.double() + gc)
    ulp = torch.ldexp(torch.ones_like(exact), torch.clamp(torch.frexp(exact).exponent - 1, min=-126) - 7)
    assert ((y.double() - exact).abs() <= ulp).all()


# ---- LamportMailbox, one rank ----------------------------------------------------------


def test_mailbox_single_rank_round_trip_eager_and_graph(gen):
    width, capacity = 512, 8
    mb = sd.LamportMailbox(None, tp=1, rank=0, capacity=capacity, width=width, device=0)
    assert (mb.tp, mb.rank, mb.capacity, mb.width) == (1, 0, capacity, width)
    assert mb.stage_state.dtype == torch.int32 and mb.stage_state.shape == (2,)
    mb.warm_up()
    for b in (1, 3, 8, 2, 8):
        src = randn(gen, b, width)
        src[0, :5] = -0.0
        out = poisoned(b, width)
        mb.publish(src)
        mb.gather(out)
        mb.synchronize()
        want = torch.where(src == 0, torch.zeros_like(src), src)  # -0.0 arrives as +0.0
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    src_s, out_s = randn(gen, 4, width), poisoned(4, width)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mb.publish(src_s)
        mb.gather(out_s)
    for _ in range(5):
        src = randn(gen, 4, width)
        src_s.copy_(src)
        graph.replay()
        mb.synchronize()
        assert torch.equal(out_s, src)
    mb.barrier()


def test_mailbox_failure_is_survived(gen):
    """A gather with no publish since the last one (on_failure="poison", the
    default): SparkRuntimeError naming it at the next check, the output
    poisoned (never the last call's rows), every later call refused; torch
    keeps working, and a new mailbox gives correct results."""
    width = 512
    mb = sd.LamportMailbox(None, tp=1, rank=0, capacity=8, width=width, device=0, spin_timeout_s=2.0)
    src, out = randn(gen, 4, width), poisoned(4, width)
    mb.publish(src)
    mb.gather(out)
    mb.synchronize()
    assert torch.equal(out, src)
    out.fill_(1.0)
    with pytest.raises(sd.InvalidArgument, match="nothing was published"):
        mb.gather(out)  # refused eagerly, before any launch
    # The device's own check, as a replayed graph would meet it: the
    # binding's gather, past the Python-side bookkeeping.
    from spark_decode._tensors import current_stream, describe

    mb._impl.gather(describe(out, "out"), current_stream(mb.device), True)
    with pytest.raises(sd.SparkRuntimeError, match="no publish since the last consume"):
        mb.synchronize()
    assert torch.equal(out.view(torch.int16), torch.full_like(out.view(torch.int16), POISON))
    with pytest.raises(sd.SparkRuntimeError, match="destroy this mailbox"):
        mb.check()
    with pytest.raises(sd.SparkRuntimeError):
        mb.publish(src)
    # The context is usable: torch, a new mailbox, a new Pooler.
    assert torch.ones(1000, device="cuda").sum().item() == 1000.0
    del mb
    mb2 = sd.LamportMailbox(None, tp=1, rank=0, capacity=8, width=width, device=0)
    out2 = poisoned(4, width)
    mb2.publish(src)
    mb2.gather(out2)
    mb2.synchronize()
    assert torch.equal(out2, src)
    mb2.barrier()
    with pytest.raises(sd.InvalidArgument, match="neither 'poison' nor 'trap'"):
        sd.LamportMailbox(None, tp=1, rank=0, capacity=8, width=width, device=0, on_failure="ignore")


def test_unpooler_zero_copy_publish_single_rank(gen):
    """With a mailbox the unpooler's epilogue publishes y itself: the plain
    gather then reads exactly y (-0.0 as +0.0), call after call, eager and
    captured."""
    n, k = 1024, 4096
    mb = sd.LamportMailbox(None, tp=1, rank=0, capacity=16, width=n, device=0)
    w = randn(gen, n, k)
    u = sd.Unpooler(w, mb)
    assert u.mailbox is mb and u.max_m == 16
    with pytest.raises(ValueError, match="mailbox width"):
        sd.Unpooler(randn(gen, 512, k), mb)
    mb.warm_up()
    for m in (1, 16, 5, 9, 2):
        x = randn(gen, m, k)
        out, rows = poisoned(m, n), poisoned(m, n)
        u.run(x, out)
        mb.gather(rows)
        mb.synchronize()
        check_gemm(x, w, out)
        want = torch.where(out == 0, torch.zeros_like(out), out)
        assert torch.equal(rows.view(torch.int16), want.view(torch.int16))
    x_s, out_s, rows_s = randn(gen, 4, k), poisoned(4, n), poisoned(4, n)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        u.run(x_s, out_s)
        mb.gather(rows_s)
    for _ in range(4):
        x_s.copy_(randn(gen, 4, k))
        graph.replay()
        mb.synchronize()
        check_gemm(x_s, w, out_s)
        assert torch.equal(rows_s, out_s)
    mb.barrier()


# ---- Pooler, one rank ------------------------------------------------------------------

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def dequantize(a, a_sf, global_scale):
    """NVFP4 (two E2M1 codes a byte, even column low; one E4M3 scale per 16)
    back to FP64: code * scale / global_scale."""
    lut = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float64, device=a.device)
    codes = torch.stack([a & 0xF, a >> 4], dim=-1).reshape(a.shape[0], -1).long()
    values = lut[codes]
    scales = a_sf.to(torch.float64).repeat_interleave(16, dim=1)
    return values * scales / global_scale.double()


def make_layers(gen, hidden, pooled, kinds):
    layers = []
    for nvfp4 in kinds:
        weight = randn(gen, pooled, hidden, scale=0.02)
        norm_weight = randn(gen, pooled, scale=0.1)
        scale = torch.tensor([448.0 * 6.0 / 20.0], device="cuda") if nvfp4 else None
        moe = types.SimpleNamespace(
            pooler=types.SimpleNamespace(weight=weight),
            pre_expert_norm=types.SimpleNamespace(
                weight=norm_weight,
                has_weight=True,
                variance_size_override=None,
                applies_weight_before_norm=False,
                variance_epsilon=1e-5,
                fused_gain_center=1.0,
            ),
            experts=types.SimpleNamespace(nvfp4_input_global_scale=scale),
        )
        layers.append(sd.pooler_layer(moe, 1, 0))
    return layers


def test_pooler_layer_checks_the_stock_module(gen):
    (layer,) = make_layers(gen, 8192, 4096, [True])
    assert layer.weight.shape == (4096, 8192) and layer.global_scale.shape == (1,)
    bad = types.SimpleNamespace(
        pooler=types.SimpleNamespace(weight=randn(gen, 4096, 4096)),
        pre_expert_norm=None,
        experts=types.SimpleNamespace(nvfp4_input_global_scale=None),
    )
    with pytest.raises(ValueError, match=r"pooler weight must be \[4096, 8192\] BF16"):
        sd.pooler_layer(bad, 1, 0)


def test_pooler_single_rank_run_equals_its_parts(gen):
    hidden, pooled = 8192, 4096
    layers = make_layers(gen, hidden, pooled, [False, True, False])
    batches = (1, 4, 16)
    pooler = sd.Pooler(None, tp=1, rank=0, device=0, layers=layers, batches=batches)
    assert (pooler.mailbox.tp, pooler.mailbox.width, pooler.mailbox.capacity) == (1, pooled, 16)
    pooler.warm_up()
    norms = [sd.ExpertNorm(layer.norm_weight, layer.eps, layer.gain_center) for layer in layers]
    for step in range(6):
        b = batches[step % len(batches)]
        for index, layer in enumerate(layers):
            x = randn(gen, b, hidden)
            shard = pooler.project(index, x).clone()
            check_gemm(x, layer.weight, shard)
            pooler.publish(b)
            gathered = _as_tuple(pooler.gather(index, b))
            parts = [t.clone() for t in gathered]
            # run() returns views of the scratch gather() just filled: poison
            # it, so that the comparison below sees what run() itself wrote.
            for t in gathered:
                t.view(torch.uint8).fill_(0xFF)
            whole = _as_tuple(pooler.run(index, x))
            torch.cuda.synchronize()
            for got, want in zip(whole, parts):
                assert got.shape[0] == b
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
            normed = norms[index].run(shard, poisoned(b, pooled))
            torch.cuda.synchronize()
            if layer.global_scale is None:
                assert torch.equal(whole[0].view(torch.int16), normed.view(torch.int16))
            else:
                a, a_sf = whole
                pooler.synchronize()
                assert pooler.timeout_report() is None
                assert a.dtype == torch.uint8 and a.shape == (b, pooled // 2)
                assert a_sf.dtype == torch.float8_e4m3fn and a_sf.shape == (b, pooled // 16)
                sf = a_sf.to(torch.float64).repeat_interleave(16, dim=1) / layer.global_scale.double()
                err = (dequantize(a, a_sf, layer.global_scale) - normed.double()).abs()
                assert (err <= sf * 1.0 + normed.double().abs() * 0.07 + 1e-30).all()
    # Outputs keep the scratch they show alive, like torch slices.
    kept = _as_tuple(pooler.run(1, randn(gen, 4, hidden)))
    snapshot = [t.clone() for t in kept]
    pooler.barrier()
    del pooler
    import gc

    gc.collect()
    torch.empty(64 << 20, dtype=torch.uint8, device="cuda").fill_(0x5A)  # reuse freed memory, if any
    torch.cuda.synchronize()
    for got, want in zip(kept, snapshot):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_pooler_graph_replay_equals_eager(gen):
    hidden, pooled = 8192, 4096
    layers = make_layers(gen, hidden, pooled, [True, False])
    pooler = sd.Pooler(None, tp=1, rank=0, device=0, layers=layers, batches=(4,))
    pooler.warm_up()
    x_static = randn(gen, 4, hidden)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [_as_tuple(pooler.run(i, x_static)) for i in range(2)]
    for _ in range(3):
        x = randn(gen, 4, hidden)
        x_static.copy_(x)
        for t in outs[0] + outs[1]:
            t.view(torch.uint8).fill_(0xFF)  # poison: the replay must write every byte
        graph.replay()
        torch.cuda.synchronize()
        replayed = [t.clone() for t in outs[0] + outs[1]]
        eager = [t.clone() for t in _as_tuple(pooler.run(0, x)) + _as_tuple(pooler.run(1, x))]
        torch.cuda.synchronize()
        for got, want in zip(replayed, eager):
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
        assert not (eager[-1].view(torch.int16) == POISON).any(), "the edge layer left poison"
    pooler.barrier()


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


# ---- torch.distributed: two processes -----------------------------------------------


def _exchange_rounds(mb, rank: int, width: int, rounds: int) -> list[int]:
    """Rounds of publish + gather at tp 2 with random b; every rank can make
    every rank's rows (seeded by round and source), so each checks the
    gathered rows whole. Returns the rounds whose rows came out wrong."""
    g = torch.Generator(device="cuda")
    failures = []
    for r in range(rounds):
        b = 1 + (r * 7) % 16
        rows = []
        for q in range(2):
            g.manual_seed(1000 * r + q)
            rows.append(torch.randn(b, width, generator=g, device="cuda").to(torch.bfloat16))
        out = poisoned(b, 2 * width)
        mb.publish(rows[rank])
        mb.gather(out)
        mb.synchronize()
        if not torch.equal(out, torch.cat(rows, dim=1)):
            failures.append(r)
    return failures


def _two_rank_mailbox(rank, init_file, width, rounds, result_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.cuda.set_device(rank % torch.cuda.device_count())
    device = torch.cuda.current_device()
    mb = sd.LamportMailbox(dist.group.WORLD, tp=2, rank=rank, capacity=16, width=width, device=device)
    mb.warm_up()
    failures = _exchange_rounds(mb, rank, width, rounds)
    mb.barrier()
    with open(os.path.join(result_dir, f"rank{rank}"), "w") as f:
        f.write(",".join(map(str, failures)))
    dist.destroy_process_group()


def test_mailbox_over_torch_distributed_two_processes():
    """Two processes, a gloo ProcessGroup as the rendezvous (CUDA IPC between
    them), on two GPUs where there are, else both on one (the mailbox alone
    may share a GPU: docs/perf/mailbox.md)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        mp.spawn(_two_rank_mailbox, args=(init_file, 1024, 200, tmp), nprocs=2, join=True)
        for rank in range(2):
            with open(os.path.join(tmp, f"rank{rank}")) as f:
                assert f.read() == "", f"rank {rank}: rounds with wrong rows"


# ---- ranks as threads of one process -------------------------------------------------


class _ThreadGroup:
    """A rendezvous for ranks that are threads of this process (a
    CallbackGroup over a threading.Barrier)."""

    def __init__(self, size: int) -> None:
        import threading

        self.size, self._barrier, self._slots = size, threading.Barrier(size, timeout=60), [b""] * size

    def member(self, rank: int):
        def all_gather(data: bytes) -> bytes:
            self._slots[rank] = data
            self._barrier.wait()
            out = b"".join(self._slots)
            self._barrier.wait()
            return out

        return sd.CallbackGroup(rank, self.size, all_gather, self._barrier.wait)


def test_mailbox_ranks_as_threads_of_one_process():
    """Two ranks as threads (one GPU each where there are two, else sharing
    one): the collective constructor, warm_up, synchronize and barrier wait
    for the other thread, so the binding must release the GIL while they
    wait, or the other rank never gets to publish (a spin timeout)."""
    import threading

    width, rounds, group = 1024, 100, _ThreadGroup(2)
    errors: list = [None, None]

    def rank_main(rank: int) -> None:
        try:
            device = rank % torch.cuda.device_count()
            torch.cuda.set_device(device)
            with torch.cuda.stream(torch.cuda.Stream()):  # a rank's own stream
                mb = sd.LamportMailbox(group.member(rank), tp=2, rank=rank, capacity=16, width=width, device=device)
                mb.warm_up()
                failures = _exchange_rounds(mb, rank, width, rounds)
                mb.barrier()
                assert not failures, f"rounds with wrong rows: {failures}"
        except BaseException as e:  # noqa: BLE001 (reported by the main thread)
            errors[rank] = e

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert errors == [None, None], errors
