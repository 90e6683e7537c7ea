#!/usr/bin/env python3
"""tools/rank_pooler.py on hand-made `bench pooler` records: the three-figure
sum per (tp, b) over the engines with a Pooler.run time (the others listed
unranked), the two-figure fallback where fewer than two have one, engines
missing a GEMM mode left out, the table's choice read back, the consumer's
trigger rows listed faster first."""
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import plan_table  # noqa: E402
import rank_pooler  # noqa: E402


def gemm(variant, tp, b, mode, us):
    return {"op": "pooler_gemm", "impl": "spark", "variant": variant, "mode": mode, "tp": tp, "m": b,
            "n": 4096 // tp, "k": 8192, "us": us, "floor_us": 1.0}


def run(engine, tp, b, us):
    return {"op": "pooler", "impl": "spark", "variant": f"run (PDL; engine {engine})", "mode": "graph", "tp": tp,
            "m": b, "n": 4096, "k": 8192, "us": us, "floor_us": 1.0}


def trigger(when, tp, b, us):
    return {"op": "pooler", "impl": "spark", "variant": f"run (PDL; the consumer launching the next kernel {when})",
            "mode": "graph", "tp": tp, "m": b, "n": 4096, "k": 8192, "us": us, "floor_us": 1.0}


def times_engines(entry):
    _, rows, others = entry
    return [r[1] for r in rows + others]


def write(records):
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    noise = [dict(gemm("-", 1, 1, "graph", 0.1), impl="cublas"),
             {"op": "pooler", "impl": "spark", "variant": "run (PDL; publish route of the table)", "mode": "graph",
              "tp": 1, "m": 9, "n": 4096, "k": 8192, "us": 0.1, "floor_us": 1.0}]
    json.dump({"records": records + noise}, f)
    f.close()
    return f.name


MMA, RING = "splitk_mma", "ring_mma"
SKINNY = "skinny(block_size=512, outputs_per_block=4, k_unroll=2)"
SKINNY2 = "skinny(block_size=512, outputs_per_block=2, k_unroll=2)"


class RankPooler(unittest.TestCase):
    def rank(self, records):
        path = write(records)
        try:
            times, table = rank_pooler.load(path)
            out = io.StringIO()
            with redirect_stdout(out):
                rank_pooler.main([path])
            return rank_pooler.rank(times), table, out.getvalue()
        finally:
            os.unlink(path)

    def test_pooler_run_can_overturn_the_gemm_alone(self):
        # b 9: the ring is 1.0 faster with PDL off and 0.1 slower in the chain
        # (GEMM alone: ring by 0.9) but Pooler.run on it is 1.2 slower: the MMA
        # engine wins by 0.3. b 12: no Pooler.run for the MMA engine, so both
        # rank by the GEMM's two modes (the ring).
        ranked, table, text = self.rank([
            gemm("table=" + RING, 1, 9, "graph", 18.0), gemm(RING, 1, 9, "graph", 19.0),
            gemm(RING, 1, 9, "pdl_chain", 17.3), gemm(MMA, 1, 9, "graph", 20.0), gemm(MMA, 1, 9, "pdl_chain", 17.2),
            run(RING, 1, 9, 23.4), run(MMA, 1, 9, 22.2),
            gemm(RING, 1, 12, "graph", 19.2), gemm(RING, 1, 12, "pdl_chain", 17.0), gemm(MMA, 1, 12, "graph", 20.3),
            gemm(MMA, 1, 12, "pdl_chain", 17.2), run(RING, 1, 12, 22.5),
            gemm(RING, 2, 1, "graph", 11.5),  # no chain time: left out, and with it (2, 1)
            # b 1: the table's skinny GEMM has no records of its own; its table
            # records (and Pooler.run's table figure) stand for it.
            gemm("table=" + SKINNY, 1, 1, "graph", 16.8), gemm("table=" + SKINNY, 1, 1, "pdl_chain", 16.0),
            {"op": "pooler", "impl": "spark", "variant": "run (PDL; publish route of the table)", "mode": "graph",
             "tp": 1, "m": 1, "n": 4096, "k": 8192, "us": 19.6, "floor_us": 1.0},
            gemm(MMA, 1, 1, "graph", 18.0), gemm(MMA, 1, 1, "pdl_chain", 15.5), run(MMA, 1, 1, 18.8),
            # b 1 also has another skinny shape, fastest by the GEMM's two modes
            # (32.0) but without Pooler.run: listed, not ranked.
            gemm(SKINNY2, 1, 1, "graph", 16.5), gemm(SKINNY2, 1, 1, "pdl_chain", 15.5),
            trigger("at its start", 1, 9, 21.6), trigger("once its data arrived", 1, 9, 20.5),
            trigger("at its start", 1, 1, 19.1), trigger("once its data arrived", 1, 1, 19.7),
        ])
        with_run, rows, others = ranked[(1, 9)]
        self.assertTrue(with_run)
        self.assertEqual(others, [])
        self.assertEqual([r[1] for r in rows], [MMA, RING])
        self.assertAlmostEqual(rows[0][0], 20.0 + 17.2 + 22.2)
        with_run, rows, others = ranked[(1, 12)]
        self.assertFalse(with_run)
        self.assertEqual(others, [])
        self.assertEqual(rows[0][1], RING)
        self.assertIsNone(rows[0][4])
        self.assertAlmostEqual(rows[0][0], 19.2 + 17.0)
        self.assertNotIn((2, 1), ranked)
        self.assertEqual(table, {(1, 9): RING, (1, 1): SKINNY})
        with_run, rows, others = ranked[(1, 1)]
        self.assertTrue(with_run)
        self.assertEqual([r[1] for r in rows], [MMA, SKINNY])
        self.assertAlmostEqual(rows[1][0], 16.8 + 16.0 + 19.6)
        self.assertEqual([(o[1], o[0]) for o in others], [(SKINNY2, 32.0)])
        self.assertIn(f"tp 1 b 1: GEMM off + chain + Pooler.run, us  table has {SKINNY}", text)
        self.assertIn("not ranked (no Pooler.run)", text)
        # b 9: the table's records do not replace the ring's own.
        self.assertAlmostEqual(ranked[(1, 9)][1][1][2], 19.0)
        self.assertIn(f"tp 1 b 9: GEMM off + chain + Pooler.run, us  table has {RING}", text)
        self.assertIn("tp 1 b 12: GEMM off + chain (Pooler.run for fewer than two engines)", text)
        # The trigger rows: not engines, listed last, the faster first.
        self.assertNotIn("the consumer launching", " ".join(e for k in ranked for e in times_engines(ranked[k])))
        self.assertIn("tp 1 b 9: once its data arrived  20.50, at its start  21.60", text)
        self.assertIn("tp 1 b 1: at its start  19.10, once its data arrived  19.70", text)


    def test_check_ranks_one_engine_per_shape_against_the_table(self):
        # tp 2: skinny wins b = 1 by 1.0, splitk_mma wins b = 4 by 3.0: one
        # engine per shape, by the sum: splitk_mma (the table's: agrees). tp 4:
        # skinny wins both: the table's engine disagrees. The trigger at
        # tp 1 b = 9: the late point is faster (the table's: agrees).
        records = [
            gemm("splitk_mma", 2, 1, "graph", 10.0), gemm("splitk_mma", 2, 1, "pdl_chain", 8.0),
            gemm(SKINNY, 2, 1, "graph", 9.0), gemm(SKINNY, 2, 1, "pdl_chain", 8.0),
            gemm("splitk_mma", 2, 4, "graph", 10.0), gemm("splitk_mma", 2, 4, "pdl_chain", 8.0),
            gemm(SKINNY, 2, 4, "graph", 12.0), gemm(SKINNY, 2, 4, "pdl_chain", 9.0),
            gemm("splitk_mma", 4, 1, "graph", 7.0), gemm("splitk_mma", 4, 1, "pdl_chain", 5.0),
            gemm(SKINNY, 4, 1, "graph", 6.0), gemm(SKINNY, 4, 1, "pdl_chain", 4.0),
            trigger("at its start", 1, 9, 21.6), trigger("once its data arrived", 1, 9, 20.5),
        ]
        path = write(records)
        try:
            out = io.StringIO()
            with redirect_stdout(out):
                rc = rank_pooler.main([path, "--check"])
            text = out.getvalue()
        finally:
            os.unlink(path)
        self.assertEqual(rc, 1)
        self.assertIn("check: tp 2, every b measured: splitk_mma 36.00, " + SKINNY + " 38.00", text)
        self.assertNotIn("check: tp 2: the table has", text)
        tp4 = plan_table.row_of(plan_table.read(), "pooler", 4, 1)["engine"]  # the table's, not skinny
        self.assertIn(f"check: tp 4: the table has {tp4}, this run ranks skinny first", text)
        self.assertNotIn("check: tp 1 b 9", text)
        self.assertIn("check: 1 of the table's pooler rows disagree", text)


if __name__ == "__main__":
    unittest.main()
