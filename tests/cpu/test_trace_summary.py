#!/usr/bin/env python3
"""tools/trace_summary.py on a hand-made per-CTA timeline: each CTA's points
after its own wait, rank 0's (the CTAs that record mark 1) apart, the CTA that
ends last, and the timer step read off the stamps."""
import csv
import io
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import trace_summary  # noqa: E402

FIELDS = ["grid", "start_ns", "waited_ns"] + [f"mark{i}_ns" for i in range(6)] + ["end_ns", "block", "kernel", "sm"]


def cta(grid, block, start, waited, end, marks):
    row = {"grid": grid, "start_ns": start, "waited_ns": waited, "end_ns": end, "block": block,
           "kernel": "onchip_mma", "sm": block}
    for i in range(6):
        row[f"mark{i}_ns"] = marks.get(i, 0)
    return row


def timeline(launches, step=32):
    """Two CTAs per launch, 4000 ns apart: block 0 is rank 0 (marks 1 and 5,
    ends 640 ns after its wait), block 1 a sender (ends 320 ns after)."""
    rows = []
    for g in range(launches):
        t = 1_000_000 + 4000 * g
        rows.append(cta(g, 0, t, t + 10 * step, t + 30 * step, {0: t + 12 * step, 1: t + 20 * step, 4: t + 8 * step,
                                                                5: t + 25 * step}))
        rows.append(cta(g, 1, t + step, t + 10 * step, t + 20 * step, {0: t + 14 * step}))
    f = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False, newline="")
    w = csv.DictWriter(f, fieldnames=FIELDS)
    w.writeheader()
    w.writerows(rows)
    f.close()
    return f.name


def summary(path):
    out = io.StringIO()
    sys.argv = ["trace_summary.py", path, "--skip", "1", "--show", "0"]
    with redirect_stdout(out):
        trace_summary.main()
    text = out.getvalue()
    means = text.rsplit("mean over", 1)[1].split(":", 1)[1]
    return text, {k: float(v) for k, v in (p.strip().rsplit(" ", 1) for p in means.split("(us;")[0].split(","))}


class TraceSummary(unittest.TestCase):
    def test_per_cta_points_after_each_wait(self):
        path = timeline(6)
        try:
            launches = trace_summary.load(path)
            self.assertEqual(len(launches), 6)
            self.assertEqual(trace_summary.timer_step(launches), 32)
            got = trace_summary.per_cta(launches[0]["rows"])
            self.assertEqual(got["start"], [-0.32, -0.288])
            self.assertEqual(got["end"], [0.64, 0.32])
            self.assertEqual(got["mark0"], [0.064, 0.128])
            self.assertEqual(got["mark4"], [-0.064])  # before the wait
            self.assertEqual(got["mark5"], [0.48])
        finally:
            os.unlink(path)

    def test_rank0_and_last_apart_from_every_cta(self):
        path = timeline(6)
        try:
            text, s = summary(path)
            self.assertIn("timer step 32 ns", text)
            self.assertAlmostEqual(s["cta:end"], 0.48)   # both CTAs
            self.assertAlmostEqual(s["r0:end"], 0.64)    # block 0 only
            self.assertAlmostEqual(s["r0:mark1"], 0.32)
            self.assertAlmostEqual(s["last:end"], 0.64)  # block 0 ends last
            self.assertAlmostEqual(s["tail"], 0.64)
            self.assertAlmostEqual(s["lag"], 4.0 - 0.96 + 0.32)  # next first wait - this last end
            self.assertNotIn("r0:mark2", s)  # nobody recorded it
        finally:
            os.unlink(path)


if __name__ == "__main__":
    unittest.main()
