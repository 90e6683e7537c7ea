"""spark_decode._C without torch and without a GPU (a CPU test, run in CI).

What the binding's C++ half adds over the library, checked where no GPU is:
tensor descriptions parsed (and refused with reasons), arguments reaching
the library in the right order, library errors raised as InvalidArgument (a
ValueError) and SparkRuntimeError (a RuntimeError), tactic dictionaries
round-tripping, and CallbackGroup's checks. The module is imported from
SPARK_DECODE_MODULE_DIR (the build's python/spark_decode) as a top-level
module, so that the package's torch imports are not needed.
"""

import os
import sys
import unittest

sys.path.insert(0, os.environ["SPARK_DECODE_MODULE_DIR"])
import _C  # noqa: E402
import _runtime  # noqa: E402  (torch-free, copied beside the module)

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def desc(shape, dtype="bf16", data=1 << 20, device=0):
    strides, s = [], 1
    for d in reversed(shape):
        strides.insert(0, s)
        s *= d
    return (data, dtype, tuple(shape), tuple(strides), device)


class Errors(unittest.TestCase):
    def test_exception_classes(self):
        self.assertTrue(issubclass(_C.InvalidArgument, ValueError))
        self.assertTrue(issubclass(_C.SparkRuntimeError, RuntimeError))

    def test_tensor_descriptions_are_checked(self):
        # unsupported() says why (its contract: a reason or None, never raises) ...
        self.assertIn("dtype 'f16' is not one the library takes", _C.Unpooler.unsupported(desc([64, 256], "f16"), None))
        self.assertIn("is (data, dtype, shape, strides, device)", _C.Unpooler.unsupported((1, "bf16", (64, 256)), None))
        self.assertIn("at most 4 dimensions", _C.Unpooler.unsupported(desc([1, 1, 1, 64, 256]), None))
        # ... where every other entry point raises it.
        with self.assertRaisesRegex(_C.InvalidArgument, "dtype 'f16' is not one the library takes"):
            _C.Unpooler(desc([64, 256], "f16"), None, True, None, [], None)
        with self.assertRaisesRegex(_C.InvalidArgument, r"is \(data, dtype, shape, strides, device\)"):
            _C.ExpertNorm((1, "bf16", (512,)), 1e-5, 1.0, True)

    def test_unsupported_reaches_the_library(self):
        self.assertIsNone(_C.Unpooler.unsupported(desc([8192, 4096]), None))
        reason = _C.Unpooler.unsupported(desc([40, 256]), None)
        self.assertIn("N % 16", reason)
        self.assertIn("[40, 256]", reason)
        # Misaligned data and a strided (non-contiguous) view.
        self.assertIsNotNone(_C.Unpooler.unsupported(desc([64, 256], data=(1 << 20) + 2), None))
        self.assertIsNotNone(_C.Unpooler.unsupported((1 << 20, "bf16", (64, 256), (512, 1), 0), None))

    def test_launch_unsupported_argument_order(self):
        self.assertIsNone(_C.launch_unsupported(8192, 4096, 2, 256, 1))
        reason = _C.launch_unsupported(8192, 4096, 3, 256, 1)
        self.assertIn("n=8192", reason)
        self.assertIn("splits=3", reason)
        self.assertIsNotNone(_C.launch_unsupported(8192, 4096, 2, 96, 1))  # kw 96 has no kernel
        self.assertIsNotNone(_C.launch_unsupported(8192, 4096, 2, 256, 3))  # accs 3


class ArgumentsThatDoNotFit(unittest.TestCase):
    """Values the module converts itself are refused as InvalidArgument
    naming the field, never pybind11's cast_error (a RuntimeError)."""

    def test_tactic_fields_beyond_32_bits(self):
        for field in ("kw", "splits", "accs"):
            with self.assertRaisesRegex(_C.InvalidArgument, f"tactic field '{field}' = 1099511627776 is not a 32-bit"):
                _C.tactic_unsupported(8192, 4096, {field: 2**40})
        with self.assertRaisesRegex(_C.InvalidArgument, "tactic field 'kw' = 'wide' is not a 32-bit integer"):
            _C.tactic_unsupported(8192, 4096, {"kw": "wide"})
        with self.assertRaisesRegex(_C.InvalidArgument, "token_tile' key = 4294967296"):
            _C.tactic_unsupported(8192, 4096, {"token_tile": {2**32: 8}})
        with self.assertRaisesRegex(_C.InvalidArgument, "token_tile' = \\[8, 1099511627776"):
            _C.tactic_unsupported(8192, 4096, {"token_tile": [8, 2**40] + [8] * 14})

    def test_unsupported_says_why_and_never_raises(self):
        reason = _C.Unpooler.unsupported(desc([8192, 4096]), {"kw": 2**40})
        self.assertIn("is not a 32-bit integer", reason)
        self.assertIn("is not a 32-bit integer", _C.Unpooler.unsupported(desc([8192, 4096]), {"accs": 2**63}))
        self.assertIn("address", _C.Unpooler.unsupported((-1, "bf16", (64, 256), (256, 1), 0), None))

    def test_descriptions_beyond_their_types(self):
        with self.assertRaisesRegex(_C.InvalidArgument, "a tensor's shape = .* is not a sequence of 64-bit"):
            _C.ExpertNorm((1 << 20, "bf16", (2**70,), (1,), 0), 1e-5, 1.0, True)
        with self.assertRaisesRegex(_C.InvalidArgument, "a tensor's device = 4294967296 is not a 32-bit"):
            _C.ExpertNorm((1 << 20, "bf16", (512,), (1,), 2**32), 1e-5, 1.0, True)

    def test_a_negative_device_is_an_invalid_argument_with_or_without_a_gpu(self):
        g = _C.CallbackGroup(0, 1, lambda data: data, lambda: None)
        with self.assertRaisesRegex(_C.InvalidArgument, "device -1 is not a CUDA device ordinal"):
            _C.LamportMailbox(g, 1, 0, 4, 256, -1, 5.0)

    def test_output_formats(self):
        self.assertEqual(_C.pooler_output_spec("bf16", 3, 4096), {"normed": ("bf16", (3, 4096))})
        self.assertEqual(_C.pooler_output_spec("nvfp4", 3, 4096), {"a": ("u8", (3, 2048)), "a_sf": ("e4m3", (3, 256))})
        self.assertEqual(_C.pooler_output_spec("nvfp4_swizzled", 130, 4096)["a_sf"], ("e4m3", (256, 256)))
        self.assertEqual(_C.pooler_output_spec("nvfp4_swizzled", 1, 1024 + 32)["a_sf"], ("e4m3", (128, 68)))
        with self.assertRaisesRegex(_C.InvalidArgument, "output format 'fp4' is not one of"):
            _C.pooler_output_spec("fp4", 1, 4096)

    def test_pooler_workspace_arguments_before_the_gpu(self):
        g = _C.CallbackGroup(0, 1, lambda data: data, lambda: None)
        with self.assertRaisesRegex(_C.InvalidArgument, "no pooler GEMM shape for TP3"):
            _C.Pooler.workspace(g, 3, 0, 0, 8192, 4096, [1], 16, True, 5.0)
        with self.assertRaisesRegex(_C.InvalidArgument, "batches must lie in"):
            _C.Pooler.workspace(g, 1, 0, 0, 8192, 4096, [17], 16, True, 5.0)


class Packaging(unittest.TestCase):
    def test_version_is_the_projects(self):
        with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
            import re

            version = re.search(r"project\(spark_decode VERSION ([0-9.]+)", f.read()).group(1)
        self.assertEqual(_C.__version__, version)

    def test_cuda_runtime_versions(self):
        self.assertEqual(_C.CUDA_RUNTIME_BUILT // 1000, _C.cuda_runtime_version() // 1000)
        _runtime.check_cuda_runtime(_C.CUDA_RUNTIME_BUILT, _C.cuda_runtime_version(), None)

    def test_cuda_runtime_check(self):
        _runtime.check_cuda_runtime(13000, 13000, "13.0")
        _runtime.check_cuda_runtime(13000, 13020, "13.2")  # one major version: one library
        _runtime.check_cuda_runtime(13000, 13000, None)  # a CPU-only torch: nothing to compare
        with self.assertRaisesRegex(ImportError, "built against CUDA runtime 13.0 but torch uses CUDA 12.8: rebuild"):
            _runtime.check_cuda_runtime(13000, 13000, "12.8")
        with self.assertRaisesRegex(ImportError, "this process loaded CUDA runtime 12.8"):
            _runtime.check_cuda_runtime(13000, 12080, "13.0")
        with self.assertRaisesRegex(ImportError, "is not a CUDA version"):
            _runtime.check_cuda_runtime(13000, 13000, "rocm")


class Tactics(unittest.TestCase):
    def test_table_tactics_round_trip(self):
        for n, k in [(8192, 4096), (4096, 4096), (2048, 4096), (1024, 4096), (4096, 8192)]:
            t = _C.unpooler_tactic(n, k)
            self.assertEqual(sorted(t), ["accs", "cluster_balance", "kw", "row_swizzle", "row_tiles", "splits",
                                         "token_tile"])
            self.assertEqual(len(t["token_tile"]), _C.MAX_BATCH)
            self.assertIsNone(_C.tactic_unsupported(n, k, t), (n, k, t))
            self.assertIsNone(_C.tactic_unsupported(n, k, {}))  # the table's, by default
        self.assertIn("unpooler tp 1 b 1..8 -> splitk_mma S=2 kw=256", _C.format_plan_table())
        self.assertIn("pooler tp 1 b 9..16 -> ring_mma", _C.format_plan_table())

    def test_row_swizzle_follows_kw_and_accs(self):
        # tp 8's table tactic has fragment-order loads (kw=256 accs=1 only):
        # another kw gets the swizzled loads unless asked otherwise.
        self.assertFalse(_C.unpooler_tactic(1024, 4096)["row_swizzle"])
        self.assertIsNone(_C.tactic_unsupported(1024, 4096, {"kw": 128, "accs": 2}))
        self.assertIn("unswizzled", _C.tactic_unsupported(1024, 4096, {"kw": 128, "row_swizzle": False}))
        self.assertIsNone(_C.tactic_unsupported(8192, 4096, {"row_swizzle": False, "accs": 1}))

    def test_bad_tactic_fields(self):
        with self.assertRaisesRegex(_C.InvalidArgument, "token_tile needs one entry per m in 1..16"):
            _C.tactic_unsupported(8192, 4096, {"token_tile": [8] * 15})
        with self.assertRaisesRegex(_C.InvalidArgument, "unknown tactic field 'split'"):
            _C.tactic_unsupported(8192, 4096, {"split": 2})
        with self.assertRaisesRegex(_C.InvalidArgument, "token_tile: m 17 outside 1..16"):
            _C.tactic_unsupported(8192, 4096, {"token_tile": {17: 8}})
        self.assertIsNone(_C.tactic_unsupported(8192, 4096, {"token_tile": {1: 16}}))  # a 16-tile serves m = 1
        self.assertIsNotNone(_C.tactic_unsupported(8192, 4096, {"token_tile": {16: 8}}))
        # unsupported() reports a bad tactic too, instead of raising.
        self.assertIn("token_tile needs one entry per m", _C.Unpooler.unsupported(desc([8192, 4096]), {"token_tile": [8]}))
        t = _C.unpooler_tactic(8192, 4096)
        t["token_tile"] = [8] * 16  # an 8-token tile cannot serve m > 8
        self.assertIsNotNone(_C.tactic_unsupported(8192, 4096, t))


class Groups(unittest.TestCase):
    def test_callback_group(self):
        g = _C.CallbackGroup(1, 2, lambda data: data * 2, lambda: None)
        self.assertEqual((g.rank, g.size), (1, 2))
        self.assertIsInstance(g, _C.Group)
        for rank, size in [(2, 2), (-1, 2), (0, 0)]:
            with self.assertRaisesRegex(_C.InvalidArgument, f"group rank {rank} of size {size}"):
                _C.CallbackGroup(rank, size, lambda data: data, lambda: None)

    def test_a_transport_returning_wrong_bytes_is_a_runtime_error(self):
        g = _C.CallbackGroup(0, 1, lambda data: data * 2, lambda: None)
        with self.assertRaisesRegex(_C.SparkRuntimeError, r"all_gather returned 8 bytes, expected 1 x 4"):
            g.all_gather(b"abcd")
        pair = _C.CallbackGroup(1, 2, lambda data: b"0123" + data, lambda: None)
        self.assertEqual(pair.all_gather(b"abcd"), b"0123abcd")

    def test_mailbox_without_a_gpu_says_so(self):
        g = _C.CallbackGroup(0, 1, lambda data: data, lambda: None)
        try:
            mb = _C.LamportMailbox(g, 1, 0, 4, 256, 0, 5.0)
        except _C.SparkRuntimeError as e:
            self.assertIn("GPU", str(e))
        else:  # a machine with a GPU: the mailbox works
            self.assertEqual((mb.tp, mb.width, mb.capacity), (1, 256, 4))
            mb.barrier()


if __name__ == "__main__":
    unittest.main(verbosity=2)
