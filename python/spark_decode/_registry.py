"""Handles of stateful objects (mailboxes, poolers, unpoolers) for the torch
operators (spark_decode/ops.py).

An operator cannot take a Python object, and torch.compile bakes its
arguments into the graph, so the ops take a handle, a string, as vLLM's ops
take ``group_name``: every spark_decode object that an op can name registers
itself here when built and keeps its handle in ``.handle``. The registry
holds weak references: it never keeps an object alive, and an op naming a
released object raises InvalidArgument.

Which path served each call is counted per object (``path_counts``):
``fast`` (the library's fused kernels and the mailbox) or ``stock`` (the
stock path: above the capacity, or an object built with path="stock"). The
counters count op and method calls as they run in Python: eager calls and
CUDA graph captures, not graph replays (a replay runs no Python).
"""

from __future__ import annotations

import itertools
import weakref

from . import _C

_objects: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()
_serial = itertools.count()
PATHS = ("fast", "stock")


def register(obj: object, kind: str) -> str:
    """A new handle for ``obj``: ``spark_decode.<kind>.<n>``, n counting the
    objects this process registered (so ranks that build their objects in
    the same order get the same handles)."""
    handle = f"spark_decode.{kind}.{next(_serial)}"
    _objects[handle] = obj
    return handle


def lookup(handle: str, cls: type | tuple[type, ...], what: str) -> object:
    """The live object registered under ``handle``, which must be a ``cls``;
    InvalidArgument otherwise."""
    obj = _objects.get(handle) if isinstance(handle, str) else None
    if obj is None:
        raise _C.InvalidArgument(
            f"{what}: no spark_decode object is registered under handle {handle!r} "
            "(never built in this process, or released)"
        )
    if not isinstance(obj, cls):
        names = cls.__name__ if isinstance(cls, type) else " or ".join(c.__name__ for c in cls)
        raise _C.InvalidArgument(f"{what}: handle {handle!r} names a {type(obj).__name__}, not a {names}")
    return obj


def new_counts() -> dict[str, int]:
    return dict.fromkeys(PATHS, 0)


def path_counts(handle: str) -> dict[str, int]:
    """How many calls of the object under ``handle`` took each path."""
    obj = _objects.get(handle)
    if obj is None:
        raise _C.InvalidArgument(f"no spark_decode object is registered under handle {handle!r}")
    return dict(obj.path_counts)


def reset_path_counts(handle: str | None = None) -> None:
    """Zero the counters of one object, or of every registered one."""
    if handle is not None and handle not in _objects:
        raise _C.InvalidArgument(f"no spark_decode object is registered under handle {handle!r}")
    targets = [_objects[handle]] if handle is not None else list(_objects.values())
    for obj in targets:
        for key in obj.path_counts:
            obj.path_counts[key] = 0
