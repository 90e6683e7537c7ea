#!/usr/bin/env python3
"""tools/rank_tune.py on hand-made tune records: one row tiling per m for both
modes, the sum of the two modes' means, tactics missing a mode left out."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import rank_tune  # noqa: E402


def record(variant, m, us, mode):
    return {"op": "unpooler", "impl": "spark", "variant": variant, "tp": 1, "m": m, "n": 64, "k": 512,
            "mode": mode, "us": us, "floor_us": 1.0}


def write(records):
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump({"records": records + [dict(record("x", 1, 0.1, "graph"), impl="cublas")]}, f)
    f.close()
    return f.name


class RankTune(unittest.TestCase):
    def test_one_row_tiling_per_m_serves_both_modes(self):
        a, a2 = "S=1 kw=256 accs=1 tile16_from_m=9", "S=1 kw=256 accs=1 tile16_from_m=9 rows32_at_m=1-16"
        b = "S=2 kw=256 accs=1 tile16_from_m=9"
        # A: one row tile is best with PDL off (5 vs 6), two in the chain
        # (3 vs 4.5); taken per mode separately A would score 5 + 3 = 8 and
        # beat B's 6 + 2.5 = 8.5, but no table row can hold both: A's best
        # single choice is two tiles, 6 + 3 = 9 (one: 5 + 4.5 = 9.5).
        off = write([record(a, 1, 5.0, "graph"), record(a2, 1, 6.0, "graph"), record(b, 1, 6.0, "graph"),
                     record("S=4 kw=256 accs=1 tile16_from_m=9", 1, 1.0, "graph")])
        pdl = write([record(a, 1, 4.5, "pdl_chain"), record(a2, 1, 3.0, "pdl_chain"), record(b, 1, 2.5, "pdl_chain")])
        try:
            ranked = rank_tune.rank(rank_tune.load(off), rank_tune.load(pdl))[(64, 512)]
        finally:
            os.unlink(off)
            os.unlink(pdl)
        # S=4 has no PDL record: left out.
        self.assertEqual([r[3] for r in ranked], [b, a])
        total, mean_off, mean_pdl, tactic, per_m = ranked[0]
        self.assertEqual((total, mean_off, mean_pdl), (8.5, 6.0, 2.5))
        self.assertEqual(ranked[1][0], 9.0)  # A at two tiles: 6 + 3, not 5 + 3
        self.assertEqual(ranked[1][4], [(1, 2, 6.0, 3.0)])


if __name__ == "__main__":
    unittest.main()
