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


# torch's current stream as a raw cudaStream_t, without making a Stream
# object per call (the ops' eager cost); the public call where torch lacks it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream(device: int) -> int:
    """torch's current stream on ``device`` (the capture stream under CUDA
    graph capture), as the integer the module takes."""
    if _raw_stream is not None:
        return _raw_stream(device)
    return torch.cuda.current_stream(device).cuda_stream


def int32(value, what: str) -> int:
    """``value`` as a Python int that fits 32 bits, or InvalidArgument (not
    pybind11's TypeError or cast error) naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            import operator

            value = operator.index(value)
        except TypeError:
            raise _C.InvalidArgument(f"{what} = {value!r} is not an integer") from None
    if not -(2**31) <= value < 2**31:
        raise _C.InvalidArgument(f"{what} = {value} is not a 32-bit integer")
    return int(value)


def device_index(device: torch.device | int | str) -> int:
    """A CUDA device ordinal from an int, a torch.device or a string;
    InvalidArgument (not torch's RuntimeError) for anything that names no
    CUDA device."""
    if isinstance(device, torch.device):
        d = device
    elif isinstance(device, str):
        try:
            d = torch.device(device)
        except (RuntimeError, ValueError) as e:
            raise _C.InvalidArgument(f"device {device!r} is not a CUDA device ({e})") from None
    else:
        index = int32(device, "device")
        if index < 0:
            raise _C.InvalidArgument(f"device {index} is not a CUDA device ordinal (>= 0)")
        return index
    if d.type != "cuda":
        raise _C.InvalidArgument(f"device {d} is not a CUDA device")
    return d.index if d.index is not None else torch.cuda.current_device()


def keep(t: torch.Tensor | None) -> torch.Tensor | None:
    """A new tensor over ``t``'s storage (``t.detach()``), to hold where the
    library keeps a view of ``t``: reassigning ``param.data`` later (as
    vLLM's process_weights_after_loading does) swaps the storage of
    ``param`` only, and this alias keeps the old storage alive, so the
    library never reads freed memory (it reads the old values until the
    layer is attached again)."""
    return None if t is None else t.detach()


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
