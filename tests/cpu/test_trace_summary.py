#!/usr/bin/env python3
"""tools/trace_summary.py on hand-made per-CTA timelines: each CTA's points
after its own wait, the on-chip engine's rank 0 (the CTAs that record mark 1)
apart from its senders, the CTA that ends last, the gaps between launches and
the timer step read off the stamps."""
import csv
import io
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import trace_summary  # noqa: E402

FIELDS = ["grid", "start_ns", "waited_ns"] + [f"mark{i}_ns" for i in range(6)] + ["end_ns", "block", "kernel", "sm"]
STEP = 32  # ns


def cta(grid, block, start, waited, end, marks, kernel="onchip_mma"):
    row = {"grid": grid, "start_ns": start, "waited_ns": waited, "end_ns": end, "block": block, "kernel": kernel,
           "sm": block}
    for i in range(6):
        row[f"mark{i}_ns"] = marks.get(i, 0)
    return row


def timeline(launches, kernel="onchip_mma"):
    """Launch g at t = 4000 g ns (from 1 ms), two CTAs, both waiting at
    t + 10 steps. Block 0 is rank 0: marks 0, 1, 4, 5, ends 30 steps after
    its wait. Block 1 is a sender: marks 0 and 4, ends 10 steps after its wait
    in even launches and 40 in odd ones, where it is the CTA that ends last."""
    rows = []
    for g in range(launches):
        t = 1_000_000 + 4000 * g
        w = t + 10 * STEP
        rows.append(cta(g, 0, t, w, w + 20 * STEP,
                        {0: w + 2 * STEP, 1: w + 10 * STEP, 4: w - 2 * STEP, 5: w + 15 * STEP}, kernel))
        rows.append(cta(g, 1, t + STEP, w, w + (40 if g % 2 else 10) * STEP, {0: w + 4 * STEP, 4: w - STEP}, kernel))
    f = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False, newline="")
    w = csv.DictWriter(f, fieldnames=FIELDS)
    w.writeheader()
    w.writerows(rows)
    f.close()
    return f.name


def summary(path):
    """The printed output and its last line's means, {name: us}."""
    out = io.StringIO()
    with mock.patch.object(sys, "argv", ["trace_summary.py", path, "--skip", "1", "--show", "0"]), \
            redirect_stdout(out):
        trace_summary.main()
    text = out.getvalue()
    means = text.rsplit("mean over", 1)[1].split(":", 1)[1].split("(us;")[0]
    return text, {k: float(v) for k, v in (p.strip().rsplit(" ", 1) for p in means.split(","))}


class TraceSummary(unittest.TestCase):
    def setUp(self):
        self.path = timeline(6)

    def tearDown(self):
        os.unlink(self.path)

    def test_per_cta_points_after_each_wait(self):
        launches = trace_summary.load(self.path)
        self.assertEqual(len(launches), 6)
        self.assertEqual(trace_summary.timer_step(launches), STEP)
        got = trace_summary.per_cta(launches[1]["rows"])
        self.assertEqual(got["start"], [-0.32, -0.288])
        self.assertEqual(got["end"], [0.64, 1.28])
        self.assertEqual(got["mark4"], [-0.064, -0.032])  # before the wait
        self.assertEqual(got["mark5"], [0.48])

    def assertPrinted(self, got, want):
        """The summary prints means to 0.01 us."""
        self.assertAlmostEqual(got, want, delta=0.006)

    def test_rank0_and_the_last_cta_apart_from_every_cta(self):
        # Launches 1..4 count (--skip 1; the last has no successor): two odd, two even.
        text, s = summary(self.path)
        self.assertIn(f"timer step {STEP} ns", text)
        self.assertPrinted(s["cta:end"], (0.64 + 1.28 + 0.64 + 0.32) / 4)
        self.assertPrinted(s["cta:start"], (-0.32 - 0.288) / 2)
        self.assertPrinted(s["r0:end"], 0.64)     # block 0 alone
        self.assertPrinted(s["r0:start"], -0.32)
        self.assertPrinted(s["r0:mark4"], -0.064)
        self.assertPrinted(s["r0:mark1"], 0.32)
        self.assertPrinted(s["last:end"], (1.28 + 0.64) / 2)  # the sender in odd launches
        self.assertPrinted(s["tail"], (1.28 + 0.64) / 2)
        # This launch's first wait - the previous one's last end: 4.32 us after
        # a rank-0-last launch's 0.96, after a sender-last one's 1.6.
        self.assertPrinted(s["lag"], (4.32 - 0.96 + 4.32 - 1.6) / 2)
        self.assertNotIn("r0:mark2", s)  # nobody recorded it

    def test_rank0_is_the_onchip_engines_only(self):
        # The fused gather + norm also records a mark 1 (its data arrived).
        path = timeline(6, kernel="gather_norm")
        try:
            text, s = summary(path)
            self.assertIn("cta:mark1", s)
            self.assertFalse(any(k.startswith("r0:") for k in s), text)
        finally:
            os.unlink(path)


if __name__ == "__main__":
    unittest.main()
