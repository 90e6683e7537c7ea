"""The rendezvous a LamportMailbox or Pooler is built over (spark_decode/group.h).

A group is used only at construction, warm_up and barrier(), never on the
decode path. Accepted everywhere a ``group`` is taken:
  - a torch.distributed ProcessGroup (any backend; its all_gather_object and
    barrier are used, so with NCCL the current device must be this rank's);
  - None: one process, one rank (tp 1);
  - a spark_decode.Group (for example CallbackGroup over your own transport).
"""

from __future__ import annotations

from . import _C

Group = _C.Group
CallbackGroup = _C.CallbackGroup


def single_rank() -> _C.Group:
    """The group of one rank (tp 1, no other process)."""
    return CallbackGroup(0, 1, lambda data: data, lambda: None)


def from_process_group(pg=None) -> _C.Group:
    """A Group over a torch.distributed ProcessGroup (default: the world)."""
    import torch.distributed as dist

    rank, size = dist.get_rank(pg), dist.get_world_size(pg)

    def all_gather(data: bytes) -> bytes:
        gathered: list = [None] * size
        dist.all_gather_object(gathered, data, group=pg)
        return b"".join(gathered)

    def barrier() -> None:
        dist.barrier(group=pg)

    return CallbackGroup(rank, size, all_gather, barrier)


def as_group(group) -> _C.Group:
    if group is None:
        return single_rank()
    if isinstance(group, _C.Group):
        return group
    return from_process_group(group)
