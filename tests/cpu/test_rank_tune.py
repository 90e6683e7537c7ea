#!/usr/bin/env python3
"""tools/rank_tune.py on hand-made tune records: one row tiling per m for every
mode, the sum of the modes' means, tactics missing a mode left out."""
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

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
        self.assertEqual([r[2] for r in ranked], [b, a])
        total, means, tactic, per_m = ranked[0]
        self.assertEqual((total, means), (8.5, (6.0, 2.5)))
        self.assertEqual(ranked[1][0], 9.0)  # A at two tiles: 6 + 3, not 5 + 3
        self.assertEqual(ranked[1][3], [(1, 2, (6.0, 3.0))])

    def test_a_third_mode_joins_the_sum_and_the_row_tiling_choice(self):
        # After the stand-in, A's one row tile is far slower (9 vs 2): with the
        # third mode A's one choice is still two tiles (6 + 3 + 2 = 11 against
        # 5 + 4.5 + 9), and B (6 + 2.5 + 4 = 12.5) now ranks after A. C has no
        # record after the stand-in: left out.
        a, a2 = "S=1 kw=256 accs=1 tile16_from_m=9", "S=1 kw=256 accs=1 tile16_from_m=9 rows32_at_m=9-16"
        b, c = "S=2 kw=256 accs=1 tile16_from_m=9", "S=4 kw=256 accs=1 tile16_from_m=9"
        files = [write([record(a, 9, 5.0, "graph"), record(a2, 9, 6.0, "graph"), record(b, 9, 6.0, "graph"),
                        record(c, 9, 1.0, "graph")]),
                 write([record(a, 9, 4.5, "pdl_chain"), record(a2, 9, 3.0, "pdl_chain"),
                        record(b, 9, 2.5, "pdl_chain"), record(c, 9, 1.0, "pdl_chain")]),
                 write([record(a, 9, 9.0, "after_stream"), record(a2, 9, 2.0, "after_stream"),
                        record(b, 9, 4.0, "after_stream")])]
        try:
            ranked = rank_tune.rank(*(rank_tune.load(f) for f in files))[(64, 512)]
            out = io.StringIO()
            with redirect_stdout(out):
                rc = rank_tune.main([files[0], files[1], "--after", files[2]])
        finally:
            for f in files:
                os.unlink(f)
        self.assertEqual([(r[0], r[2]) for r in ranked], [(11.0, a), (12.5, b)])
        self.assertEqual(ranked[0][3], [(9, 2, (6.0, 3.0, 2.0))])
        self.assertEqual(rc, 0)
        self.assertIn("sum of means (PDL off + PDL chain + after the stand-in)", out.getvalue())
        self.assertIn("11.00 =  6.00 +  3.00 +  2.00", out.getvalue())

    def test_m_ranks_over_those_m_only(self):
        # A wins at m = 1, B at m = 16; over both A ranks first (2 + 9 against
        # 4 + 8), over m = 16 alone B does.
        a, b = "S=4 kw=256 accs=1 tile16_from_m=9", "S=2 kw=256 accs=1 tile16_from_m=9"
        off = write([record(a, 1, 1.0, "graph"), record(a, 16, 5.0, "graph"),
                     record(b, 1, 2.0, "graph"), record(b, 16, 4.0, "graph")])
        pdl = write([record(a, 1, 1.0, "pdl_chain"), record(a, 16, 4.0, "pdl_chain"),
                     record(b, 1, 2.0, "pdl_chain"), record(b, 16, 4.0, "pdl_chain")])
        out = io.StringIO()
        try:
            every = rank_tune.rank(rank_tune.load(off), rank_tune.load(pdl))[(64, 512)]
            tile16 = rank_tune.rank(rank_tune.load(off, {16}), rank_tune.load(pdl, {16}))[(64, 512)]
            with redirect_stdout(out):
                rc = rank_tune.main([off, pdl, "--m", "9,16"])
        finally:
            os.unlink(off)
            os.unlink(pdl)
        self.assertEqual([(r[0], r[2]) for r in every], [(5.5, a), (6.0, b)])
        self.assertEqual([(r[0], r[2]) for r in tile16], [(8.0, b), (9.0, a)])
        self.assertEqual(rc, 0)
        self.assertIn(f"8.00 =  4.00 +  4.00  {b}  |  16:4.00/4.00(r1)", out.getvalue())

    def test_check_against_the_plan_table(self):
        # The tp 8 unpooler shape [1024, 4096]: the table has S=1 kw=256
        # accs=1 with fragment-order loads. A run ranking that first agrees; one
        # ranking S=2 first disagrees on both of tp 8's rows (b 1..8, 9..16).
        def rec(v, us, mode):
            return dict(record(v, 1, us, mode), n=1024, k=4096, tp=8)
        t8, s2 = "S=1 kw=256 accs=1 tile16_from_m=9 unswizzled", "S=2 kw=256 accs=1 tile16_from_m=9"
        for best, want_rc in ((t8, 0), (s2, 1)):
            other = s2 if best == t8 else t8
            off = write([rec(best, 4.0, "graph"), rec(other, 5.0, "graph")])
            pdl = write([rec(best, 3.0, "pdl_chain"), rec(other, 3.5, "pdl_chain")])
            out = io.StringIO()
            try:
                with redirect_stdout(out):
                    rc = rank_tune.main([off, pdl, "--check"])
            finally:
                os.unlink(off)
                os.unlink(pdl)
            self.assertEqual(rc, want_rc, out.getvalue())
            self.assertIn(f"check: {2 * want_rc} of the table's split-K rows disagree", out.getvalue())


if __name__ == "__main__":
    unittest.main()
