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
first, for pooler_consumer_launches_early's table.

  spark-decode bench pooler --engines table,mma,ring --run-engines mma,ring ...
  tools/rank_pooler.py bench/results/pooler_DATE.json [--tp 1]
"""
import argparse
import json
import re
import sys
from collections import defaultdict

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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
