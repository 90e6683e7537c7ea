"""Helpers of the binding's GPU tests (imported after their skip checks)."""

from __future__ import annotations

import os
import random

import torch

POISON = -1  # int16 bits 0xffff: a BF16 NaN no kernel writes


def seed(name: str) -> int:
    """A fresh seed per test, printed; SPARK_TEST_SEED replays one."""
    s = int(os.environ.get("SPARK_TEST_SEED", random.getrandbits(63)))
    print(f"[{name}] seed {s} (SPARK_TEST_SEED to replay)")
    return s


def generator(s: int, device: int | None = None) -> torch.Generator:
    g = torch.Generator(device=torch.device("cuda", torch.cuda.current_device() if device is None else device))
    g.manual_seed(s)
    return g


def randn(gen: torch.Generator, *shape, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, device=gen.device) * scale).to(torch.bfloat16)


def poisoned(*shape, dtype=torch.bfloat16, device=None) -> torch.Tensor:
    """A tensor whose bytes are all 0xff (BF16 NaN): a call that must write
    every element leaves none of it."""
    device = device if device is not None else torch.device("cuda", torch.cuda.current_device())
    return torch.full(shape, 0xFF, dtype=torch.uint8, device=device).view(dtype) if dtype.itemsize == 1 else (
        torch.full(shape, POISON, dtype=torch.int16, device=device).view(dtype)
    )


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of t (bit-exact comparisons of any dtype, NaN included)."""
    return t.contiguous().view(torch.uint8)


def same_bits(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def check_gemm(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> None:
    """Every element within the GEMM's bound of the FP64 product: one BF16
    rounding plus FP32 accumulation over K (the C++ tests' bound)."""
    xd, wd = x.double(), w.double()
    want = xd @ wd.T
    magnitude = xd.abs() @ wd.abs().T
    k = x.shape[1]
    bound = want.abs() * 2.0**-8 + magnitude * (k * 2.0**-23) + 2.0**-133
    got = y.double()
    assert torch.isfinite(got).all(), "an output element is poison or not finite"
    worst = ((got - want).abs() / bound).max().item()
    assert worst <= 1.0, f"worst |err|/bound {worst}"


def no_multicast_env() -> None:
    """Never NVLink multicast on the lent machines (DEVELOPERS.md)."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
