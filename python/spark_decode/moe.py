"""A drop-in module for one Muse Spark MoE layer's two boundaries, as a vLLM
model file uses it (docs/python.md; python/examples/muse_spark.py):

    ws = Workspace.get(tp_group, hidden=H, pooled=P)      # once per TP group (collective)
    boundaries = MoeBoundaries(ws, layer_index, format="nvfp4")
    ...                                                    # weights loaded through weight_loader
    boundaries.process_weights_after_loading()             # attach (after processing)
    ws.warm_up()                                           # collective, after every layer, before capture
    expert_input = boundaries.pre_experts(x)               # [b, H] -> (a, a_sf) or normed [b, P]
    y = boundaries.post_experts(m)                         # [b, P] -> [b, H]

forward code calls only torch.ops.spark_decode.* with handles and ints held
as plain attributes, so torch.compile(fullgraph=True) traces it and CUDA
graphs capture it.
"""

from __future__ import annotations

import torch

from . import _C
from ._tensors import device_index
from .group import collective
from .mailbox import LamportMailbox, check_path
from .pooler import FORMATS, Pooler, PoolerLayer
from .unpooler import Unpooler

MAX_BATCH = _C.MAX_BATCH


class Workspace:
    """What every MoE layer of one rank shares, built once per TP group,
    model shape and capacity (collective over the group): the Pooler's
    workspace (its mailbox of width P / tp and its scratch; layers attach
    later) and, at tp > 1, the mailbox of width H / tp into which every
    layer's unpooler publishes its output (zero-copy) and from which the
    layer gathers the full hidden rows. The fast path serves b <=
    ``capacity`` (at most 16); larger b take the stock path.

    ``group``: None (tp 1), a torch ProcessGroup, or anything shaped like
    vLLM's GroupCoordinator (spark_decode.group). ``path="stock"`` builds
    the same model on the stock path (for comparisons and benchmarks).

    ``spin_timeout_s`` (the mailboxes' spin timeout) defaults to minutes,
    not the library's seconds: at a model's startup every rank compiles
    and captures, and the first rank done waits in its first consumer for
    the peers still compiling, which the library's default would end in a
    trap. A peer that never comes still ends in the named timeout.
    """

    _shared: dict = {}

    def __init__(
        self,
        group=None,
        *,
        hidden: int = _C.HIDDEN,
        pooled: int = _C.POOLED,
        capacity: int = MAX_BATCH,
        device: torch.device | int | str | None = None,
        path: str = "fast",
        spin_timeout_s: float = 600.0,
        enable_pdl: bool = True,
    ) -> None:
        self.device = device_index(device if device is not None else torch.cuda.current_device())
        self.path = check_path(path)
        self.collective = collective(group, self.device)
        self.tp, self.rank = self.collective.tp, self.collective.rank
        self.hidden, self.pooled, self.capacity = hidden, pooled, capacity
        self.pooler = Pooler(
            self.collective,
            tp=self.tp,
            rank=self.rank,
            device=self.device,
            hidden=hidden,
            pooled=pooled,
            capacity=capacity,
            enable_pdl=enable_pdl,
            spin_timeout_s=spin_timeout_s,
            path=path,
        )
        self.mailbox: LamportMailbox | None = None
        if self.tp > 1:
            if hidden % self.tp:
                raise _C.InvalidArgument(f"workspace: H = {hidden} does not split into tp = {self.tp} blocks")
            self.mailbox = LamportMailbox(
                self.collective,
                tp=self.tp,
                rank=self.rank,
                capacity=min(capacity, MAX_BATCH),
                width=hidden // self.tp,
                device=self.device,
                spin_timeout_s=spin_timeout_s,
                path=path,
            )
        self.enable_pdl = enable_pdl

    @classmethod
    def get(cls, group=None, **kwargs) -> "Workspace":
        """The workspace of (group, shape, capacity, device, path), built at
        the first call and shared by every later one (as a model's layers
        share it). Collective at the first call: every rank calls get in the
        same order."""
        key = (group, tuple(sorted((k, str(v)) for k, v in kwargs.items())))
        ws = cls._shared.get(key)
        if ws is None:
            ws = cls._shared[key] = cls(group, **kwargs)
        return ws

    def warm_up(self) -> None:
        """Collective, after every layer is attached and before capture: the
        Pooler's and the mailbox's first launches, on zeros."""
        with torch.cuda.device(self.device):
            self.pooler.warm_up()
            if self.mailbox is not None:
                self.mailbox.warm_up()
            torch.cuda.current_stream(self.device).synchronize()

    def barrier(self) -> None:
        """Collective: before the workspace is dropped, on every rank."""
        self.pooler.barrier()
        if self.mailbox is not None:
            self.mailbox.barrier()


def _shard_rows(full: torch.Tensor, tp: int, rank: int, what: str) -> torch.Tensor:
    rows = full.shape[0]
    if rows % tp:
        raise _C.InvalidArgument(f"{what} {list(full.shape)}: {rows} rows do not split into tp = {tp} blocks")
    return full.narrow(0, rank * (rows // tp), rows // tp)


class MoeBoundaries(torch.nn.Module):
    """One Muse Spark MoE layer's two boundaries on this rank of ``workspace``:

    - ``pre_experts(x)``: x BF16 [b, H] (the pre_ffn_norm output) -> the
      routed experts' input in the layer's format: (a uint8 [b, P/2], a_sf
      float8_e4m3fn) for "nvfp4" / "nvfp4_swizzled", normed BF16 [b, P] for
      "bf16" (the edge layers, and Hopper's weight-only NVFP4 experts);
      (pooler GEMM of this rank's rows + mailbox all-gather + pre_expert_norm
      + NVFP4, spark_decode/pooler.h).
    - ``post_experts(m)``: m BF16 [b, P] (the experts' output) -> y BF16 [b,
      H]: the unpooler GEMM of this rank's H / tp rows, published from its
      epilogue into the workspace's mailbox and gathered into full rows
      (tp > 1; at tp 1 the GEMM alone).

    Parameters (vLLM style, each with a ``weight_loader`` attribute that takes
    the full checkpoint tensor and keeps this rank's part):
    ``pooler.weight`` [P / tp, H] (rows of [P, H]), ``pre_expert_norm.weight``
    [P], ``unpooler.weight`` [H / tp, P] (rows of [H, P]) and, for NVFP4
    layers, ``input_global_scale`` [1] FP32 (the experts' NVFP4 input global
    scale, unless process_weights_after_loading is given the experts' own).

    ``process_weights_after_loading()`` attaches the loaded weights to the
    library; call it after every processing step that may replace a
    parameter's ``.data`` (and again if one is replaced later: the library
    keeps reading the storage it was given, kept alive, until then), before
    torch.compile and capture.
    """

    def __init__(
        self,
        workspace: Workspace,
        layer_index: int,
        *,
        format: str = "nvfp4",
        eps: float = 1e-5,
        gain_center: float = 1.0,
    ) -> None:
        super().__init__()
        if format not in FORMATS:
            raise _C.InvalidArgument(f"output format {format!r} is not one of {', '.join(FORMATS)}")
        ws = workspace
        self.workspace = ws
        self.layer_index = int(layer_index)
        self.format = format
        self.swizzled = format == "nvfp4_swizzled"
        self.eps, self.gain_center = float(eps), float(gain_center)
        self.tp, self.rank = ws.tp, ws.rank
        self.hidden, self.pooled = ws.hidden, ws.pooled
        device = torch.device("cuda", ws.device)
        bf16 = dict(dtype=torch.bfloat16, device=device)
        self.pooler = _WeightHolder(torch.empty(ws.pooled // ws.tp, ws.hidden, **bf16), self._load_rows)
        self.pre_expert_norm = _WeightHolder(torch.empty(ws.pooled, **bf16), self._load_whole)
        self.unpooler = _WeightHolder(torch.empty(ws.hidden // ws.tp, ws.pooled, **bf16), self._load_rows)
        if format != "bf16":
            self.input_global_scale = torch.nn.Parameter(
                torch.ones(1, dtype=torch.float32, device=device), requires_grad=False
            )
            self.input_global_scale.weight_loader = self._load_whole
        else:
            self.register_parameter("input_global_scale", None)
        # What forward reads: plain strings and ints, constants to torch.compile.
        self.pooler_handle: str = ws.pooler.handle
        self.mailbox_handle: str | None = None if ws.mailbox is None else ws.mailbox.handle
        self.unpooler_handle: str | None = None
        self._unpooler: Unpooler | None = None
        self._retired: list[Unpooler] = []

    # ---- weights ----

    def _load_rows(self, param: torch.nn.Parameter, loaded: torch.Tensor) -> None:
        """vLLM's weight_loader(param, loaded_weight) for a row-sharded
        weight: this rank's rows of the full tensor, copied into param."""
        shard = _shard_rows(loaded, self.tp, self.rank, "weight")
        if tuple(shard.shape) != tuple(param.shape):
            raise _C.InvalidArgument(
                f"weight {list(loaded.shape)}: this rank's rows {list(shard.shape)} do not fit the parameter "
                f"{list(param.shape)}"
            )
        param.data.copy_(shard)

    def _load_whole(self, param: torch.nn.Parameter, loaded: torch.Tensor) -> None:
        """vLLM's weight_loader for a replicated tensor."""
        if loaded.numel() != param.numel():
            raise _C.InvalidArgument(f"weight {list(loaded.shape)} does not fit the parameter {list(param.shape)}")
        param.data.copy_(loaded.reshape(param.shape))

    def weight_loader(self, param: torch.nn.Parameter, loaded: torch.Tensor) -> None:
        """Load the full checkpoint tensor of ``param`` (one of this module's)."""
        param.weight_loader(param, loaded)

    def process_weights_after_loading(self, global_scale: torch.Tensor | None = None) -> None:
        """Attach this layer's weights as they are now (this rank alone, no
        collective step): the pooler layer into the workspace's Pooler, a
        new Unpooler over the unpooler rows (publishing into the workspace's
        mailbox at tp > 1). ``global_scale``: the FP32 [1] NVFP4 input global
        scale the experts quantize with, when they own it (default: this
        module's ``input_global_scale``). Not under capture; a graph
        captured before must be captured again."""
        scale = None
        if self.format != "bf16":
            scale = self.input_global_scale if global_scale is None else global_scale
        layer = PoolerLayer(
            self.pooler.weight, self.pre_expert_norm.weight, self.eps, self.gain_center,
            None if scale is None else scale.reshape(1), self.format,
        )
        self.workspace.pooler.attach(self.layer_index, layer)
        unpooler = Unpooler(self.unpooler.weight, self.workspace.mailbox, enable_pdl=self.workspace.enable_pdl)
        if self._unpooler is not None:
            self._retired.append(self._unpooler)  # see Pooler.release_retired
        self._unpooler = unpooler
        self.unpooler_handle = unpooler.handle

    # ---- the boundaries ----

    def pre_experts(self, x: torch.Tensor):
        """x BF16 [b, H] -> the experts' input (see the class doc)."""
        if self.format == "bf16":
            return torch.ops.spark_decode.pool_bf16(x, self.pooler_handle, self.layer_index, self.pooled)
        return torch.ops.spark_decode.pool_nvfp4(x, self.pooler_handle, self.layer_index, self.pooled, self.swizzled)

    def post_experts(self, m: torch.Tensor) -> torch.Tensor:
        """m BF16 [b, P] -> y BF16 [b, H] (see the class doc)."""
        if self.unpooler_handle is None:
            raise _C.InvalidArgument(
                f"MoE layer {self.layer_index}: weights not attached (call process_weights_after_loading)"
            )
        y = torch.ops.spark_decode.unpool(m, self.unpooler_handle, self.hidden // self.tp)
        if self.mailbox_handle is None:
            return y
        return torch.ops.spark_decode.gather(y, self.mailbox_handle, self.tp)

    def path_counts(self) -> dict[str, dict[str, int]]:
        """Which path served this layer's calls so far: the Pooler's (every
        layer's together), this layer's unpooler's and the mailbox's."""
        counts = {"pooler": dict(self.workspace.pooler.path_counts)}
        if self._unpooler is not None:
            counts["unpooler"] = dict(self._unpooler.path_counts)
        if self.workspace.mailbox is not None:
            counts["mailbox"] = dict(self.workspace.mailbox.path_counts)
        return counts


class _WeightHolder(torch.nn.Module):
    """A submodule holding one ``weight`` parameter, so that the parameter
    names match the stock module's (``pooler.weight``, ...)."""

    def __init__(self, data: torch.Tensor, loader) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(data, requires_grad=False)
        self.weight.weight_loader = loader
