"""The Lamport mailbox (docs/design.md, "The Lamport mailbox protocol", spark_decode/mailbox.h): symmetric per-rank
buffers [3 stages][tp][capacity][width] BF16 over peer-mapped memory, a
publish kernel and the plain gather consumer; and ``all_gather``, the
boundary step a model calls (the fast path within the capacity, the stock
all-gather above it)."""

from __future__ import annotations

import torch

from . import _C, _registry
from ._tensors import Views, current_stream, describe, device_index, int32
from .group import Collective, collective

PATHS = _registry.PATHS


def check_path(path: str) -> str:
    if path not in PATHS:
        raise _C.InvalidArgument(f"path {path!r} is not one of {', '.join(PATHS)}")
    return path


class LamportMailbox:
    """Collective construction over ``group`` (see spark_decode.group): every
    rank builds its mailbox with the same tp, capacity and width; it
    allocates peer-mapped memory and synchronises (not under capture).
    ``publish`` / ``gather`` enqueue one kernel each on torch's current
    stream, allocate nothing and are graph-capturable; every rank makes the
    same calls in the same order with the same row count. A consumer that
    waits longer than ``spin_timeout_s`` for a slot, or runs with no publish
    since the last gather, gives up. ``on_failure="poison"`` (the default):
    it stores NaN into what it could not read and returns, the CUDA context
    stays usable, and ``check()``, ``synchronize()`` or the next call raises
    SparkRuntimeError naming rank, stage, source and row (then drop this
    mailbox and build a new one). ``on_failure="trap"``: it traps, and the
    CUDA context of the device is lost for the process (docs/design.md,
    "Failures").
    Before a mailbox is dropped, call ``barrier()`` on every rank.

    ``path``: "fast" (the default: ``all_gather`` uses the mailbox for b up
    to the capacity) or "stock" (``all_gather`` always takes the stock
    all-gather, and a zero-copy Unpooler over this mailbox does not publish:
    the same model on the stock path, for comparisons). ``handle`` names the
    mailbox to the torch ops (``torch.ops.spark_decode.gather``).
    """

    def __init__(
        self,
        group=None,
        *,
        tp: int,
        rank: int,
        capacity: int,
        width: int,
        device: torch.device | int | str,
        spin_timeout_s: float = 5.0,
        path: str = "fast",
        on_failure: str = "poison",
    ) -> None:
        index = device_index(device)
        tp, rank = int32(tp, "mailbox tp"), int32(rank, "mailbox rank")
        capacity, width = int32(capacity, "mailbox capacity"), int32(width, "mailbox width")
        self.collective = collective(group, index)
        self.group = self.collective.group
        self._init(
            _C.LamportMailbox(self.group, tp, rank, capacity, width, index, spin_timeout_s, 0, on_failure),
            self.collective,
            check_path(path),
        )

    def _init(self, impl: _C.LamportMailbox, coll: Collective, path: str) -> None:
        self._impl = impl
        self.collective = coll
        self.tp, self.rank = impl.tp, impl.rank
        self.capacity, self.width, self.device = impl.capacity, impl.width, impl.device
        self.shares_device = impl.shares_device
        self.path = path
        self._views = Views(impl)
        # The block published into the current stage and not yet gathered:
        # (data pointer, rows) of its source, or None. Kept in Python as the
        # calls are made (eagerly or under capture), so that a zero-copy
        # publish is gathered exactly once and a gather has something to
        # consume; a graph replays the checked sequence.
        self._pending: tuple[int, int] | None = None
        self.path_counts = _registry.new_counts()
        self.handle = _registry.register(self, "mailbox")

    @classmethod
    def _wrap(cls, impl: _C.LamportMailbox, coll: Collective, path: str = "fast") -> "LamportMailbox":
        """A view of a mailbox the library owns (the Pooler's)."""
        mailbox = cls.__new__(cls)
        mailbox.group = coll.group
        mailbox._init(impl, coll, path)
        return mailbox

    @property
    def stage_state(self) -> torch.Tensor:
        """This rank's int32 [2] stage state (NEXT, ACTIVE), a device view."""
        return self._views(self._impl.stage_state)

    def path_of(self, b: int) -> str:
        """The path ``all_gather`` takes for b rows."""
        return "fast" if self.path == "fast" and b <= self.capacity else "stock"

    # ---- the library's calls ----

    def publish(self, src: torch.Tensor, *, enable_pdl: bool = True) -> None:
        """Rows of src [b, width] BF16 into this rank's slot of every copy."""
        self._check_nothing_pending("publish")
        self._impl.publish(describe(src, "src"), current_stream(self.device), enable_pdl)
        self._pending = (src.data_ptr(), src.shape[0])

    def gather(self, out: torch.Tensor, *, enable_pdl: bool = True) -> torch.Tensor:
        """out [b, tp * width] BF16: every rank's published rows."""
        if self._pending is None:
            raise _C.InvalidArgument(
                "mailbox gather: nothing was published into this mailbox since its last gather "
                "(a gather would wait for a block that never comes)"
            )
        self._impl.gather(describe(out, "out"), current_stream(self.device), enable_pdl)
        self._pending = None
        return out

    def _check_nothing_pending(self, what: str) -> None:
        if self._pending is not None:
            raise _C.InvalidArgument(
                f"mailbox {what}: the block published before ({self._pending[1]} rows) has not been "
                "gathered; every publish is followed by one gather on every rank"
            )

    def _published(self, src: torch.Tensor) -> None:
        """A zero-copy publisher (the Unpooler's epilogue) published ``src``."""
        self._pending = (src.data_ptr(), src.shape[0])

    # ---- the boundary step ----

    def all_gather(self, shard: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Every rank's ``shard`` [b, width] side by side, ``out`` [b, tp *
        width] BF16 (a new tensor unless given): the fast path (publish +
        gather; the publish skipped when a zero-copy Unpooler already
        published this very shard) for b up to the capacity, the stock
        all-gather above it or with path="stock". Collective: every rank
        calls it with the same b. Graph-capturable on the fast path, and on
        the stock path over an NCCL group."""
        b = shard.shape[0] if shard.dim() >= 1 else 0
        path = self.path_of(b)
        if out is None:
            out = torch.empty((b, self.tp * self.width), dtype=torch.bfloat16, device=torch.device("cuda", self.device))
        if self._pending is not None:
            ptr, rows = self._pending
            if path == "stock" or ptr != shard.data_ptr() or rows != b:
                raise _C.InvalidArgument(
                    f"mailbox all_gather: this mailbox holds a published block of {rows} rows that is not this "
                    f"shard ({list(shard.shape)}); gather the block a zero-copy Unpooler published before "
                    "publishing another"
                )
        # Both outputs and inputs checked before anything is launched: a
        # publish whose gather then refused would leave the mailbox's
        # protocol a call behind on this rank.
        _check_block(out, self.tp * self.width, self.device, "mailbox all_gather: out", rows=b)
        if path == "fast":
            stream = current_stream(self.device)
            if self._pending is None:
                self._impl.publish(describe(shard, "shard"), stream, True)
            self._impl.gather(describe(out, "out"), stream, True)
            self._pending = None
        else:
            _check_block(shard, self.width, self.device, "mailbox all_gather: shard")
            self.collective.all_gather_rows(shard, out)
        self.path_counts[path] += 1
        return out

    # ---- host calls ----

    def synchronize(self) -> None:
        """Synchronise torch's current stream; a spin timeout raises."""
        self._impl.synchronize(current_stream(self.device))

    def timeout_report(self) -> str | None:
        return self._impl.timeout_report()

    def check(self) -> None:
        """SparkRuntimeError naming the failure if a consumer gave up (no
        CUDA call)."""
        self._impl.check()

    def warm_up(self) -> None:
        """Collective: one publish + gather of zeros, before capture."""
        self._check_nothing_pending("warm_up")
        self._impl.warm_up(current_stream(self.device))

    def barrier(self) -> None:
        """Collective: this device synchronised, then the group."""
        self._impl.barrier()


def _check_block(t: torch.Tensor, cols: int, device: int, what: str, rows: int | None = None) -> None:
    """What the stock path needs of a BF16 block (the fast path's kernels
    check the same themselves): InvalidArgument with the reason."""
    ok = (
        isinstance(t, torch.Tensor)
        and t.dtype == torch.bfloat16
        and t.dim() == 2
        and t.shape[1] == cols
        and (rows is None or t.shape[0] == rows)
        and t.is_contiguous()
        and t.data_ptr() % 16 == 0
        and t.is_cuda
        and t.device.index == device
    )
    if not ok:
        shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        where = f"{t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else ""
        want_rows = "b" if rows is None else str(rows)
        raise _C.InvalidArgument(
            f"{what} {shape} {where} must be contiguous 16-byte aligned BF16 [{want_rows}, {cols}] on cuda:{device}"
        )
