"""The import-time check that the extension module and torch share one CUDA
runtime (torch-free, so that CPU tests can call it without torch).

spark_decode._C links the shared CUDA runtime (libcudart.so.<major>) and
expects the one torch loaded (cmake/python.cmake): a process has one
runtime, whose per-thread state (the current device torch.cuda.set_device
sets) both use. Runtimes of different major versions are different
libraries: the module would load a second one, or fail to load.
"""

from __future__ import annotations


def version_text(v: int) -> str:
    """13000 -> "13.0" (CUDART_VERSION's encoding, 1000 major + 10 minor)."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def check_cuda_runtime(built: int, loaded: int, torch_cuda: str | None) -> None:
    """ImportError, saying what to do, unless the CUDA runtime spark_decode._C
    was built against (``built``, CUDART_VERSION), the one the process loaded
    (``loaded``, cudaRuntimeGetVersion) and torch's (``torch.version.cuda``,
    e.g. "13.0"; None for a CPU-only torch, where only tracing and fake
    tensors work and nothing is compared) have one major version."""
    rebuild = (
        "rebuild spark-decode with the CUDA toolkit of torch's major version on PATH "
        "(pip install . --no-build-isolation, docs/python.md), or install the torch build for CUDA "
        f"{version_text(built)}"
    )
    if loaded // 1000 != built // 1000:
        raise ImportError(
            f"spark_decode._C was built against CUDA runtime {version_text(built)} but this process loaded "
            f"CUDA runtime {version_text(loaded)}: {rebuild}"
        )
    if torch_cuda is None:
        return
    try:
        torch_major = int(str(torch_cuda).split(".")[0])
    except ValueError:
        raise ImportError(f"torch.version.cuda = {torch_cuda!r} is not a CUDA version") from None
    if torch_major != built // 1000:
        raise ImportError(
            f"spark_decode._C was built against CUDA runtime {version_text(built)} but torch uses CUDA "
            f"{torch_cuda}: {rebuild}"
        )
