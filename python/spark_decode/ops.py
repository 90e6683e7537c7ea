"""The boundary steps as torch operators, ``torch.ops.spark_decode.*``: what
a model compiled with torch.compile (full graph) and captured into CUDA
graphs calls (docs/python.md).

Schemas (registered with torch.library: a schema, one implementation for
CUDA and CPU tensors alike, and a fake implementation):

    unpool(Tensor x, str unpooler, int n) -> Tensor
    unpool_out(Tensor x, str unpooler, Tensor(a!) out) -> ()
    gather(Tensor shard, str mailbox, int tp) -> Tensor
    gather_out(Tensor shard, str mailbox, Tensor(a!) out) -> ()
    pool_bf16(Tensor x, str pooler, int layer, int pooled) -> Tensor
    pool_bf16_out(Tensor x, str pooler, int layer, Tensor(a!) normed) -> ()
    pool_nvfp4(Tensor x, str pooler, int layer, int pooled, bool swizzled) -> (Tensor, Tensor)
    pool_nvfp4_out(Tensor x, str pooler, int layer, Tensor(a!) a, Tensor(b!) a_sf) -> ()

``pool_nvfp4_out`` takes ``a_sf`` as float8_e4m3fn or as its bytes (uint8,
the same shape); pass uint8 where torch checks the op's mutations (opcheck,
schema_check_mode), whose comparison has no E4M3 kernel.

The ``str`` arguments are handles (``obj.handle``) of an Unpooler, a
LamportMailbox or a Pooler (spark_decode/_registry.py), as vLLM's ops take a
``group_name``. The ints that fix an output's shape (n, tp, pooled) and the
format (the op's name, ``swizzled``) are arguments, so that the fake
implementations need nothing but their arguments (and work on fake or meta
tensors with symbolic batch sizes); the real ones check them against the
object (InvalidArgument otherwise).

Each op runs the object's ``forward`` (``all_gather`` for the mailbox): the
fast path where the object serves b, the stock path elsewhere (above the
capacity, or an object built with path="stock"), counted per object in
``path_counts``. Outputs are new tensors from torch's allocator (the caching
allocator, or a CUDA graph's pool under capture) or the caller's ``out``
tensors; never library scratch. Bad input raises InvalidArgument (a
ValueError) with the library's reason, eagerly and from compiled code alike
(the fake implementations check nothing, so that tracing never fails on
what the real call explains).

Ordering: ``unpool`` with a zero-copy mailbox publishes as a side effect
that ``gather`` consumes; the gather takes the unpool's output as its
``shard``, which orders the two in any graph (as the data dependency of a
collective's output orders vLLM's ops). The mailbox checks, in Python as
the calls run (eagerly or under capture), that every publish is gathered
once, by the shard it published.
"""

from __future__ import annotations

import torch

from . import _C, _registry
from .mailbox import LamportMailbox
from .pooler import Pooler, output_shapes
from .unpooler import Unpooler

LIBRARY = "spark_decode"
SCHEMAS = {
    "unpool": "unpool(Tensor x, str unpooler, int n) -> Tensor",
    "unpool_out": "unpool_out(Tensor x, str unpooler, Tensor(a!) out) -> ()",
    "gather": "gather(Tensor shard, str mailbox, int tp) -> Tensor",
    "gather_out": "gather_out(Tensor shard, str mailbox, Tensor(a!) out) -> ()",
    "pool_bf16": "pool_bf16(Tensor x, str pooler, int layer, int pooled) -> Tensor",
    "pool_bf16_out": "pool_bf16_out(Tensor x, str pooler, int layer, Tensor(a!) normed) -> ()",
    "pool_nvfp4": "pool_nvfp4(Tensor x, str pooler, int layer, int pooled, bool swizzled) -> (Tensor, Tensor)",
    "pool_nvfp4_out": "pool_nvfp4_out(Tensor x, str pooler, int layer, Tensor(a!) a, Tensor(b!) a_sf) -> ()",
}

path_counts = _registry.path_counts
reset_path_counts = _registry.reset_path_counts


def _rows(t: torch.Tensor):
    return t.shape[0] if t.dim() >= 1 else 0


# ---- real implementations ----------------------------------------------------


def _unpooler(handle: str, what: str) -> Unpooler:
    return _registry.lookup(handle, Unpooler, what)


def _mailbox(handle: str, what: str) -> LamportMailbox:
    return _registry.lookup(handle, LamportMailbox, what)


def _pooler(handle: str, layer: int, format: str | None, what: str) -> Pooler:
    p = _registry.lookup(handle, Pooler, what)
    if format is not None:
        have = p.format(layer)
        if have != format:
            raise _C.InvalidArgument(f"{what}: layer {layer} of {handle} has format {have}, not {format}")
    return p


def _unpool(x: torch.Tensor, unpooler: str, n: int) -> torch.Tensor:
    u = _unpooler(unpooler, "spark_decode.unpool")
    if n != u.n:
        raise _C.InvalidArgument(f"spark_decode.unpool: n = {n}, but the unpooler {unpooler} has N = {u.n}")
    return u.forward(x)


def _unpool_out(x: torch.Tensor, unpooler: str, out: torch.Tensor) -> None:
    _unpooler(unpooler, "spark_decode.unpool_out").forward(x, out)


def _gather(shard: torch.Tensor, mailbox: str, tp: int) -> torch.Tensor:
    mb = _mailbox(mailbox, "spark_decode.gather")
    if tp != mb.tp:
        raise _C.InvalidArgument(f"spark_decode.gather: tp = {tp}, but the mailbox {mailbox} has tp = {mb.tp}")
    return mb.all_gather(shard)


def _gather_out(shard: torch.Tensor, mailbox: str, out: torch.Tensor) -> None:
    _mailbox(mailbox, "spark_decode.gather_out").all_gather(shard, out)


def _check_pooled(p: Pooler, pooled: int, what: str) -> None:
    if pooled != p.pooled:
        raise _C.InvalidArgument(f"{what}: pooled = {pooled}, but the pooler {p.handle} has P = {p.pooled}")


def _pool_bf16(x: torch.Tensor, pooler: str, layer: int, pooled: int) -> torch.Tensor:
    p = _pooler(pooler, layer, "bf16", "spark_decode.pool_bf16")
    _check_pooled(p, pooled, "spark_decode.pool_bf16")
    return p.forward(layer, x)


def _pool_bf16_out(x: torch.Tensor, pooler: str, layer: int, normed: torch.Tensor) -> None:
    _pooler(pooler, layer, "bf16", "spark_decode.pool_bf16_out").forward(layer, x, normed)


def _nvfp4_format(swizzled: bool) -> str:
    return "nvfp4_swizzled" if swizzled else "nvfp4"


def _pool_nvfp4(x: torch.Tensor, pooler: str, layer: int, pooled: int, swizzled: bool):
    p = _pooler(pooler, layer, _nvfp4_format(swizzled), "spark_decode.pool_nvfp4")
    _check_pooled(p, pooled, "spark_decode.pool_nvfp4")
    a, a_sf = p.forward(layer, x)
    return a, a_sf


def _pool_nvfp4_out(x: torch.Tensor, pooler: str, layer: int, a: torch.Tensor, a_sf: torch.Tensor) -> None:
    p = _registry.lookup(pooler, Pooler, "spark_decode.pool_nvfp4_out")
    if p.format(layer) == "bf16":
        raise _C.InvalidArgument(f"spark_decode.pool_nvfp4_out: layer {layer} of {pooler} has format bf16")
    p.forward(layer, x, (a, a_sf))


# ---- fake implementations: shapes and dtypes from the arguments alone ----------


def _unpool_fake(x, unpooler, n):
    return x.new_empty((_rows(x), n), dtype=torch.bfloat16)


def _gather_fake(shard, mailbox, tp):
    width = shard.shape[-1] if shard.dim() >= 1 else 0
    return shard.new_empty((_rows(shard), tp * width), dtype=torch.bfloat16)


def _pool_bf16_fake(x, pooler, layer, pooled):
    dtype, shape = output_shapes("bf16", _rows(x), pooled)["normed"]
    return x.new_empty(shape, dtype=dtype)


def _pool_nvfp4_fake(x, pooler, layer, pooled, swizzled):
    shapes = output_shapes(_nvfp4_format(swizzled), _rows(x), pooled)
    return tuple(x.new_empty(shape, dtype=dtype) for dtype, shape in shapes.values())


def _mutating_fake(*args):
    return None


_IMPLS = {
    "unpool": (_unpool, _unpool_fake),
    "unpool_out": (_unpool_out, _mutating_fake),
    "gather": (_gather, _gather_fake),
    "gather_out": (_gather_out, _mutating_fake),
    "pool_bf16": (_pool_bf16, _pool_bf16_fake),
    "pool_bf16_out": (_pool_bf16_out, _mutating_fake),
    "pool_nvfp4": (_pool_nvfp4, _pool_nvfp4_fake),
    "pool_nvfp4_out": (_pool_nvfp4_out, _mutating_fake),
}


def _register() -> torch.library.Library:
    lib = torch.library.Library(LIBRARY, "DEF")
    for name, schema in SCHEMAS.items():
        real, fake = _IMPLS[name]
        lib.define(schema)
        # One implementation for CUDA and CPU tensors: the library checks
        # the devices, so host memory gets its reason as InvalidArgument
        # rather than the dispatcher's NotImplementedError.
        lib.impl(name, real, "CUDA")
        lib.impl(name, real, "CPU")
        torch.library.register_fake(f"{LIBRARY}::{name}", fake, lib=lib)
    return lib


_LIB = _register()


# ---- Python spellings -------------------------------------------------------------


def unpool(x: torch.Tensor, unpooler: Unpooler, out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.ops.spark_decode.unpool`` (``unpool_out`` with ``out``)."""
    if out is None:
        return torch.ops.spark_decode.unpool(x, unpooler.handle, unpooler.n)
    torch.ops.spark_decode.unpool_out(x, unpooler.handle, out)
    return out


def gather(shard: torch.Tensor, mailbox: LamportMailbox, out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.ops.spark_decode.gather`` (``gather_out`` with ``out``)."""
    if out is None:
        return torch.ops.spark_decode.gather(shard, mailbox.handle, mailbox.tp)
    torch.ops.spark_decode.gather_out(shard, mailbox.handle, out)
    return out


def pool(x: torch.Tensor, pooler: Pooler, layer: int, out=None):
    """The pool op of layer ``layer``'s format: the normed tensor for a bf16
    layer, (a, a_sf) for an NVFP4 one (into ``out`` when given). The format
    is read from the Pooler here, outside any graph: under torch.compile,
    call the op of the layer's format directly (as spark_decode.moe does)."""
    format = pooler.format(layer)
    if format == "bf16":
        if out is None:
            return torch.ops.spark_decode.pool_bf16(x, pooler.handle, layer, pooler.pooled)
        torch.ops.spark_decode.pool_bf16_out(x, pooler.handle, layer, out)
        return out
    if out is None:
        return torch.ops.spark_decode.pool_nvfp4(x, pooler.handle, layer, pooler.pooled, format == "nvfp4_swizzled")
    # The scales as their bytes: the same memory, and a dtype torch's
    # mutation checks (opcheck, schema_check_mode) can compare.
    torch.ops.spark_decode.pool_nvfp4_out(x, pooler.handle, layer, out[0], out[1].view(torch.uint8))
    return out
