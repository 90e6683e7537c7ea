"""The unpooler GEMM (docs/design.md, "Engines", spark_decode/unpooler.h): out[m, N] = x[m, K] @ W^T
for 1 <= m <= 16, optionally publishing y into the next boundary's mailbox;
and ``forward``, the boundary step a model calls (any m: the stock path
above the fast path's rows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from . import _C, _registry
from ._tensors import current_stream, describe, int32, keep, optional
from .mailbox import LamportMailbox, _check_block


class UnpoolerShape(NamedTuple):
    """A launch shape (tactic): K split over ``splits`` CTAs of a cluster,
    ``kw`` consecutive K per warp, ``accs`` accumulator sets; optionally the
    token tile (8 or 16) and row tiles (1 or 2) per m, as {m: value} or as a
    sequence of one value per m in 1..16 (what ``Unpooler.tactic`` gives).
    Whatever is left None (or an m a mapping leaves out) keeps the tactic
    table's choice for the weight's [N, K]; ``UNPOOLER`` is all table."""

    splits: int | None = None
    kw: int | None = None
    accs: int | None = None
    token_tile: Mapping[int, int] | Sequence[int] | None = None
    row_tiles: Mapping[int, int] | Sequence[int] | None = None
    cluster_balance: bool | None = None  # load-balanced cluster scheduling (same bits)
    # Row-swizzled weight loads (same bits); False (fragment order) compiles
    # for kw=256 accs=1 only. None: the table's where kw and accs are the
    # table's, else True.
    row_swizzle: bool | None = None

    def as_dict(self) -> dict:
        """The fields given, as the module takes them; InvalidArgument (a
        ValueError) for a field that is no 32-bit integer (or bool)."""
        d: dict = {}
        for key in ("splits", "kw", "accs"):
            if getattr(self, key) is not None:
                d[key] = int32(getattr(self, key), f"UnpoolerShape.{key}")
        for key in ("cluster_balance", "row_swizzle"):
            if getattr(self, key) is not None:
                d[key] = bool(getattr(self, key))
        for key in ("token_tile", "row_tiles"):
            per_m = getattr(self, key)
            what = f"UnpoolerShape.{key}"
            if isinstance(per_m, Mapping):
                d[key] = {int32(m, f"{what} key"): int32(v, f"{what}[{m}]") for m, v in per_m.items()}
            elif per_m is not None:
                try:
                    values = list(per_m)
                except TypeError:
                    raise _C.InvalidArgument(f"{what} = {per_m!r} is neither a mapping nor a sequence") from None
                d[key] = [int32(v, f"{what}[{i}]") for i, v in enumerate(values)]
        return d


MAX_M = _C.MAX_BATCH
UNPOOLER = UnpoolerShape()


def _tactic(shape: UnpoolerShape | None) -> dict | None:
    return None if shape is None else shape.as_dict()


def launch_unsupported(n: int, k: int, splits: int, kw: int, accs: int) -> str | None:
    """Why no kernel launches for an [n, k] weight at that launch shape, or None."""
    return _C.launch_unsupported(n, k, splits, kw, accs)


def tactic(n: int, k: int) -> dict:
    """The tactic table's launch shape for an [n, k] weight (a valid default
    for shapes the table does not list)."""
    return _C.unpooler_tactic(n, k)


class Unpooler:
    """One MoE layer's unpooler column block: this rank's [N, K] BF16 weight
    shard (a view, never copied), its kernels prepared at construction.
    With ``mailbox`` (the next boundary's LamportMailbox, width N) the
    epilogue also publishes y into it; with ``ticket`` (int32 [1] on the
    mailbox's device, stage << 16) the slot's stage is the ticket's.
    ``rows`` limits which token tiles are prepared now (default: every m;
    ``()``: none); a run with another m prepares its tile then, which is
    refused under CUDA graph capture. ``run`` allocates nothing, synchronises
    nothing and is graph-capturable; it enqueues on torch's current stream.
    Invalid input raises InvalidArgument (a ValueError) with the reason.

    The weight: the library reads the storage the weight had at
    construction, which this object keeps alive (an alias, ``keep``), so a
    later ``param.data = ...`` (vLLM's process_weights_after_loading) frees
    nothing it reads; it then still reads the old values. Build the
    Unpooler after the weights are loaded and processed, and again if
    they are replaced.

    ``handle`` names it to ``torch.ops.spark_decode.unpool``.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        mailbox: LamportMailbox | None = None,
        *,
        enable_pdl: bool = True,
        shape: UnpoolerShape | None = None,
        ticket: torch.Tensor | None = None,
        rows: Sequence[int] | None = None,
        _impl: _C.Unpooler | None = None,
    ) -> None:
        self.weight, self.mailbox, self.ticket = keep(weight), mailbox, keep(ticket)
        rows = None if rows is None else [int32(m, "rows entry") for m in rows]
        self._impl = _impl if _impl is not None else _C.Unpooler(
            describe(weight, "unpooler weight"),
            None if mailbox is None else mailbox._impl,
            enable_pdl,
            optional(ticket, "ticket"),
            rows,
            _tactic(shape),
        )
        self.n, self.k, self.max_m = self._impl.n, self._impl.k, self._impl.max_m
        self.device = self._impl.device
        # The same GEMM without the publish (the same tactic, so the same
        # bits), for rows the mailbox cannot take and for path="stock";
        # every tile prepared now, since forward() may run under capture.
        self._plain = None
        if mailbox is not None:
            self._plain = _C.Unpooler(
                describe(self.weight, "unpooler weight"),
                None,
                enable_pdl and not mailbox.shares_device,
                None,
                None,
                self._impl.tactic,
            )
        self.path_counts = _registry.new_counts()
        self.handle = _registry.register(self, "unpooler")

    @staticmethod
    def unsupported(weight: torch.Tensor, shape: UnpoolerShape | None = None) -> str | None:
        """Why the GEMM cannot take ``weight`` (an [N, K] shard) at ``shape``
        (default: the table's), or None: the constructor's checks. Never
        raises for a bad weight or shape: it says why."""
        try:
            weight_desc = describe(weight, "unpooler weight")
            tactic_dict = _tactic(shape)
        except (_C.InvalidArgument, TypeError) as e:
            return str(e)
        return _C.Unpooler.unsupported(weight_desc, tactic_dict)

    @classmethod
    def from_moe(
        cls,
        moe,
        tp: int,
        rank: int,
        mailbox: LamportMailbox | None = None,
        *,
        enable_pdl: bool = True,
        shape: UnpoolerShape | None = None,
        ticket: torch.Tensor | None = None,
        rows: Sequence[int] | None = None,
    ) -> "Unpooler":
        """The unpooler of a MuseSpark1xMoE (``moe.unpooler.weight``) or of a
        replicated [H, K] weight tensor: rows [rank N, (rank + 1) N),
        N = H / tp."""
        full = moe if isinstance(moe, torch.Tensor) else moe.unpooler.weight
        tp, rank = int32(tp, "tp"), int32(rank, "rank")
        impl = _C.Unpooler.from_moe(
            describe(full, "unpooler weight"),
            tp,
            rank,
            None if mailbox is None else mailbox._impl,
            enable_pdl,
            optional(ticket, "ticket"),
            None if rows is None else [int32(m, "rows entry") for m in rows],
            _tactic(shape),
        )
        n = full.shape[0] // tp
        return cls(keep(full).narrow(0, rank * n, n), mailbox, enable_pdl=enable_pdl, ticket=ticket, _impl=impl)

    @property
    def tactic(self) -> dict:
        return self._impl.tactic

    @property
    def enable_pdl(self) -> bool:
        return self._impl.enable_pdl

    def prepared(self, tile: int, row_tiles: int = 1) -> bool:
        """Whether the kernel of token tile ``tile`` (8, 16) and ``row_tiles``
        (1, 2) was prepared (at construction, or by a run)."""
        return self._impl.prepared(tile, row_tiles)

    def run(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out[m, N] = x[m, K] @ W^T (and its publish with a mailbox); x and
        out contiguous 16-byte aligned BF16 on this device, m <= max_m."""
        if self.mailbox is not None:
            self.mailbox._check_nothing_pending("zero-copy publish")
        self._impl.run(describe(x, "x"), describe(out, "out"), current_stream(self.device))
        if self.mailbox is not None:
            self.mailbox._published(out)
        return out

    __call__ = run

    def path_of(self, m: int) -> str:
        """The path ``forward`` takes for m rows: "fast" (the library's GEMM,
        publishing where there is a mailbox) or "stock"."""
        if self.mailbox is None:
            return "fast" if m <= MAX_M else "stock"
        return "fast" if self.mailbox.path == "fast" and m <= self.max_m else "stock"

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The boundary step as a model calls it, for any m: out[m, N] = x @
        W^T into ``out`` (a new tensor unless given). The fast path (run(),
        with its zero-copy publish) for m up to max_m; otherwise the stock
        path without a publish (the mailbox's all_gather then takes the stock
        all-gather too): this GEMM's engine for m <= 16 (the same bits),
        torch.matmul (cuBLAS's bits) above. Counted in ``path_counts``."""
        m = x.shape[0] if isinstance(x, torch.Tensor) and x.dim() >= 1 else 0
        if out is None:
            out = torch.empty((m, self.n), dtype=torch.bfloat16, device=torch.device("cuda", self.device))
        path = self.path_of(m)
        if path == "fast" and self.mailbox is not None:
            self.run(x, out)
        elif m <= MAX_M:
            engine = self._plain if self._plain is not None else self._impl
            engine.run(describe(x, "x"), describe(out, "out"), current_stream(self.device))
        else:
            _check_block(x, self.k, self.device, "unpooler: x")
            _check_block(out, self.n, self.device, "unpooler: out", rows=m)
            torch.matmul(x, self.weight.t(), out=out)
        self.path_counts[path] += 1
        return out
