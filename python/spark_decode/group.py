"""The rendezvous a LamportMailbox or Pooler is built over (spark_decode/group.h).

A group is used only at construction, warm_up and barrier(), never on the
decode path. Accepted everywhere a ``group`` is taken:
  - a torch.distributed ProcessGroup (any backend; its all_gather_object and
    barrier are used, run with this rank's device current, which NCCL needs);
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


def from_process_group(pg=None, device: int | None = None) -> _C.Group:
    """A Group over a torch.distributed ProcessGroup (default: the world).

    With ``device`` (this rank's CUDA device index) every collective runs
    with that device current in torch, whatever the calling thread's current
    device is: NCCL stages all_gather_object's tensors on torch's current
    device, and ranks staging on one GPU would collide or hang.
    """
    import contextlib

    import torch
    import torch.distributed as dist

    rank, size = dist.get_rank(pg), dist.get_world_size(pg)
    nccl = dist.get_backend(pg) == "nccl"

    def on_device():
        return torch.cuda.device(device) if device is not None else contextlib.nullcontext()

    def all_gather(data: bytes) -> bytes:
        gathered: list = [None] * size
        with on_device():
            dist.all_gather_object(gathered, data, group=pg)
        return b"".join(gathered)

    def barrier() -> None:
        with on_device():
            if nccl and device is not None:
                dist.barrier(group=pg, device_ids=[device])
            else:
                dist.barrier(group=pg)

    return CallbackGroup(rank, size, all_gather, barrier)


def as_group(group, device: int | None = None) -> _C.Group:
    """``group`` as a spark_decode Group; a ProcessGroup's collectives run
    on ``device`` (see from_process_group)."""
    if group is None:
        return single_rank()
    if isinstance(group, _C.Group):
        return group
    return from_process_group(group, device)
