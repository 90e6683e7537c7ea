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
"""

# torch first: its CUDA runtime (libcudart.so from its wheel) must be the one
# loaded, which the extension module then shares (one runtime per process).
import torch  # noqa: F401  (imported for its side effect)

from ._C import InvalidArgument, SparkRuntimeError, format_plan_table
from .group import CallbackGroup, Group, from_process_group, single_rank
from .mailbox import LamportMailbox
from .pooler import ExpertNorm, Pooler, PoolerLayer, pooler_layer
from .unpooler import MAX_M, UNPOOLER, Unpooler, UnpoolerShape, launch_unsupported, tactic

__all__ = [
    "CallbackGroup",
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
    "format_plan_table",
    "from_process_group",
    "launch_unsupported",
    "pooler_layer",
    "single_rank",
    "tactic",
]
