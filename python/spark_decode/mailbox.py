"""The Lamport mailbox (docs/design.md, "The Lamport mailbox protocol", spark_decode/mailbox.h): symmetric per-rank
buffers [3 stages][tp][capacity][width] BF16 over peer-mapped memory, a
publish kernel and the plain gather consumer."""

from __future__ import annotations

import torch

from . import _C
from ._tensors import Views, current_stream, describe, device_index
from .group import as_group


class LamportMailbox:
    """Collective construction over ``group`` (see spark_decode.group): every
    rank builds its mailbox with the same tp, capacity and width; it
    allocates peer-mapped memory and synchronises (not under capture).
    ``publish`` / ``gather`` enqueue one kernel each on torch's current
    stream, allocate nothing and are graph-capturable; every rank makes the
    same calls in the same order with the same row count. A consumer that
    waits longer than ``spin_timeout_s`` for a slot traps (the CUDA context
    is then lost) and ``synchronize`` raises naming rank, stage and row.
    Before a mailbox is dropped, call ``barrier()`` on every rank."""

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
    ) -> None:
        index = device_index(device)
        self.group = as_group(group, index)
        self._init(_C.LamportMailbox(self.group, tp, rank, capacity, width, index, spin_timeout_s))

    def _init(self, impl: _C.LamportMailbox) -> None:
        self._impl = impl
        self.tp, self.rank = impl.tp, impl.rank
        self.capacity, self.width, self.device = impl.capacity, impl.width, impl.device
        self._views = Views(impl)

    @classmethod
    def _wrap(cls, impl: _C.LamportMailbox, group) -> "LamportMailbox":
        """A view of a mailbox the library owns (the Pooler's)."""
        mailbox = cls.__new__(cls)
        mailbox.group = group
        mailbox._init(impl)
        return mailbox

    @property
    def stage_state(self) -> torch.Tensor:
        """This rank's int32 [2] stage state (NEXT, ACTIVE), a device view."""
        return self._views(self._impl.stage_state)

    def publish(self, src: torch.Tensor, *, enable_pdl: bool = True) -> None:
        """Rows of src [b, width] BF16 into this rank's slot of every copy."""
        self._impl.publish(describe(src, "src"), current_stream(self.device), enable_pdl)

    def gather(self, out: torch.Tensor, *, enable_pdl: bool = True) -> torch.Tensor:
        """out [b, tp * width] BF16: every rank's published rows."""
        self._impl.gather(describe(out, "out"), current_stream(self.device), enable_pdl)
        return out

    def synchronize(self) -> None:
        """Synchronise torch's current stream; a spin timeout raises."""
        self._impl.synchronize(current_stream(self.device))

    def timeout_report(self) -> str | None:
        return self._impl.timeout_report()

    def warm_up(self) -> None:
        """Collective: one publish + gather of zeros, before capture."""
        self._impl.warm_up(current_stream(self.device))

    def barrier(self) -> None:
        """Collective: this device synchronised, then the group."""
        self._impl.barrier()
