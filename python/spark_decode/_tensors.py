"""torch tensors and streams <-> the descriptions spark_decode._C takes.

The extension module is torch-free: a tensor crosses as (data pointer, dtype
name, shape, strides in elements, device ordinal or -1) and a stream as the
integer value of its cudaStream_t. Scratch the library owns (the Pooler's
outputs) comes back as such a description and is wrapped here, without a
copy, through the CUDA Array Interface.
"""

from __future__ import annotations

import torch

from . import _C

_NAMES = {
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.int32: "i32",
    torch.uint8: "u8",
    torch.float8_e4m3fn: "e4m3",
}
# The CUDA Array Interface has no BF16 or E4M3 type string: such views are
# made as int16 / uint8 and reinterpreted (same element size).
_IMPORT = {
    "bf16": ("<i2", torch.bfloat16),
    "f32": ("<f4", torch.float32),
    "i32": ("<i4", torch.int32),
    "u8": ("|u1", torch.uint8),
    "e4m3": ("|u1", torch.float8_e4m3fn),
}
_SIZES = {"bf16": 2, "f32": 4, "i32": 4, "u8": 1, "e4m3": 1}


def describe(t: torch.Tensor, what: str) -> tuple:
    """The description of ``t`` (a view, nothing is copied); ValueError for a
    dtype the library has no name for."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    name = _NAMES.get(t.dtype)
    if name is None:
        raise _C.InvalidArgument(
            f"{what}: dtype {t.dtype} is not one the library takes "
            "(bfloat16, float32, int32, uint8, float8_e4m3fn)"
        )
    device = t.device.index if t.is_cuda else -1
    return (t.data_ptr(), name, tuple(t.shape), tuple(t.stride()), device)


def optional(t: torch.Tensor | None, what: str) -> tuple | None:
    return None if t is None else describe(t, what)


def current_stream(device: int) -> int:
    """torch's current stream on ``device`` (the capture stream under CUDA
    graph capture), as the integer the module takes."""
    return torch.cuda.current_stream(device).cuda_stream


def device_index(device: torch.device | int | str) -> int:
    d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if d.type != "cuda":
        raise _C.InvalidArgument(f"device {d} is not a CUDA device")
    return d.index if d.index is not None else torch.cuda.current_device()


class _DeviceArray:
    """A borrowed device buffer for torch.as_tensor (no copy, no stream sync:
    the interface's stream is None, so torch orders nothing)."""

    def __init__(self, desc: tuple, owner: object) -> None:
        # torch keeps this object alive as long as the tensor, and this
        # object keeps the memory's owner (the C++ Pooler or mailbox) alive.
        self._owner = owner
        data, name, shape, strides, _device = desc
        size = _SIZES[name]
        self.__cuda_array_interface__ = {
            "data": (data, False),
            "typestr": _IMPORT[name][0],
            "shape": tuple(shape),
            "strides": tuple(s * size for s in strides),
            "version": 3,
            "stream": None,
        }


class Views:
    """Tensors over library-owned scratch, made once per (pointer, dtype,
    shape) and reused: the Pooler's outputs are the same few views call after
    call, so after warm_up a call (also under CUDA graph capture) makes no
    new tensor. Each view keeps ``owner`` (the C++ object whose scratch it
    shows) alive, as a torch slice keeps its storage."""

    def __init__(self, owner: object) -> None:
        self._owner = owner
        self._cache: dict[tuple, torch.Tensor] = {}

    def __call__(self, desc: tuple) -> torch.Tensor:
        key = desc  # (int, str, tuple, tuple, int): hashable as the module returns it
        view = self._cache.get(key)
        if view is None:
            raw = torch.as_tensor(_DeviceArray(desc, self._owner), device=torch.device("cuda", desc[4]))
            view = raw.view(_IMPORT[desc[1]][1])
            self._cache[key] = view
        return view
