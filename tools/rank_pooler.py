#!/usr/bin/env python3
"""Ranks the pooler GEMM's engines per (tp, b) from one `bench pooler` run, the
way its engine table (src/pooler_gemm_table.cpp) is chosen.

The engines sum in different orders and PDL on must give the same bits as off,
so one engine serves a batch size in every mode. It is the one with the lowest
sum of three times from the same run: the GEMM alone with PDL off (mode graph),
the GEMM in a PDL chain (mode pdl_chain), and Pooler.run with every layer's
GEMM on that engine (`--run-engines`; a PDL chain through the whole boundary).
Where at least two engines of a (tp, b) have all three times, those rank by
the three and the engines without a Pooler.run time (the skinny GEMM's other
launch shapes in a full sweep) are listed after them, unranked; otherwise the
(tp, b) ranks by the GEMM's two modes alone and says so.

The same run times Pooler.run on the table's engines with the fused
consumer's trigger forced each way (where it lets the next kernel launch:
at its start, or once its data has arrived); they are listed last, the faster
first, for the plan table's consumer launch points.

  spark-decode bench pooler --run-engines splitk_mma,ring_mma ...
  tools/rank_pooler.py bench/results/nvidia-h200/pooler.json [--tp 1] [--check [TABLE]]

--check compares the ranking with the plan table (default src/tuning/h200.inc):
per tp the engine with the lowest sum over every b measured (one engine
serves a shape: one reduction order), and per (tp, b) the faster consumer
launch point; it exits 1 where the table differs.
"""
import argparse
import json
import re
import sys
from collections import defaultdict

import plan_table

RUN_ENGINE = re.compile(r"^run \(PDL; engine (.+)\)$")
TRIGGER = re.compile(r"^run \(PDL; the consumer launching the next kernel (at its start|once its data arrived)\)$")


def load(path):
    """({(tp, b): {engine: {"graph": us, "pdl_chain": us, "run": us}}},
    {(tp, b): the table's engine}) of the spark records."""
    times = defaultdict(lambda: defaultdict(dict))
    table, table_times, table_run = {}, defaultdict(dict), {}
    with open(path) as f:
        records = json.load(f)["records"]
    for r in records:
        if r["impl"] != "spark":
            continue
        key = (r["tp"], r["m"])
        variant = r.get("variant", "")
        if r["op"] == "pooler_gemm":
            if variant.startswith("table="):
                table[key] = variant[len("table="):]
                table_times[key][r["mode"]] = r["us"]
            else:
                times[key][variant][r["mode"]] = r["us"]
        elif r["op"] == "pooler":
            found = RUN_ENGINE.match(variant)
            if found:
                times[key][found.group(1)]["run"] = r["us"]
            elif variant.startswith("run (PDL; publish route of the table)"):
                table_run[key] = r["us"]
    # The table's own records time its engine where the run has none of that
    # engine's own (the sweep named fewer engines than the table uses).
    for key, engine in table.items():
        for mode, us in table_times[key].items():
            times[key][engine].setdefault(mode, us)
        if key in table_run and engine in times[key]:
            times[key][engine].setdefault("run", table_run[key])
    return times, table


def load_triggers(path):
    """{(tp, b): {"at its start": us, "once its data arrived": us}} of
    Pooler.run with the consumer's trigger forced."""
    out = defaultdict(dict)
    with open(path) as f:
        for r in json.load(f)["records"]:
            found = TRIGGER.match(r.get("variant", "")) if r["op"] == "pooler" and r["impl"] == "spark" else None
            if found:
                out[(r["tp"], r["m"])][found.group(1)] = r["us"]
    return out


def rank(times):
    """{(tp, b): (with_run, [(sum, engine, graph, pdl_chain, run or None)] best
    first, [the same for engines left unranked, by their two-mode sum])};
    engines missing a GEMM mode are left out."""
    ranked = {}
    for key in sorted(times):
        engines = {e: t for e, t in times[key].items() if "graph" in t and "pdl_chain" in t}
        if not engines:
            continue
        with_run = sum("run" in t for t in engines.values()) >= 2
        rows, others = [], []
        for e, t in engines.items():
            two = t["graph"] + t["pdl_chain"]
            if not with_run:
                rows.append((two, e, t["graph"], t["pdl_chain"], None))
            elif "run" in t:
                rows.append((two + t["run"], e, t["graph"], t["pdl_chain"], t["run"]))
            else:
                others.append((two, e, t["graph"], t["pdl_chain"], None))
        ranked[key] = (with_run, sorted(rows), sorted(others))
    return ranked


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="a `bench pooler` JSON with several engines (--engines, --run-engines)")
    ap.add_argument("--tp", type=int, help="only this tp")
    ap.add_argument("--check", nargs="?", const=plan_table.DEFAULT, metavar="TABLE",
                    help="compare with the plan table (default src/tuning/h200.inc)")
    args = ap.parse_args(argv)
    times, table = load(args.json)
    for (tp, b), (with_run, rows, others) in rank(times).items():
        if args.tp and tp != args.tp:
            continue
        what = "GEMM off + chain + Pooler.run" if with_run else "GEMM off + chain (Pooler.run for fewer than two engines)"
        chosen = table.get((tp, b))
        verdict = "" if chosen is None else ("  table agrees" if chosen == rows[0][1] else f"  table has {chosen}")
        print(f"tp {tp} b {b}: {what}, us{verdict}")
        for total, e, off, chain, run in rows:
            parts = f"{off:6.2f} + {chain:6.2f}" + (f" + {run:6.2f}" if run is not None else "")
            print(f"  {total:7.2f} = {parts}  {e}")
        if others:
            print("  not ranked (no Pooler.run), GEMM off + chain:")
        for total, e, off, chain, _ in others:
            print(f"  {total:7.2f} = {off:6.2f} + {chain:6.2f}  {e}")
    triggers = {k: v for k, v in sorted(load_triggers(args.json).items()) if not args.tp or k[0] == args.tp}
    if triggers:
        print("the fused consumer lets the next kernel launch (Pooler.run on the table's engines, us, faster first):")
    for (tp, b), t in triggers.items():
        print(f"tp {tp} b {b}: " + ", ".join(f"{name} {us:6.2f}" for name, us in sorted(t.items(), key=lambda x: x[1])))
    if args.check:
        return check(args.check, rank(times), triggers, args.tp)
    return 0


def rank_shapes(ranked):
    """{tp: [(sum over b, engine)] best first}: one engine serves every b of a
    shape (one reduction order), so engines rank by their figures summed over
    the b measured, among those ranked at every one of them."""
    by_tp = defaultdict(dict)
    for (tp, b), (_, rows, _) in ranked.items():
        by_tp[tp][b] = {e: total for total, e, *_ in rows}
    out = {}
    for tp, per_b in by_tp.items():
        common = set.intersection(*(set(t) for t in per_b.values()))
        out[tp] = sorted((sum(t[e] for t in per_b.values()), e) for e in common)
    return out


def check(path, ranked, triggers, only_tp=None):
    """Prints where the plan table disagrees with this run; 1 if anywhere."""
    rows = plan_table.read(path)
    differ = 0
    for tp, engines in sorted(rank_shapes(ranked).items()):
        row = plan_table.row_of(rows, "pooler", tp, 1)
        if (only_tp and tp != only_tp) or row is None or not engines:
            continue
        best = plan_table.engine_of(engines[0][1])
        print(f"check: tp {tp}, every b measured: " + ", ".join(f"{e} {t:.2f}" for t, e in engines))
        if best != row["engine"]:
            differ += 1
            print(f"check: tp {tp}: the table has {row['engine']}, this run ranks {best} first")
    for (tp, b), t in triggers.items():
        row = plan_table.row_of(rows, "pooler", tp, b)
        if row is None or len(t) < 2:
            continue
        faster = "early" if min(t, key=t.get) == "at its start" else "late"
        if faster != row["consumer"]:
            differ += 1
            print(f"check: tp {tp} b {b}: the table's consumer launches {row['consumer']}, this run is faster {faster}")
    print(f"check: {differ} of the table's pooler rows disagree with this run ({path})")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
