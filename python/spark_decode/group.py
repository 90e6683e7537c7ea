"""The rendezvous a LamportMailbox or Pooler is built over (spark_decode/group.h),
and the stock path's all-gather of device tensors.

A group is used at construction, warm_up and barrier(), and by the stock
path (above a mailbox's capacity, or where a model asks for the stock path),
never by the fast path. Accepted everywhere a ``group`` is taken:
  - None: one process, one rank (tp 1);
  - a torch.distributed ProcessGroup (any backend; its all_gather_object and
    barrier are used, run with this rank's device current, which NCCL needs);
  - anything shaped like vLLM's GroupCoordinator, found by its attributes
    (``world_size``, ``rank_in_group`` and ``cpu_group`` and/or
    ``device_group``; vLLM itself is never imported): the rendezvous runs
    over ``cpu_group`` (else ``device_group``), the stock all-gather over
    ``device_group``;
  - a spark_decode.Group (for example CallbackGroup over your own transport).

The stock all-gather is torch.distributed.all_gather_into_tensor over a
group whose backend moves device tensors (NCCL: a ProcessGroup of backend
nccl, a coordinator's device_group), which CUDA graphs can capture. Over any
other group it stages through host memory and the rendezvous (each rank's
bytes), which synchronises this rank's current stream (never the device) and
so cannot run under CUDA graph capture: ranks sharing one GPU have no NCCL
(it refuses two ranks on one device) and take this route.
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
    nccl = _moves_device_tensors(pg)

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


def is_coordinator(group) -> bool:
    """Whether ``group`` is shaped like vLLM's GroupCoordinator."""
    return (
        hasattr(group, "world_size")
        and hasattr(group, "rank_in_group")
        and (getattr(group, "cpu_group", None) is not None or getattr(group, "device_group", None) is not None)
    )


def _moves_device_tensors(pg) -> bool:
    """Whether collectives over ProcessGroup ``pg`` take CUDA tensors on
    the device (NCCL), rather than through host memory."""
    import torch.distributed as dist

    try:
        backend = str(dist.get_backend(pg)).lower()
    except (RuntimeError, ValueError):
        return False
    return "nccl" in backend


class Collective:
    """One rank's view of its group: ``group`` (the spark_decode Group that
    collective constructors take), ``tp`` and ``rank``, and the stock path's
    ``all_gather_rows``. Built by :func:`collective` from any accepted group."""

    def __init__(self, group: _C.Group, device_group=None, device: int | None = None) -> None:
        self.group = group
        self.tp, self.rank = group.size, group.rank
        # A ProcessGroup whose collectives take device tensors (NCCL), or None.
        self.device_group = device_group
        self.device = device

    def all_gather_rows(self, shard, out=None):
        """Every rank's ``shard`` [b, w] side by side: ``out`` [b, tp * w],
        rank q's columns at [q w, (q + 1) w) (what a mailbox gather gives).
        A new tensor unless ``out`` is given. Collective: every rank calls it
        with the same b."""
        import torch

        b, w = shard.shape
        if out is None:
            out = torch.empty((b, self.tp * w), dtype=shard.dtype, device=shard.device)
        if self.tp == 1:
            out.copy_(shard)
            return out
        flat = torch.empty((self.tp * b, w), dtype=shard.dtype, device=shard.device)
        if self.device_group is not None:
            import torch.distributed as dist

            dist.all_gather_into_tensor(flat, shard.contiguous(), group=self.device_group)
        else:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise _C.InvalidArgument(
                    "the stock all-gather over a group without NCCL stages through host memory and cannot be "
                    "captured into a CUDA graph: give a group whose device_group (or backend) is NCCL, or keep "
                    "captured batches within the mailbox's capacity"
                )
            # Host staging: copy (synchronising this stream only), exchange
            # through the rendezvous, copy back.
            import ctypes

            host = shard.contiguous().cpu().view(torch.uint8).reshape(-1)
            gathered = self.group.all_gather(ctypes.string_at(host.data_ptr(), host.numel()))
            staged = torch.frombuffer(bytearray(gathered), dtype=torch.uint8).view(shard.dtype)
            flat.copy_(staged.view(self.tp * b, w))
        out.view(b, self.tp, w).copy_(flat.view(self.tp, b, w).transpose(0, 1))
        return out


def collective(group, device: int | None = None) -> Collective:
    """``group`` (any accepted form, see the module doc) as a Collective;
    a ProcessGroup's rendezvous runs with ``device`` current."""
    if isinstance(group, Collective):
        return group
    if group is None:
        return Collective(single_rank(), None, device)
    if isinstance(group, _C.Group):
        return Collective(group, None, device)
    if is_coordinator(group):
        return _from_coordinator(group, device)
    return Collective(from_process_group(group, device), group if _moves_device_tensors(group) else None, device)


def _from_coordinator(coordinator, device: int | None) -> Collective:
    """A Collective over a GroupCoordinator-shaped object: the rendezvous
    over cpu_group (else device_group), the stock all-gather over
    device_group where it moves device tensors; its world_size and
    rank_in_group checked against the rendezvous group's."""
    size, rank = coordinator.world_size, coordinator.rank_in_group
    if not isinstance(size, int) or not isinstance(rank, int) or size < 1 or not 0 <= rank < size:
        raise _C.InvalidArgument(
            f"group coordinator: rank_in_group {rank!r} of world_size {size!r} is not a rank of a group"
        )
    cpu_group = getattr(coordinator, "cpu_group", None)
    device_group = getattr(coordinator, "device_group", None)
    if size == 1:
        return Collective(single_rank(), None, device)
    rendezvous_pg = cpu_group if cpu_group is not None else device_group
    if isinstance(rendezvous_pg, _C.Group):
        rendezvous = rendezvous_pg
    else:
        rendezvous = from_process_group(rendezvous_pg, device)
    if (rendezvous.size, rendezvous.rank) != (size, rank):
        raise _C.InvalidArgument(
            f"group coordinator: world_size {size}, rank_in_group {rank}, but its "
            f"{'cpu_group' if cpu_group is not None else 'device_group'} has size {rendezvous.size}, "
            f"rank {rendezvous.rank}"
        )
    stock = None
    if device_group is not None and not isinstance(device_group, _C.Group) and _moves_device_tensors(device_group):
        stock = device_group
    return Collective(rendezvous, stock, device)


def as_group(group, device: int | None = None) -> _C.Group:
    """``group`` as a spark_decode Group; a ProcessGroup's collectives run
    on ``device`` (see from_process_group)."""
    return collective(group, device).group
