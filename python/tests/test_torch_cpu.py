"""The torch layer of the binding without a GPU: what needs torch but no
device (a CPU test: CI gets torch from tools/setup-deps.sh --tests; without
torch it exits 77, skipped).

- The ops' fake implementations: shapes and dtypes (against the library's
  pooler_output_spec) on meta tensors, under FakeTensorMode, and traced by
  torch.compile(fullgraph=True, dynamic=True) with a symbolic batch;
  the schemas as registered.
- The group adapter: None, a spark_decode Group, a ProcessGroup and
  GroupCoordinator-shaped objects (duck typing), with the stock all-gather
  over a gloo group of two processes (host staging, on CPU tensors).
- Bad arguments as InvalidArgument (ValueError) with the reason, through the
  ops and the Python classes, where no GPU is needed to tell.

Run: PYTHONPATH=<build>/python python python/tests/test_torch_cpu.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import types
import unittest

try:
    import torch
except ImportError:
    print("torch is not installed: the torch layer's CPU tests are skipped")
    sys.exit(77)

import spark_decode as sd  # noqa: E402
from spark_decode import _C, ops  # noqa: E402
from spark_decode.group import collective, is_coordinator  # noqa: E402

META = torch.device("meta")


def bf16(*shape, device=META):
    return torch.empty(*shape, dtype=torch.bfloat16, device=device)


def spec(format, b, pooled):
    """The library's pooler_output_spec as torch dtypes."""
    dtypes = {"bf16": torch.bfloat16, "u8": torch.uint8, "e4m3": torch.float8_e4m3fn}
    return {name: (dtypes[d], tuple(shape)) for name, (d, shape) in _C.pooler_output_spec(format, b, pooled).items()}


class FakeImplementations(unittest.TestCase):
    def test_schemas_are_registered(self):
        for name, schema in ops.SCHEMAS.items():
            op = getattr(torch.ops.spark_decode, name).default
            self.assertEqual(str(op._schema), "spark_decode::" + schema)

    def test_pool_shapes_match_the_library(self):
        for pooled in (4096, 1024, 1056):
            for b in (1, 2, 15, 16, 17, 64, 127, 128, 129, 300):
                x = bf16(b, 8192)
                got = torch.ops.spark_decode.pool_bf16(x, "h", 0, pooled)
                self.assertEqual((got.dtype, tuple(got.shape)), spec("bf16", b, pooled)["normed"])
                for swizzled, fmt in ((False, "nvfp4"), (True, "nvfp4_swizzled")):
                    a, a_sf = torch.ops.spark_decode.pool_nvfp4(x, "h", 1, pooled, swizzled)
                    want = spec(fmt, b, pooled)
                    self.assertEqual((a.dtype, tuple(a.shape)), want["a"], (fmt, b, pooled))
                    self.assertEqual((a_sf.dtype, tuple(a_sf.shape)), want["a_sf"], (fmt, b, pooled))
                    self.assertEqual(sd.output_shapes(fmt, b, pooled), want)

    def test_unpool_and_gather_shapes(self):
        y = torch.ops.spark_decode.unpool(bf16(7, 4096), "h", 1024)
        self.assertEqual((y.dtype, tuple(y.shape), y.device), (torch.bfloat16, (7, 1024), META))
        full = torch.ops.spark_decode.gather(bf16(7, 1024), "h", 8)
        self.assertEqual((full.dtype, tuple(full.shape)), (torch.bfloat16, (7, 8192)))
        # The mutating forms return nothing and allocate nothing.
        self.assertIsNone(torch.ops.spark_decode.unpool_out(bf16(7, 4096), "h", bf16(7, 1024)))
        self.assertIsNone(torch.ops.spark_decode.gather_out(bf16(7, 1024), "h", bf16(7, 8192)))
        self.assertIsNone(torch.ops.spark_decode.pool_bf16_out(bf16(7, 8192), "h", 0, bf16(7, 4096)))
        a, a_sf = sd.pooler.empty_outputs("nvfp4_swizzled", 7, 4096, META)
        self.assertIsNone(torch.ops.spark_decode.pool_nvfp4_out(bf16(7, 8192), "h", 1, a, a_sf))

    def test_under_fake_tensor_mode(self):
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

        with FakeTensorMode() as mode:
            x = mode.from_tensor(torch.empty(5, 8192, dtype=torch.bfloat16))
            a, a_sf = torch.ops.spark_decode.pool_nvfp4(x, "h", 1, 4096, True)
            y = torch.ops.spark_decode.unpool(x[:, :4096], "h", 2048)
            full = torch.ops.spark_decode.gather(y, "h", 4)
        for t in (a, a_sf, y, full):
            self.assertIsInstance(t, FakeTensor)
        self.assertEqual(tuple(a_sf.shape), (128, 256))
        self.assertEqual(tuple(full.shape), (5, 8192))

    def test_traced_by_compile_with_a_symbolic_batch(self):
        """The boundary ops as a model calls them, traced by torch.compile
        (fullgraph, dynamic): one graph whose outputs have the batch symbol
        and the formats' shapes. The backend only records (no GPU runs)."""
        seen = {}

        def backend(gm, example_inputs):
            seen["graph"] = gm
            outs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
            seen["outputs"] = [o.meta.get("val", o.meta.get("example_value")) for o in outs]
            seen["ops"] = [str(n.target).removesuffix(".default") for n in gm.graph.nodes if n.op == "call_function"]

            return lambda *args: [torch.zeros(1) for _ in seen["outputs"]]  # nothing runs

        def step(x, m):
            a, a_sf = torch.ops.spark_decode.pool_nvfp4(x, "p", 1, 4096, True)
            normed = torch.ops.spark_decode.pool_bf16(x, "p", 0, 4096)
            y = torch.ops.spark_decode.unpool(m, "u", 1024)
            return a, a_sf, normed, torch.ops.spark_decode.gather(y, "mb", 8)

        compiled = torch.compile(step, fullgraph=True, dynamic=True, backend=backend)
        compiled(torch.zeros(5, 8192, dtype=torch.bfloat16), torch.zeros(5, 4096, dtype=torch.bfloat16))
        self.assertEqual(
            [op for op in seen["ops"] if op.startswith("spark_decode")],
            ["spark_decode.pool_nvfp4", "spark_decode.pool_bf16", "spark_decode.unpool", "spark_decode.gather"],
        )
        a, a_sf, normed, full = seen["outputs"]
        b = a.shape[0]
        self.assertIsInstance(b, torch.SymInt)
        self.assertEqual([str(d) for d in a.shape[1:]], ["2048"])
        self.assertIn("128", str(a_sf.shape[0]))  # round_up(b, 128), symbolic
        self.assertEqual((a.dtype, a_sf.dtype, normed.dtype, full.dtype),
                         (torch.uint8, torch.float8_e4m3fn, torch.bfloat16, torch.bfloat16))
        self.assertEqual(int(full.shape[1]), 8192)


class OpErrors(unittest.TestCase):
    """Without a GPU no object can be built; what the ops can still tell."""

    def test_unknown_handles(self):
        x = torch.zeros(2, 4096, dtype=torch.bfloat16)
        with self.assertRaisesRegex(ValueError, "no spark_decode object is registered under handle 'nope'"):
            torch.ops.spark_decode.unpool(x, "nope", 1024)
        with self.assertRaisesRegex(sd.InvalidArgument, "spark_decode.gather: no spark_decode object"):
            torch.ops.spark_decode.gather(x, "nope", 2)
        with self.assertRaisesRegex(ValueError, "spark_decode.pool_nvfp4: no spark_decode object"):
            torch.ops.spark_decode.pool_nvfp4(x, "nope", 1, 4096, False)

    def test_a_handle_of_another_kind(self):
        # Register a stand-in under a handle, as the classes do.
        from spark_decode import _registry
        from spark_decode.mailbox import LamportMailbox

        fake = LamportMailbox.__new__(LamportMailbox)
        handle = _registry.register(fake, "mailbox")
        with self.assertRaisesRegex(ValueError, f"handle '{handle}' names a LamportMailbox, not a Unpooler"):
            torch.ops.spark_decode.unpool(torch.zeros(2, 4096, dtype=torch.bfloat16), handle, 1024)
        del fake  # weakly held: released with its last reference
        import gc

        gc.collect()
        with self.assertRaisesRegex(ValueError, "never built in this process, or released"):
            torch.ops.spark_decode.gather(torch.zeros(2, 64, dtype=torch.bfloat16), handle, 1)


class PythonArguments(unittest.TestCase):
    def test_devices(self):
        from spark_decode._tensors import device_index

        for bad, reason in ((-1, "device -1 is not a CUDA device ordinal"), ("cpu", "device cpu is not a CUDA"),
                            ("cuda:-1", "device 'cuda:-1' is not a CUDA device"), (2**40, "is not a 32-bit"),
                            (1.5, "device = 1.5 is not an integer")):
            with self.assertRaisesRegex(sd.InvalidArgument, reason):
                device_index(bad)
        self.assertEqual(device_index(3), 3)
        self.assertEqual(device_index("cuda:2"), 2)
        with self.assertRaisesRegex(ValueError, "device -1 is not a CUDA device ordinal"):
            sd.LamportMailbox(None, tp=1, rank=0, capacity=4, width=256, device=-1)
        with self.assertRaisesRegex(ValueError, "mailbox capacity = 1099511627776 is not a 32-bit"):
            sd.LamportMailbox(None, tp=1, rank=0, capacity=2**40, width=256, device=0)

    def test_unpooler_shape_fields(self):
        w = torch.zeros(8192, 4096, dtype=torch.bfloat16)  # host memory: unsupported says so, no GPU needed
        self.assertIn("UnpoolerShape.kw = 1099511627776 is not a 32-bit integer",
                      sd.Unpooler.unsupported(w, sd.UnpoolerShape(kw=2**40)))
        self.assertIn("is not an integer", sd.Unpooler.unsupported(w, sd.UnpoolerShape(kw="wide")))
        self.assertIn("neither a mapping nor a sequence", sd.Unpooler.unsupported(w, sd.UnpoolerShape(token_tile=8)))
        self.assertIn("needs device memory", sd.Unpooler.unsupported(w))
        with self.assertRaisesRegex(ValueError, r"UnpoolerShape.token_tile\[3\] = 1099511627776"):
            sd.UnpoolerShape(token_tile=[8, 8, 8, 2**40]).as_dict()

    def test_output_formats(self):
        with self.assertRaisesRegex(ValueError, "output format 'fp8' is not one of"):
            sd.output_shapes("fp8", 1, 4096)
        self.assertEqual(sd.__version__, _C.__version__)


# ---- groups --------------------------------------------------------------------------


class Coordinator:
    """The attributes of vLLM's GroupCoordinator the adapter reads."""

    def __init__(self, world_size, rank_in_group, cpu_group=None, device_group=None):
        self.world_size, self.rank_in_group = world_size, rank_in_group
        self.cpu_group, self.device_group = cpu_group, device_group


class Groups(unittest.TestCase):
    def test_forms(self):
        one = collective(None)
        self.assertEqual((one.tp, one.rank, one.device_group), (1, 0, None))
        g = sd.CallbackGroup(1, 2, lambda data: data * 2, lambda: None)
        self.assertIs(collective(g).group, g)
        self.assertIs(collective(collective(g)).group, g)  # a Collective passes through

    def test_duck_typed_coordinators(self):
        self.assertTrue(is_coordinator(Coordinator(2, 0, cpu_group=object())))
        self.assertFalse(is_coordinator(Coordinator(2, 0)))  # neither group
        self.assertFalse(is_coordinator(types.SimpleNamespace(world_size=2, cpu_group=object())))
        # A coordinator over a spark_decode Group (no torch.distributed).
        g = sd.CallbackGroup(1, 2, lambda data: data * 2, lambda: None)
        c = collective(Coordinator(2, 1, cpu_group=g))
        self.assertEqual((c.tp, c.rank, c.device_group), (2, 1, None))
        self.assertIs(c.group, g)
        self.assertEqual(collective(Coordinator(1, 0, cpu_group=g)).tp, 1)  # world_size 1: no rendezvous
        with self.assertRaisesRegex(ValueError, "world_size 4, rank_in_group 1, but its cpu_group has size 2"):
            collective(Coordinator(4, 1, cpu_group=g))
        with self.assertRaisesRegex(ValueError, "rank_in_group 3 of world_size 2 is not a rank"):
            collective(Coordinator(2, 3, cpu_group=g))

    def test_stock_all_gather_over_a_group_without_nccl(self):
        """Host staging through the rendezvous: each rank's rows side by side."""
        rows = [torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16) + 100 * q for q in range(2)]

        def all_gather(data):  # rank 1 of 2: rank 0's bytes come first
            return bytes(rows[0].view(torch.uint8).reshape(-1).tolist()) + data

        c = collective(Coordinator(2, 1, cpu_group=sd.CallbackGroup(1, 2, all_gather, lambda: None)))
        out = c.all_gather_rows(rows[1])
        self.assertTrue(torch.equal(out, torch.cat(rows, dim=1)))

    def test_gloo_process_group_and_coordinator_two_processes(self):
        import torch.multiprocessing as mp

        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_two_ranks, args=(os.path.join(tmp, "rendezvous"), tmp), nprocs=2, join=True)
            for rank in range(2):
                with open(os.path.join(tmp, f"rank{rank}")) as f:
                    self.assertEqual(f.read(), "ok", f"rank {rank}")


def _two_ranks(rank, init_file, result_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        problems = []
        for form, group in (("ProcessGroup", dist.group.WORLD),
                            ("coordinator", Coordinator(2, rank, cpu_group=dist.group.WORLD, device_group=None)),
                            ("coordinator with a gloo device_group",
                             Coordinator(2, rank, cpu_group=None, device_group=dist.group.WORLD))):
            c = collective(group)
            if (c.tp, c.rank) != (2, rank) or c.device_group is not None:
                problems.append(f"{form}: tp {c.tp} rank {c.rank} device_group {c.device_group}")
            if c.group.all_gather(bytes([rank]) * 3) != b"\x00\x00\x00\x01\x01\x01":
                problems.append(f"{form}: all_gather")
            c.group.barrier()
            shard = torch.full((3, 4), float(rank + 1)).to(torch.bfloat16)
            want = torch.cat([torch.full((3, 4), 1.0), torch.full((3, 4), 2.0)], dim=1).to(torch.bfloat16)
            if not torch.equal(c.all_gather_rows(shard), want):
                problems.append(f"{form}: all_gather_rows")
        with open(os.path.join(result_dir, f"rank{rank}"), "w") as f:
            f.write("; ".join(problems) or "ok")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    unittest.main(verbosity=2)
