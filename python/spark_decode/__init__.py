"""spark-decode: the tensor-parallel decode kernels at the MoE boundaries of
Muse Spark, for PyTorch (H200 / sm_90a; compute capability 9.0 or newer).

    import spark_decode as sd
    u = sd.Unpooler(weight_shard)          # [N, K] BF16 on the current GPU
    u.run(x, out)                          # out[m, N] = x[m, K] @ W^T, m <= 16

Every class keeps the names and signatures of the original Python design
(docs/design.md, "Departures from the original design"); the C++ API
(include/spark_decode/) says the exact semantics. Invalid input raises
InvalidArgument (a ValueError) with the library's reason; environment
failures raise SparkRuntimeError (a RuntimeError). Calls run on the object's
device, which must be the calling thread's current CUDA device
(torch.cuda.set_device(rank) in each rank's process or thread).

Inside a compiled model: the operators torch.ops.spark_decode.* (ops.py),
and spark_decode.moe, the drop-in module of one MoE layer's boundaries
(docs/python.md).
"""

# torch first: its CUDA runtime (libcudart.so from its wheel) must be the one
# loaded, which the extension module then shares (one runtime per process).
import torch

from ._runtime import check_cuda_runtime

try:
    from . import _C
except ImportError as e:  # most often: no libcudart of the major version the module was built for
    raise ImportError(
        f"spark_decode._C does not load ({e}); torch uses CUDA {torch.version.cuda}: the module must be built "
        "with the CUDA toolkit of torch's major version (docs/python.md)"
    ) from e

check_cuda_runtime(_C.CUDA_RUNTIME_BUILT, _C.cuda_runtime_version(), torch.version.cuda)

__version__ = _C.__version__

from ._C import InvalidArgument, SparkRuntimeError, format_plan_table  # noqa: E402
from .group import CallbackGroup, Collective, Group, collective, from_process_group, single_rank  # noqa: E402
from .mailbox import LamportMailbox  # noqa: E402
from .pooler import ExpertNorm, Pooler, PoolerLayer, nvfp4_quantize, output_shapes, pooler_layer  # noqa: E402
from .unpooler import MAX_M, UNPOOLER, Unpooler, UnpoolerShape, launch_unsupported, tactic  # noqa: E402
from . import ops  # noqa: E402  (registers torch.ops.spark_decode.*)
from . import moe  # noqa: E402
from ._registry import path_counts, reset_path_counts  # noqa: E402

__all__ = [
    "CallbackGroup",
    "Collective",
    "ExpertNorm",
    "Group",
    "InvalidArgument",
    "LamportMailbox",
    "MAX_M",
    "Pooler",
    "PoolerLayer",
    "SparkRuntimeError",
    "UNPOOLER",
    "Unpooler",
    "UnpoolerShape",
    "__version__",
    "collective",
    "format_plan_table",
    "from_process_group",
    "launch_unsupported",
    "moe",
    "nvfp4_quantize",
    "ops",
    "output_shapes",
    "path_counts",
    "pooler_layer",
    "reset_path_counts",
    "single_rank",
    "tactic",
]
