"""The torch operators (torch.ops.spark_decode.*) and what they rest on, on
one GPU: opcheck for every op (and FakeTensorMode against the real
outputs), which path serves which b (the counters), the stock path's bits
(the fast path's at b <= 16 where it runs this library's GEMM engines; the
stock pieces' above), caller-owned outputs, weights whose ``.data`` is
replaced, the zero-copy unpool + gather pair, and bad input as ValueError
with the library's reason, eagerly and from compiled code.

"The stock path" here is what the ops run where the fast path does not: the
pooler / unpooler GEMM of this library's engines without the mailbox (b <=
16: the same reduction order as the fast path, hence its bits) or
torch.matmul (b > 16: cuBLAS's bits), the stock all-gather (identity at tp
1), ExpertNorm and the stock NVFP4 quantizer. Above 16 the test builds the
same function from those pieces itself; torch.matmul's own bits are then
compared with this library's GEMM only within a bound (the two sum in
different orders).

Run: PYTHONPATH=<build>/python python -m pytest python/tests/test_ops_gpu.py
"""

from __future__ import annotations

import gc
import types

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible: the ops' GPU tests need one", allow_module_level=True)
if torch.cuda.get_device_capability(0)[0] < 9:
    pytest.skip("the library needs compute capability 9.0 or newer", allow_module_level=True)

import spark_decode as sd  # noqa: E402
from _gpu_util import check_gemm, generator, poisoned, randn, same_bits, seed  # noqa: E402
from spark_decode.pooler import empty_outputs  # noqa: E402
from torch.library import opcheck  # noqa: E402

ops = torch.ops.spark_decode
H, P = 8192, 4096
N = 1024  # the unpooler shard of tp 8 (H / 8), and the mailbox width
FORMATS = ("bf16", "nvfp4", "nvfp4_swizzled")
BATCHES = (1, 5, 16, 17, 40)  # the fast path to 16, the stock path above


def make_layer(gen, fmt: str) -> sd.PoolerLayer:
    weight = randn(gen, P, H, scale=0.02)
    norm = randn(gen, P, scale=0.1)
    scale = None if fmt == "bf16" else torch.tensor([448.0 * 6.0 / 10.0], device="cuda")
    return sd.PoolerLayer(weight, norm, 1e-5, 1.0, scale, fmt)


def canonical_zero(t: torch.Tensor) -> torch.Tensor:
    """-0.0 as +0.0, as the mailbox's publishers store it."""
    return torch.where(t == 0, torch.zeros_like(t), t)


@pytest.fixture(scope="module")
def env():
    torch.cuda.set_device(0)
    s = seed("test_ops_gpu")
    gen = generator(s)
    pooler = sd.Pooler(None, tp=1, rank=0, device=0, hidden=H, pooled=P)  # the workspace: b = 1..16
    layers = [make_layer(gen, fmt) for fmt in FORMATS]
    for i, layer in enumerate(layers):
        pooler.attach(i, layer)
    pooler.warm_up()
    unpooler_weight = randn(gen, N, P, scale=1 / 64)
    unpooler = sd.Unpooler(unpooler_weight)
    mailbox = sd.LamportMailbox(None, tp=1, rank=0, capacity=16, width=N, device=0)
    mailbox.warm_up()
    yield types.SimpleNamespace(
        gen=gen, pooler=pooler, layers=layers, unpooler=unpooler, unpooler_weight=unpooler_weight, mailbox=mailbox
    )
    torch.cuda.current_stream().synchronize()
    pooler.barrier()
    mailbox.barrier()


def nvfp4_out_args(fmt, b):
    """(a, a_sf) for pool_nvfp4_out, a_sf as its bytes (uint8): opcheck's
    schema check compares a mutated tensor with torch.allclose, which has no
    float8_e4m3fn kernel (as vLLM's quantize ops take their scales as
    integers and view them as E4M3 after)."""
    a, a_sf = empty_outputs(fmt, b, P, "cuda")
    return a, a_sf.view(torch.uint8)


def every_op_case(env, b):
    """(op, args) for every op at batch b."""
    g, p, u, mb = env.gen, env.pooler, env.unpooler, env.mailbox
    x, m, shard = randn(g, b, H), randn(g, b, P), randn(g, b, N)
    return [
        (ops.unpool.default, (m, u.handle, u.n)),
        (ops.unpool_out.default, (m, u.handle, poisoned(b, u.n))),
        (ops.gather.default, (shard, mb.handle, 1)),
        (ops.gather_out.default, (shard, mb.handle, poisoned(b, N))),
        (ops.pool_bf16.default, (x, p.handle, 0, P)),
        (ops.pool_bf16_out.default, (x, p.handle, 0, poisoned(b, P))),
        (ops.pool_nvfp4.default, (x, p.handle, 1, P, False)),
        (ops.pool_nvfp4.default, (x, p.handle, 2, P, True)),
        (ops.pool_nvfp4_out.default, (x, p.handle, 1, *nvfp4_out_args("nvfp4", b))),
        (ops.pool_nvfp4_out.default, (x, p.handle, 2, *nvfp4_out_args("nvfp4_swizzled", b))),
    ]


# ---- opcheck, fake tensors --------------------------------------------------------------


@pytest.mark.parametrize("b", BATCHES)
def test_opcheck_every_op(env, b):
    """Schema (mutations and aliasing as declared), autograd registration,
    the fake implementation against the real outputs, and AOT dispatch with
    dynamic shapes: for every op, on the fast path (b <= 16) and the stock
    path (b > 16)."""
    covered = set()
    for op, args in every_op_case(env, b):
        opcheck(op, args)
        covered.add(op.name())
    assert covered == {f"spark_decode::{name}" for name in sd.ops.SCHEMAS}
    torch.cuda.current_stream().synchronize()


@pytest.mark.parametrize("b", (1, 16, 17))
def test_fake_tensor_mode_matches_real(env, b):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    for op, args in every_op_case(env, b):
        real = op(*args)
        with FakeTensorMode() as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake = op(*fake_args)
        if real is None:  # a mutating op: nothing returned, nothing allocated
            assert fake is None
            continue
        real = real if isinstance(real, tuple) else (real,)
        fake = fake if isinstance(fake, tuple) else (fake,)
        assert len(real) == len(fake)
        for r, f in zip(real, fake):
            assert isinstance(f, FakeTensor)
            assert (r.shape, r.dtype, r.stride(), r.device) == (f.shape, f.dtype, f.stride(), f.device), op
    torch.cuda.current_stream().synchronize()


# ---- paths ----------------------------------------------------------------------------


def stock_reference(layer: sd.PoolerLayer, x: torch.Tensor):
    """The stock path above 16 built here from its pieces at tp 1 (the
    all-gather is the identity): torch.matmul, ExpertNorm, the quantizer."""
    b = x.shape[0]
    shard = torch.matmul(x, layer.weight.t())
    normed = sd.ExpertNorm(layer.norm_weight, layer.eps, layer.gain_center).run(shard, poisoned(b, P))
    if layer.format == "bf16":
        return normed
    a, a_sf = (poisoned(*t.shape, dtype=t.dtype) for t in empty_outputs(layer.format, b, P, "cuda"))
    return sd.nvfp4_quantize(normed, layer.global_scale, a, a_sf, swizzled=layer.format == "nvfp4_swizzled")


def pool(p, index, x):
    fmt = p.format(index)
    if fmt == "bf16":
        return ops.pool_bf16(x, p.handle, index, P)
    return ops.pool_nvfp4(x, p.handle, index, P, fmt == "nvfp4_swizzled")


def test_fast_path_to_16_and_the_stock_paths_bits_above(env):
    p = env.pooler
    sd.reset_path_counts(p.handle)
    for b in range(1, 17):
        for index in range(3):
            pool(p, index, randn(env.gen, b, H))
    assert sd.path_counts(p.handle) == {"fast": 48, "stock": 0}
    for b in (17, 32, 64):
        for index, layer in enumerate(env.layers):
            x = randn(env.gen, b, H, scale=2.0)
            got = pool(p, index, x)
            want = stock_reference(layer, x)
            torch.cuda.current_stream().synchronize()
            # Every byte: the swizzled scales' padding too (zero in the
            # reference, whatever torch's allocator handed the op).
            assert same_bits(got, want), (b, layer.format)
    assert sd.path_counts(p.handle) == {"fast": 48, "stock": 9}
    assert p.path_of(16) == "fast" and p.path_of(17) == "stock"


def test_unpool_paths_and_torch_matmul_within_a_bound(env):
    u, w = env.unpooler, env.unpooler_weight
    sd.reset_path_counts(u.handle)
    for b in (1, 8, 16, 17, 32, 64):
        m = randn(env.gen, b, P, scale=3.0)
        y = ops.unpool(m, u.handle, N)
        theirs = torch.matmul(m, w.t())
        torch.cuda.current_stream().synchronize()
        if b <= 16:
            check_gemm(m, w, y)  # this library's engine, within its bound of FP64
            assert same_bits(y, u.run(m, poisoned(b, N)))
            # torch.matmul sums in another order: the two agree within BF16's rounding.
            diff = (y.double() - theirs.double()).norm() / theirs.double().norm()
            assert diff <= 2.0**-7, diff.item()
        else:
            assert same_bits(y, theirs)  # the stock path is torch.matmul
    assert sd.path_counts(u.handle) == {"fast": 3, "stock": 3}


def test_stock_path_gives_the_fast_paths_bits_to_16(env):
    """The comparison the model tests rest on: a Pooler built with
    path="stock" (this library's GEMM, then ExpertNorm and the quantizer)
    equals the fused fast path bit for bit at every b <= 16, and so does a
    fast Pooler of capacity 8 for the b it serves on the stock path."""
    stock = sd.Pooler(None, tp=1, rank=0, device=0, hidden=H, pooled=P, path="stock")
    small = sd.Pooler(None, tp=1, rank=0, device=0, hidden=H, pooled=P, capacity=8)
    for i, layer in enumerate(env.layers):
        stock.attach(i, layer)
        small.attach(i, layer)
    small.warm_up()
    for b in range(1, 17):
        for index in range(3):
            x = randn(env.gen, b, H, scale=2.0)
            fast, slow, part = pool(env.pooler, index, x), pool(stock, index, x), pool(small, index, x)
            torch.cuda.current_stream().synchronize()
            assert same_bits(fast, slow), (b, FORMATS[index])
            assert same_bits(fast, part), (b, FORMATS[index])
    assert sd.path_counts(stock.handle) == {"fast": 0, "stock": 48}
    assert sd.path_counts(small.handle) == {"fast": 24, "stock": 24}
    stock.barrier()
    small.barrier()


def test_gather_paths(env):
    mb = env.mailbox
    sd.reset_path_counts(mb.handle)
    for b in (1, 16, 17, 48):
        shard = randn(env.gen, b, N)
        full = ops.gather(shard, mb.handle, 1)
        torch.cuda.current_stream().synchronize()
        assert same_bits(full, canonical_zero(shard) if b <= 16 else shard)
    assert sd.path_counts(mb.handle) == {"fast": 2, "stock": 2}


def test_stock_all_gather_without_nccl_refuses_capture():
    """Host staging cannot be captured: a clear reason instead of a broken graph."""
    group = sd.CallbackGroup(0, 2, lambda data: data * 2, lambda: None)
    coll = sd.collective(group)
    shard = torch.zeros(4, 64, dtype=torch.bfloat16, device="cuda")
    coll.all_gather_rows(shard)  # eager: fine
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="cannot be captured into a CUDA graph"):
        with torch.cuda.graph(graph):
            coll.all_gather_rows(shard)


# ---- caller-owned outputs -------------------------------------------------------------------


def test_caller_owned_outputs_stay_put(env):
    """Two layers' outputs alive at once (what a compiler keeps): each op
    returns its own tensors, and the Pooler's out forms write the caller's."""
    p, g = env.pooler, env.gen
    x1, x2 = randn(g, 4, H), randn(g, 4, H)
    first = ops.pool_nvfp4(x1, p.handle, 1, P, False)
    kept = [t.clone() for t in first]
    second = ops.pool_nvfp4(x2, p.handle, 1, P, False)
    torch.cuda.current_stream().synchronize()
    assert first[0].data_ptr() != second[0].data_ptr()
    assert same_bits(first, kept), "a later call overwrote an earlier call's output"
    assert not same_bits(first, second)
    # run(layer, x, out) into poisoned tensors equals the scratch form.
    for index, fmt in enumerate(FORMATS):
        made = empty_outputs(fmt, 4, P, "cuda")
        out = poisoned(*made.shape) if fmt == "bf16" else tuple(poisoned(*t.shape, dtype=t.dtype) for t in made)
        assert p.run(index, x1, out) is out
        scratch = p.run(index, x1)
        torch.cuda.current_stream().synchronize()
        assert same_bits(out, scratch), fmt
        # project + publish + gather(layer, b, out): the same bytes.
        again = poisoned(*made.shape) if fmt == "bf16" else tuple(poisoned(*t.shape, dtype=t.dtype) for t in made)
        p.project(index, x1)
        p.publish(4)
        assert p.gather(index, 4, again) is again
        torch.cuda.current_stream().synchronize()
        assert same_bits(again, out), fmt
    with pytest.raises(ValueError, match="pair"):
        p.run(1, x1, poisoned(4, P))
    with pytest.raises(ValueError, match=r"output a_sf .* must be contiguous aligned e4m3 \[128, 256\]"):
        p.run(2, x1, (poisoned(4, P // 2, dtype=torch.uint8), poisoned(4, P // 16, dtype=torch.float8_e4m3fn)))


# ---- weights replaced under the library ----------------------------------------------------


def churn_memory():
    """Release what torch caches and fill what it hands out next, so that a
    kernel reading freed memory would read these bytes."""
    gc.collect()
    torch.cuda.empty_cache()
    junk = torch.full((256 << 20,), 0x5A, dtype=torch.uint8, device="cuda")
    torch.cuda.current_stream().synchronize()
    return junk


def test_replacing_param_data_frees_nothing_the_library_reads(env):
    """vLLM's process_weights_after_loading may assign ``param.data``: the
    library keeps reading the storage it was given (kept alive), until the
    layer is attached again."""
    g = env.gen
    # Unpooler.
    param = torch.nn.Parameter(randn(g, N, P, scale=1 / 64), requires_grad=False)
    u = sd.Unpooler(param)
    m = randn(g, 4, P)
    before = u.run(m, poisoned(4, N)).clone()
    old = param.data_ptr()
    param.data = randn(g, N, P, scale=1 / 64)
    junk = churn_memory()
    after = u.run(m, poisoned(4, N))
    torch.cuda.current_stream().synchronize()
    assert u.weight.data_ptr() == old and same_bits(after, before)
    check_gemm(m, param, sd.Unpooler(param).run(m, poisoned(4, N)))  # built again: the new weights
    del junk
    # ExpertNorm.
    nparam = torch.nn.Parameter(randn(g, P, scale=0.1), requires_grad=False)
    norm = sd.ExpertNorm(nparam, 1e-5)
    rows = randn(g, 3, P)
    before = norm.run(rows, poisoned(3, P)).clone()
    nparam.data = randn(g, P, scale=0.1)
    junk = churn_memory()
    assert same_bits(norm.run(rows, poisoned(3, P)), before)
    del junk
    # Pooler layer: weight, norm weight and global scale.
    pooler = sd.Pooler(None, tp=1, rank=0, device=0, hidden=H, pooled=P, batches=(4,))
    w = torch.nn.Parameter(randn(g, P, H, scale=0.02), requires_grad=False)
    nw = torch.nn.Parameter(randn(g, P, scale=0.1), requires_grad=False)
    gs = torch.nn.Parameter(torch.tensor([268.8], device="cuda"), requires_grad=False)
    pooler.attach(0, sd.PoolerLayer(w, nw, 1e-5, 1.0, gs, "nvfp4"))
    pooler.warm_up()
    x = randn(g, 4, H)
    before = [t.clone() for t in pooler.forward(0, x)]
    w.data, nw.data, gs.data = randn(g, P, H, scale=0.02), randn(g, P, scale=0.1), torch.tensor([300.0], device="cuda")
    junk = churn_memory()
    assert same_bits(pooler.forward(0, x), before)
    del junk
    pooler.attach(0, sd.PoolerLayer(w, nw, 1e-5, 1.0, gs, "nvfp4"))  # attached again: the new weights
    fresh = sd.Pooler(None, tp=1, rank=0, device=0, layers=[sd.PoolerLayer(w, nw, 1e-5, 1.0, gs, "nvfp4")],
                      batches=(4,))
    fresh.warm_up()
    assert same_bits(pooler.forward(0, x), fresh.forward(0, x))
    pooler.barrier()
    fresh.barrier()


# ---- the zero-copy pair ------------------------------------------------------------------------


def test_zero_copy_unpool_then_gather(env):
    g = env.gen
    mb = sd.LamportMailbox(None, tp=1, rank=0, capacity=16, width=N, device=0)
    u = sd.Unpooler(env.unpooler_weight, mb)
    mb.warm_up()
    for b in (1, 9, 16, 17, 33):
        m = randn(g, b, P)
        y = ops.unpool(m, u.handle, N)
        full = ops.gather(y, mb.handle, 1)
        torch.cuda.current_stream().synchronize()
        assert same_bits(y, env.unpooler.forward(m))  # the same GEMM bits with or without the publish
        assert same_bits(full, canonical_zero(y) if b <= 16 else y)
    assert sd.path_counts(u.handle) == {"fast": 3, "stock": 2}
    assert sd.path_counts(mb.handle) == {"fast": 3, "stock": 2}
    # Misuse is refused before anything runs, and leaves the protocol intact.
    m = randn(g, 4, P)
    y = ops.unpool(m, u.handle, N)
    with pytest.raises(ValueError, match="has not been gathered"):
        ops.unpool(m, u.handle, N)
    with pytest.raises(ValueError, match="holds a published block of 4 rows that is not this shard"):
        ops.gather(randn(g, 4, N), mb.handle, 1)
    full = ops.gather(y, mb.handle, 1)
    with pytest.raises(ValueError, match="nothing was published into this mailbox"):
        mb.gather(poisoned(4, N))
    torch.cuda.current_stream().synchronize()
    assert same_bits(full, canonical_zero(y))
    # Compiled and captured: the pair replays.
    step = torch.compile(lambda m: ops.gather(ops.unpool(m, u.handle, N), mb.handle, 1), fullgraph=True)
    m_static = randn(g, 4, P)
    step(m_static)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_static = step(m_static)
    for _ in range(10):
        m_static.copy_(randn(g, 4, P))
        graph.replay()
        want = canonical_zero(env.unpooler.forward(m_static))
        torch.cuda.current_stream().synchronize()
        assert same_bits(out_static, want)
    mb.barrier()


# ---- bad input ------------------------------------------------------------------------------


def bad_calls(env):
    """(op, tensors, arguments, reason): op(*tensors, *arguments) raises
    InvalidArgument (a ValueError) with the reason."""
    g, p, u, mb = env.gen, env.pooler, env.unpooler, env.mailbox
    return [
        (ops.pool_nvfp4, [randn(g, 4, 4096)], (p.handle, 1, P, False), r"x \[4, 4096\].* BF16 \[b, 8192\]"),
        (ops.pool_nvfp4, [randn(g, 20, 4096)], (p.handle, 1, P, False), r"x \[20, 4096\].* BF16 \[b, 8192\]"),
        (ops.pool_bf16, [randn(g, 4, H)], (p.handle, 1, P), "has format nvfp4, not bf16"),
        (ops.pool_nvfp4, [randn(g, 4, H)], (p.handle, 1, P, True), "has format nvfp4, not nvfp4_swizzled"),
        (ops.pool_bf16, [randn(g, 4, H)], (p.handle, 0, 2048), "pooled = 2048, but the pooler"),
        (ops.pool_bf16, [randn(g, 4, H)], (p.handle, 7, P), "layer 7 is not attached"),
        (ops.unpool, [randn(g, 4, P).float()], (u.handle, N), "contiguous 16-byte aligned BF16"),
        (ops.unpool, [randn(g, 4, P)], (u.handle, 512), "n = 512, but the unpooler"),
        (ops.unpool, [randn(g, 4, P).cpu()], (u.handle, N), "must be on cuda:0"),
        (ops.unpool, [randn(g, 20, P).cpu()], (u.handle, N), r"x \[20, 4096\].* on cuda:0"),
        (ops.gather, [randn(g, 4, N)], (mb.handle, 2), "tp = 2, but the mailbox"),
        (ops.gather, [randn(g, 4, 512)], (mb.handle, 1), r"\[4, 512\].* BF16 \[b, 1024\]"),
        (ops.unpool, [randn(g, 4, P)], ("spark_decode.nothing.0", N), "no spark_decode object is registered"),
    ]


def test_bad_input_raises_the_reason_eagerly(env):
    for op, tensors, arguments, reason in bad_calls(env):
        with pytest.raises(ValueError, match=reason):
            op(*tensors, *arguments)
    torch.cuda.current_stream().synchronize()


def test_bad_input_raises_the_reason_under_compile(env):
    """The fake implementations check nothing, so tracing succeeds and the
    real call raises the library's reason from the compiled code."""
    for op, tensors, arguments, reason in bad_calls(env):
        torch._dynamo.reset()

        def call(*t, op=op, arguments=arguments):
            return op(*t, *arguments)

        compiled = torch.compile(call, fullgraph=True)
        with pytest.raises(ValueError, match=reason):
            compiled(*tensors)
    torch.cuda.current_stream().synchronize()
