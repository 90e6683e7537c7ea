"""The pooler (docs/design.md, "The Pooler", spark_decode/pooler.h): the boundary before the routed
experts. Per MoE layer and rank: project (the pooler GEMM), publish, and
gather into the NVFP4 expert input (NVFP4 layers) or the normed BF16 rows
(BF16 edge layers); and ExpertNorm on its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from . import _C
from ._tensors import Views, current_stream, describe, device_index, optional
from .group import as_group
from .mailbox import LamportMailbox

MAX_BATCH = _C.MAX_BATCH


class PoolerLayer(NamedTuple):
    """What the pooler reads from one stock MoE layer (views, no copies)."""

    weight: torch.Tensor  # [P / tp, H] BF16: this rank's rows of pooler.weight
    norm_weight: torch.Tensor  # [P] BF16 pre_expert_norm weight
    eps: float
    gain_center: float
    global_scale: torch.Tensor | None  # [1] FP32, or None for a BF16 edge layer


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
    gain_center), BF16 in and out, FP32 inside (spark_decode/expert_norm.h)."""

    def __init__(
        self, weight: torch.Tensor, eps: float, gain_center: float = 1.0, *, enable_pdl: bool = True
    ) -> None:
        self.weight = weight
        self._impl = _C.ExpertNorm(describe(weight, "norm weight"), eps, gain_center, enable_pdl)
        self.device = weight.device.index

    def run(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self._impl.run(describe(x, "x"), describe(y, "y"), current_stream(self.device))
        return y

    __call__ = run


class Pooler:
    """The pooler of every MoE layer for one rank. Construction is collective
    over ``group`` (see spark_decode.group) and prepares every kernel;
    ``warm_up`` runs each form once and must run on every rank alike, before
    capture. ``project`` / ``publish`` / ``gather`` / ``run`` enqueue on
    torch's current stream, allocate nothing and are graph-capturable; every
    rank calls them in the same order with the same b. Outputs are views of
    scratch that the next call overwrites (clone what you keep). The layers'
    tensors are views kept referenced here, never copied. Before a Pooler is
    dropped, call ``barrier()`` on every rank."""

    def __init__(
        self,
        group=None,
        *,
        tp: int,
        rank: int,
        device: torch.device | int | str,
        layers: Sequence[PoolerLayer],
        batches: Sequence[int] = (8,),
        capacity: int = MAX_BATCH,
        enable_pdl: bool = True,
        spin_timeout_s: float = 5.0,
    ) -> None:
        index = device_index(device)
        self.group = as_group(group, index)
        self.layers = tuple(layers)
        self._impl = _C.Pooler(
            self.group,
            tp,
            rank,
            index,
            [
                (
                    describe(layer.weight, f"layer {i} weight"),
                    describe(layer.norm_weight, f"layer {i} norm_weight"),
                    float(layer.eps),
                    float(layer.gain_center),
                    optional(layer.global_scale, f"layer {i} global_scale"),
                )
                for i, layer in enumerate(self.layers)
            ],
            list(batches),
            capacity,
            enable_pdl,
            spin_timeout_s,
        )
        self.tp, self.rank, self.capacity = tp, rank, capacity
        self.device = self._impl.device
        self.batches = tuple(self._impl.batches)
        self._views = Views(self._impl)
        # The mailbox every layer shares (the library's; alive with the Pooler).
        self.mailbox = LamportMailbox._wrap(self._impl.mailbox, self.group)

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

    def gather(self, layer: int, b: int):
        """Consume the published blocks: ``(a, a_sf)`` (uint8 [b, P/2],
        float8_e4m3fn [b, P/16]) for an NVFP4 layer, the normed BF16 [b, P]
        rows for an edge layer."""
        return self._output(self._impl.gather(layer, b, current_stream(self.device)))

    def run(self, layer: int, x: torch.Tensor):
        """x BF16 [b, H] (the pre_ffn_norm output) -> the expert input, as gather."""
        return self._output(self._impl.run(layer, describe(x, "x"), current_stream(self.device)))

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
        for index, layer in enumerate(self.layers):
            forms.setdefault(layer.global_scale is None, index)
        hidden = self._impl.hidden
        for b in self.batches:
            x = torch.zeros(b, hidden, dtype=torch.bfloat16, device=torch.device("cuda", self.device))
            for index in forms.values():
                self.project(index, x)
                self.publish(b)
                self.gather(index, b)
        torch.cuda.synchronize(self.device)
        self.barrier()

    def synchronize(self) -> None:
        """Synchronise torch's current stream; a consumer's spin timeout
        raises SparkRuntimeError naming rank, stage, source and row."""
        self._impl.synchronize(current_stream(self.device))

    def timeout_report(self) -> str | None:
        return self._impl.timeout_report()

    def gemm_choice(self, layer: int, b: int) -> str:
        return self._impl.gemm_choice(layer, b)

    def barrier(self) -> None:
        """Collective: this device synchronised, then the group."""
        self._impl.barrier()
