#!/usr/bin/env python3
"""Ranks unpooler tactics from a `tune unpooler` run with PDL off and one with
`--pdl` (two JSON files of bench/results), and optionally one with
`--after-stream`, the way the tactic table is chosen.

A tactic's S, kw and accs fix the bits, so one row of the table serves every
mode; its row tiling and load order change only the schedule, and one choice
per m serves every mode too. So, per tactic (everything but the row tiling)
and per m, the row tiling with the lowest sum of the modes' times is taken,
and tactics rank by the sum of the modes' means over m. (Picking the best row
tiling of each mode separately, as `tune` prints, can rank a tactic by a
combination no table row can hold.)

  tools/rank_tune.py OFF.json PDL.json [--after AFTER.json] [--top 6] [--n N] [--m 9,16] [--check [TABLE]]

--m ranks over those m only: the on-chip engine's rows of one shape may each
take their own S, copy stages and cluster policy (the order of the sum is the
shape's), so its tile-8 and tile-16 rows are ranked apart (--m 1,8, --m 9,16).

--check compares each model shape's best tactic (S, kw, accs, the cluster
policy and row swizzle) with its rows in the plan table (default
src/tuning/h200.inc), and exits 1 where one differs.
"""
import argparse
import json
import re
import sys
from collections import defaultdict

import plan_table

ROWS = re.compile(r" rows(\d+)_at_m=\S+")


def load(path, ms=None):
    """{(n, k): {tactic: {(m, row_tiles): us}}} of the spark records (of the m
    in `ms` where given)."""
    out = defaultdict(lambda: defaultdict(dict))
    with open(path) as f:
        records = json.load(f)["records"]
    for r in records:
        if r["impl"] != "spark" or (ms and r["m"] not in ms):
            continue
        found = ROWS.search(r["variant"])
        rows = int(found.group(1)) // 16 if found else 1
        tactic = ROWS.sub("", r["variant"])
        out[(r["n"], r["k"])][tactic][(r["m"], rows)] = r["us"]
    return out


def rank(*modes):
    """{(n, k): [(sum, (mean per mode), tactic, [(m, rows, (us per mode))])]} best
    first, for the modes' loaded files in order (PDL off, PDL chain[, after the
    stand-in]); tactics missing a mode, or an m in one, are left out."""
    first, rest = modes[0], modes[1:]
    ranked = {}
    for shape in sorted(first, reverse=True):
        rows_out = []
        for tactic, a in first[shape].items():
            others = [mode.get(shape, {}).get(tactic) for mode in rest]
            if not all(others):
                continue
            every = (a, *others)
            ms = sorted({m for m, _ in a})
            per_m = []
            for m in ms:
                tilings = [r for mm, r in a if mm == m and all((m, r) in o for o in others)]
                if not tilings:
                    break
                r = min(tilings, key=lambda r: sum(o[(m, r)] for o in every))
                per_m.append((m, r, tuple(o[(m, r)] for o in every)))
            if len(per_m) != len(ms) or not ms:
                continue
            means = tuple(sum(p[2][i] for p in per_m) / len(per_m) for i in range(len(every)))
            rows_out.append((sum(means), means, tactic, per_m))
        ranked[shape] = sorted(rows_out, key=lambda t: t[0])
    return ranked


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("off", help="tune JSON with PDL off (mode graph)")
    ap.add_argument("pdl", help="tune JSON of the same tactics with --pdl (mode pdl_chain)")
    ap.add_argument("--after", help="tune JSON of the same tactics with --after-stream (mode after_stream)")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--n", type=int, help="only this N")
    ap.add_argument("--m", type=lambda v: {int(m) for m in v.split(",")}, help="only these m (comma-separated)")
    ap.add_argument("--check", nargs="?", const=plan_table.DEFAULT, metavar="TABLE",
                    help="compare with the plan table (default src/tuning/h200.inc)")
    args = ap.parse_args(argv)
    files = [args.off, args.pdl] + ([args.after] if args.after else [])
    names = ["PDL off", "PDL chain", "after the stand-in"][: len(files)]
    ranked = rank(*(load(f, args.m) for f in files))
    for (n, k), rows in ranked.items():
        if args.n and n != args.n:
            continue
        print(f"N={n} K={k}: sum of means ({' + '.join(names)}), us; per m: {' / '.join(names)} (row tiles)")
        for total, means, tactic, per_m in rows[: args.top]:
            cells = " ".join(f"{m}:{'/'.join(f'{u:.2f}' for u in us)}(r{r})" for m, r, us in per_m)
            print(f"  {total:6.2f} = {' + '.join(f'{u:5.2f}' for u in means)}  {tactic}  |  {cells}")
    return check(args.check, ranked) if args.check else 0


TACTIC = re.compile(r"S=(\d+) kw=(\d+) accs=(\d+)")


def check(path, ranked):
    """Prints where the plan table's split-K rows disagree with the ranking; 1 if anywhere."""
    rows = plan_table.read(path)
    differ = 0
    for (n, k), tactics in ranked.items():
        where = plan_table.op_tp_of_shape(n, k)
        if where is None or not tactics:
            continue
        op, tp = where
        best = tactics[0][2]
        s, kw, accs = (int(v) for v in TACTIC.search(best).groups())
        want = (s, kw, accs, "cluster_balance" in best and s > 1, "unswizzled" not in best)
        for r in rows:
            if r["op"] != op or r["tp"] != tp:
                continue
            have = (r["splits"], r["kw"], r["accs"], r["cluster_balance"] and r["splits"] > 1, r["row_swizzle"])
            if have != want:
                differ += 1
                print(f"check: {op} tp {tp} b {r['b_first']}..{r['b_last']}: the table has S={have[0]} kw={have[1]} "
                      f"accs={have[2]}, this run ranks {best} first")
    print(f"check: {differ} of the table's split-K rows disagree with this run ({path})")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
