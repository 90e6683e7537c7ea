"""The pooler (docs/design.md, "The Pooler", spark_decode/pooler.h): the boundary before the routed
experts. Per MoE layer and rank: project (the pooler GEMM), publish, and
gather into the layer's output format: NVFP4 (linear or swizzled scales) or
the normed BF16 rows; ``forward``, the boundary step a model calls (any b:
the stock path outside the fast path's batches); and ExpertNorm and the
NVFP4 quantizer on their own (the stock path's pieces)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from . import _C, _registry
from ._tensors import Views, current_stream, describe, device_index, int32, keep, optional
from .group import collective
from .mailbox import LamportMailbox, _check_block, check_path

MAX_BATCH = _C.MAX_BATCH
FORMATS = ("bf16", "nvfp4", "nvfp4_swizzled")
# The most rows one stock quantize launch takes: the kernel's grid y is at
# most 65535 (spark_decode/nvfp4.h), rounded down to whole 128-row tiles.
_QUANTIZE_ROWS = 65535 // 128 * 128


class PoolerLayer(NamedTuple):
    """What the pooler reads from one stock MoE layer (views, no copies)."""

    weight: torch.Tensor  # [P / tp, H] BF16: this rank's rows of pooler.weight
    norm_weight: torch.Tensor  # [P] BF16 pre_expert_norm weight
    eps: float
    gain_center: float
    global_scale: torch.Tensor | None  # [1] FP32, or None for a BF16 edge layer
    # "bf16", "nvfp4" or "nvfp4_swizzled"; None: nvfp4 with a global scale,
    # bf16 without.
    format: str | None = None


def format_of(layer: PoolerLayer) -> str:
    if layer.format is not None:
        return layer.format
    return "bf16" if layer.global_scale is None else "nvfp4"


def output_shapes(format: str, b, pooled: int) -> dict:
    """The shapes and dtypes of a consumer's outputs at (format, b, P), as
    pooler_output_spec (spark_decode/pooler.h) gives them: bf16 normed
    BF16 [b, P]; NVFP4 a uint8 [b, P/2] and a_sf float8_e4m3fn [b, P/16]
    (linear) or [round_up(b, 128), round_up(P/16, 4)] (swizzled). Plain
    arithmetic, so that ``b`` may be a symbolic size (the ops' fake
    implementations call it under torch.compile)."""
    if format == "bf16":
        return {"normed": (torch.bfloat16, (b, pooled))}
    if format == "nvfp4":
        return {"a": (torch.uint8, (b, pooled // 2)), "a_sf": (torch.float8_e4m3fn, (b, pooled // 16))}
    if format == "nvfp4_swizzled":
        rows = (b + 127) // 128 * 128
        cols = (pooled // 16 + 3) // 4 * 4
        return {"a": (torch.uint8, (b, pooled // 2)), "a_sf": (torch.float8_e4m3fn, (rows, cols))}
    raise _C.InvalidArgument(f"output format {format!r} is not one of {', '.join(FORMATS)}")


def empty_outputs(format: str, b: int, pooled: int, device) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """New (uninitialised) outputs of (format, b, P) on ``device``: the normed
    tensor for bf16, (a, a_sf) for the NVFP4 formats."""
    made = [torch.empty(shape, dtype=dtype, device=device) for dtype, shape in output_shapes(format, b, pooled).values()]
    return made[0] if format == "bf16" else (made[0], made[1])


def _out_description(format: str, out) -> tuple:
    """The caller's outputs as the module takes them: (format, a, a_sf, normed)."""
    if format == "bf16":
        if not isinstance(out, torch.Tensor):
            raise _C.InvalidArgument("the outputs of a bf16 layer are one tensor, normed [b, P]")
        return (format, None, None, describe(out, "normed"))
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise _C.InvalidArgument(f"the outputs of an {format} layer are a pair (a, a_sf)")
    return (format, describe(out[0], "a"), describe(out[1], "a_sf"), None)


def pooler_layer(moe, tp: int, rank: int) -> PoolerLayer:
    """The pooler of one stock MuseSpark1xMoE (``moe.pooler.weight``,
    ``moe.pre_expert_norm``, ``moe.experts.nvfp4_input_global_scale``),
    checked against what the fused path assumes; InvalidArgument (a
    ValueError) with the stock model's reasons otherwise."""
    weight = moe.pooler.weight
    norm = moe.pre_expert_norm
    scale = moe.experts.nvfp4_input_global_scale
    norm_weight = None if norm is None else getattr(norm, "weight", None)
    _C.pooler_layer(
        describe(weight, "pooler weight"),
        norm is not None,
        bool(getattr(norm, "has_weight", False)),
        getattr(norm, "variance_size_override", None),
        bool(getattr(norm, "applies_weight_before_norm", False)),
        optional(norm_weight, "pre_expert_norm weight"),
        float(getattr(norm, "variance_epsilon", 0.0)),
        float(getattr(norm, "fused_gain_center", 0.0)),
        optional(scale, "nvfp4_input_global_scale"),
        tp,
        rank,
    )
    shard = weight.shape[0] // tp
    return PoolerLayer(
        weight=weight.narrow(0, rank * shard, shard),
        norm_weight=norm_weight,
        eps=float(norm.variance_epsilon),
        gain_center=float(norm.fused_gain_center),
        global_scale=None if scale is None else scale.reshape(1),
    )


class ExpertNorm:
    """pre_expert_norm as one kernel: y[rows, P] = x / rms(x) * (weight +
    gain_center), BF16 in and out, FP32 inside (spark_decode/expert_norm.h).
    The weight's storage is kept alive here (see Unpooler)."""

    def __init__(
        self, weight: torch.Tensor, eps: float, gain_center: float = 1.0, *, enable_pdl: bool = True
    ) -> None:
        self.weight = keep(weight)
        self._impl = _C.ExpertNorm(describe(weight, "norm weight"), eps, gain_center, enable_pdl)
        self.device = weight.device.index

    def run(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self._impl.run(describe(x, "x"), describe(y, "y"), current_stream(self.device))
        return y

    __call__ = run


def nvfp4_quantize(
    y: torch.Tensor,
    global_scale: torch.Tensor,
    a: torch.Tensor,
    a_sf: torch.Tensor,
    *,
    swizzled: bool = False,
    enable_pdl: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The stock NVFP4 quantize kernel (spark_decode/nvfp4.h): y BF16
    [rows, cols] -> a uint8 [rows, cols/2] and a_sf float8_e4m3fn (linear
    [rows, cols/16], or swizzled [round_up(rows, 128), round_up(cols/16, 4)]
    with zero padding), with the FP32 [1] global scale; on the current
    device and stream."""
    device = y.device.index if y.is_cuda else torch.cuda.current_device()
    _C.nvfp4_quantize(
        describe(y, "y"),
        describe(global_scale, "global_scale"),
        describe(a, "a"),
        describe(a_sf, "a_sf"),
        current_stream(device),
        enable_pdl,
        swizzled,
    )
    return a, a_sf


class _Attached:
    """One layer as this rank holds it: its views (kept alive), its format,
    and the stock path's own pieces (the pooler GEMM alone, prepared for
    every b up to 16, and the standalone norm)."""

    def __init__(self, layer: PoolerLayer, tp: int, enable_pdl: bool) -> None:
        self.layer = layer
        self.format = format_of(layer)
        self.gemm = _C.PoolerGemm(describe(layer.weight, "layer weight"), tp, list(range(1, MAX_BATCH + 1)), enable_pdl)
        self.norm = _C.ExpertNorm(describe(layer.norm_weight, "layer norm_weight"), layer.eps, layer.gain_center, enable_pdl)


class Pooler:
    """The pooler of the MoE layers for one rank.

    Workspace first, layers later: ``Pooler(group, tp=, rank=, device=,
    hidden=, pooled=, batches=, capacity=)`` builds the mailbox and scratch
    (collective over ``group``, see spark_decode.group), and ``attach(index,
    layer)`` adds one layer's weights on this rank alone (no collective
    step), once they are loaded and processed. ``layers=[...]`` does both
    at construction, H and P taken from the layers. ``warm_up`` runs each
    form once and must run on every rank alike, after every layer is
    attached and before capture.

    The layers' tensors are views, never copied; their storage is kept
    alive here, so a later ``param.data = ...`` (vLLM's
    process_weights_after_loading) frees nothing the library reads, which
    then still reads the old values: attach after processing, and again if
    a weight is replaced.

    Calls enqueue on torch's current stream, allocate nothing (but
    ``forward`` and the ``out=None`` forms of the stock path, which allocate
    their outputs through torch) and are graph-capturable; every rank calls
    them in the same order with the same b. ``run`` / ``gather`` write into
    the caller's ``out`` (the normed tensor for a bf16 layer, (a, a_sf) for
    an NVFP4 one; ``output_shapes``), or, without one, into scratch views
    that the next call overwrites. ``forward`` is the boundary step a model
    calls: the fast path (``run``) for b in ``batches`` (default 1..capacity),
    the stock path (``run_stock``) for any other b or with path="stock".
    Before a Pooler is dropped, call ``barrier()`` on every rank.

    ``handle`` names it to ``torch.ops.spark_decode.pool_*``.
    """

    def __init__(
        self,
        group=None,
        *,
        tp: int,
        rank: int,
        device: torch.device | int | str,
        layers: Sequence[PoolerLayer] | None = None,
        hidden: int | None = None,
        pooled: int | None = None,
        batches: Sequence[int] | None = None,
        capacity: int = MAX_BATCH,
        enable_pdl: bool = True,
        spin_timeout_s: float = 5.0,
        path: str = "fast",
        on_failure: str = "poison",
    ) -> None:
        index = device_index(device)
        tp, rank, capacity = int32(tp, "pooler tp"), int32(rank, "pooler rank"), int32(capacity, "pooler capacity")
        if batches is None:
            batches = (8,) if layers is not None else range(1, min(capacity, MAX_BATCH) + 1)
        batches = [int32(b, "batches entry") for b in batches]
        self.path = check_path(path)
        self.collective = collective(group, index)
        self.group = self.collective.group
        if layers is not None:
            layers = [PoolerLayer(*layer) for layer in layers]
            self._impl = _C.Pooler(
                self.group,
                tp,
                rank,
                index,
                [self._description(i, layer) for i, layer in enumerate(layers)],
                batches,
                capacity,
                enable_pdl,
                spin_timeout_s,
                on_failure,
            )
        else:
            self._impl = _C.Pooler.workspace(
                self.group,
                tp,
                rank,
                index,
                int32(_C.HIDDEN if hidden is None else hidden, "hidden"),
                int32(_C.POOLED if pooled is None else pooled, "pooled"),
                batches,
                capacity,
                enable_pdl,
                spin_timeout_s,
                on_failure,
            )
        self.tp, self.rank, self.capacity = tp, rank, capacity
        self.device = self._impl.device
        self.hidden, self.pooled = self._impl.hidden, self._impl.pooled
        self.batches = tuple(self._impl.batches)
        self._views = Views(self._impl)
        # The mailbox every layer shares (the library's; alive with the Pooler).
        self.mailbox = LamportMailbox._wrap(self._impl.mailbox, self.collective)
        # The stock path's kernels without programmatic dependent launch
        # where ranks share this GPU, as the library's own (see
        # LamportMailbox.shares_device).
        self._stock_pdl = enable_pdl and not self.mailbox.shares_device
        self._attached: dict[int, _Attached] = {}
        self._retired: list[_Attached] = []
        if layers is not None:
            for i, layer in enumerate(layers):
                self._attached[i] = _Attached(self._kept(layer), tp, self._stock_pdl)
        self.path_counts = _registry.new_counts()
        self.handle = _registry.register(self, "pooler")

    @staticmethod
    def _kept(layer: PoolerLayer) -> PoolerLayer:
        return PoolerLayer(
            keep(layer.weight), keep(layer.norm_weight), float(layer.eps), float(layer.gain_center),
            keep(layer.global_scale), layer.format,
        )

    @staticmethod
    def _description(index: int, layer: PoolerLayer) -> tuple:
        return (
            describe(layer.weight, f"layer {index} weight"),
            describe(layer.norm_weight, f"layer {index} norm_weight"),
            float(layer.eps),
            float(layer.gain_center),
            optional(layer.global_scale, f"layer {index} global_scale"),
            layer.format,
        )

    # ---- layers ----

    def attach(self, index: int, layer: PoolerLayer) -> None:
        """Attach (or replace) layer ``index`` on this rank: validated, its
        kernels prepared; not collective, not under capture. Every rank must
        attach the same layers (indices and formats) before their calls."""
        index = int32(index, "layer index")
        layer = self._kept(PoolerLayer(*layer))
        self._impl.attach(index, self._description(index, layer))  # the Pooler's reasons first
        replaced = self._attached.get(index)
        self._attached[index] = _Attached(layer, self.tp, self._stock_pdl)
        if replaced is not None:
            # A CUDA graph captured before still holds the replaced views'
            # addresses: keep their storage until release_retired().
            self._retired.append(replaced)

    def release_retired(self) -> None:
        """Let go of the layers replaced by attach() (after every CUDA graph
        captured before the replacement is gone)."""
        self._retired.clear()

    def attached(self, index: int) -> bool:
        return index in self._attached

    @property
    def layers(self) -> tuple[PoolerLayer | None, ...]:
        """Every layer slot up to the highest attached index (None: not attached)."""
        top = max(self._attached, default=-1)
        return tuple(self._attached[i].layer if i in self._attached else None for i in range(top + 1))

    def format(self, layer: int) -> str:
        return self._layer(layer, "format").format

    def _layer(self, layer: int, what: str) -> _Attached:
        attached = self._attached.get(layer) if isinstance(layer, int) else None
        if attached is None:
            raise _C.InvalidArgument(f"pooler {what}: layer {layer!r} is not attached")
        return attached

    def output_shapes(self, layer: int, b: int) -> dict:
        """{name: (dtype, shape)} of layer ``layer``'s outputs at b."""
        return output_shapes(self.format(layer), b, self.pooled)

    def empty_outputs(self, layer: int, b: int):
        """New outputs for layer ``layer`` at b: normed, or (a, a_sf)."""
        return empty_outputs(self.format(layer), b, self.pooled, torch.device("cuda", self.device))

    def path_of(self, b: int) -> str:
        """The path ``forward`` takes for a batch of b rows."""
        return "fast" if self.path == "fast" and (b in self.batches or b < 1) else "stock"

    # ---- the library's calls ----

    def _output(self, o: dict):
        if o["nvfp4"]:
            return self._views(o["a"]), self._views(o["a_sf"])
        return self._views(o["normed"])

    def project(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """The pooler GEMM: this rank's [b, P / tp] columns into scratch."""
        return self._views(self._impl.project(layer, describe(x, "x"), current_stream(self.device)))

    def publish(self, b: int) -> None:
        """Publish the first b rows of the projected block."""
        self._impl.publish(b, current_stream(self.device))

    def gather(self, layer: int, b: int, out=None):
        """Consume the published blocks into the layer's format: ``(a, a_sf)``
        (uint8 [b, P/2], float8_e4m3fn [b, P/16] or swizzled) for an NVFP4
        layer, the normed BF16 [b, P] rows for a bf16 one; into ``out`` when
        given (returned), else into scratch views."""
        stream = current_stream(self.device)
        if out is None:
            return self._output(self._impl.gather(layer, b, stream))
        self._impl.gather_into(layer, b, _out_description(self.format(layer), out), stream)
        return out

    def run(self, layer: int, x: torch.Tensor, out=None):
        """x BF16 [b, H] (the pre_ffn_norm output) -> the expert input, as
        gather (into ``out`` when given); b one of ``batches``."""
        stream = current_stream(self.device)
        if out is None:
            return self._output(self._impl.run(layer, describe(x, "x"), stream))
        self._impl.run_into(layer, describe(x, "x"), _out_description(self.format(layer), out), stream)
        return out

    # ---- the boundary step ----

    def forward(self, layer: int, x: torch.Tensor, out=None):
        """The boundary step as a model calls it, for any b: the expert input
        of layer ``layer`` into ``out`` (new tensors unless given, never
        scratch). The fast path (``run``) for b in ``batches``; otherwise the
        stock path (``run_stock``). Counted in ``path_counts``."""
        b = x.shape[0] if isinstance(x, torch.Tensor) and x.dim() >= 1 else 0
        attached = self._layer(layer, "forward")
        if out is None:
            out = empty_outputs(attached.format, b, self.pooled, torch.device("cuda", self.device))
        path = self.path_of(b)
        if path == "fast":
            self.run(layer, x, out)
        else:
            self.run_stock(layer, x, out)
        self.path_counts[path] += 1
        return out

    def run_stock(self, layer: int, x: torch.Tensor, out=None):
        """The same function through the stock path, for any b: the pooler
        GEMM of this rank's rows (this library's engine, the fast path's
        bits, for b <= 16; torch.matmul, cuBLAS's bits, above), the stock
        all-gather (spark_decode.group), ExpertNorm, and for NVFP4 layers the
        stock quantize kernel. Into ``out`` (new tensors unless given).
        Collective like a fast call (the all-gather): every rank alike."""
        attached = self._layer(layer, "run_stock")
        b = x.shape[0] if isinstance(x, torch.Tensor) and x.dim() >= 1 else 0
        device = torch.device("cuda", self.device)
        if out is None:
            out = empty_outputs(attached.format, b, self.pooled, device)
        # Everything checked before the first launch (and before the
        # collective all-gather), as the fast path's run() does.
        _check_block(x, self.hidden, self.device, "pooler: x")
        self._check_outputs(attached.format, out, b)
        stream = current_stream(self.device)
        shard_width = self.pooled // self.tp
        shard = torch.empty((b, shard_width), dtype=torch.bfloat16, device=device)
        if b <= MAX_BATCH:
            attached.gemm.run(describe(x, "x"), describe(shard, "shard"), stream)
        else:
            torch.matmul(x, attached.layer.weight.t(), out=shard)
        full = self.collective.all_gather_rows(shard)
        if attached.format == "bf16":
            attached.norm.run(describe(full, "rows"), describe(out, "normed"), stream)
            return out
        normed = torch.empty((b, self.pooled), dtype=torch.bfloat16, device=device)
        attached.norm.run(describe(full, "rows"), describe(normed, "normed"), stream)
        a, a_sf = out
        swizzled = attached.format == "nvfp4_swizzled"
        scale = describe(attached.layer.global_scale, "global_scale")
        # The quantize kernel's grid takes at most 65535 rows: larger batches
        # (a prefill) in pieces of whole 128-row scale tiles, each piece's
        # scales a contiguous run of the swizzled layout's tiles.
        flat_sf = a_sf.view(-1)
        sf_cols = a_sf.shape[1]
        for r0 in range(0, b, _QUANTIZE_ROWS):
            rows = min(_QUANTIZE_ROWS, b - r0)
            sf_rows = (rows + 127) // 128 * 128 if swizzled else rows
            _C.nvfp4_quantize(
                describe(normed[r0 : r0 + rows], "normed"),
                scale,
                describe(a[r0 : r0 + rows], "a"),
                describe(flat_sf[r0 * sf_cols : (r0 + sf_rows) * sf_cols].view(sf_rows, sf_cols), "a_sf"),
                stream,
                self._stock_pdl,
                swizzled,
            )
        return out

    def _check_outputs(self, format: str, out, b: int) -> None:
        """The caller's outputs of the stock path: the layer's format at b
        (output_shapes), contiguous, aligned, on this device."""
        want = output_shapes(format, b, self.pooled)
        got = {"normed": out} if format == "bf16" else dict(zip(("a", "a_sf"), out)) if (
            isinstance(out, (tuple, list)) and len(out) == 2) else None
        if got is None:
            raise _C.InvalidArgument(f"the outputs of an {format} layer are a pair (a, a_sf)")
        for name, (dtype, shape) in want.items():
            t = got[name]
            align = 4 if name == "a_sf" and format == "nvfp4" else 16  # as the fast path's check
            dtype_ok = isinstance(t, torch.Tensor) and (
                t.dtype == dtype or (dtype == torch.float8_e4m3fn and t.dtype == torch.uint8))
            if not (dtype_ok and tuple(t.shape) == tuple(shape) and t.is_contiguous() and t.is_cuda
                    and t.device.index == self.device and t.data_ptr() % align == 0):
                what = f"{list(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise _C.InvalidArgument(
                    f"pooler: output {name} {what} must be contiguous {align}-byte aligned {dtype} {list(shape)} on "
                    f"cuda:{self.device} (format {format}, b = {b})"
                )

    # ---- host calls ----

    def warm_up(self) -> None:
        """Collective, before capture: one call of each form per batch on
        zeros (the library's warm_up), then one project + publish + gather
        per batch and form through this class, so that every output view
        exists before capture and calls under it make none (scratch is
        shared by the layers of one form)."""
        with torch.cuda.device(self.device):
            self._warm_up()

    def _warm_up(self) -> None:
        stream = current_stream(self.device)
        self._impl.warm_up(stream)
        forms = {}
        for index, attached in sorted(self._attached.items()):
            forms.setdefault(attached.format, index)
        for b in self.batches:
            x = torch.zeros(b, self.hidden, dtype=torch.bfloat16, device=torch.device("cuda", self.device))
            for index in forms.values():
                self.project(index, x)
                self.publish(b)
                self.gather(index, b)
        # This rank's stream, not the device: a peer sharing the GPU may be
        # waiting on a publish of this rank (LamportMailbox.shares_device).
        torch.cuda.current_stream(self.device).synchronize()
        self.barrier()

    def synchronize(self) -> None:
        """Synchronise torch's current stream; a consumer's spin timeout
        raises SparkRuntimeError naming rank, stage, source and row."""
        self._impl.synchronize(current_stream(self.device))

    def timeout_report(self) -> str | None:
        return self._impl.timeout_report()

    def check(self) -> None:
        """SparkRuntimeError naming the failure if a consumer of the mailbox
        gave up (see LamportMailbox); the Pooler is then to be rebuilt."""
        self.mailbox.check()

    def gemm_choice(self, layer: int, b: int) -> str:
        return self._impl.gemm_choice(layer, b)

    def barrier(self) -> None:
        """Collective: this device synchronised, then the group."""
        self._impl.barrier()
