#!/usr/bin/env python3
"""Ranks unpooler tactics from a `tune unpooler` run with PDL off and one with
`--pdl` (two JSON files of bench/results), the way the tactic table is chosen.

A tactic's S, kw and accs fix the bits, so one row of the table serves both
modes; its row tiling and load order change only the schedule, and one choice
per m serves both modes too. So, per tactic (everything but the row tiling)
and per m, the row tiling with the lowest sum of the two modes' times is
taken, and tactics rank by the sum of the two modes' means over m. (Picking
the best row tiling of each mode separately, as `tune` prints, can rank a
tactic by a combination no table row can hold.)

  tools/rank_tune.py OFF.json PDL.json [--top 6] [--n N]
"""
import argparse
import json
import re
import sys
from collections import defaultdict

ROWS = re.compile(r" rows(\d+)_at_m=\S+")


def load(path):
    """{(n, k): {tactic: {(m, row_tiles): us}}} of the spark records."""
    out = defaultdict(lambda: defaultdict(dict))
    with open(path) as f:
        records = json.load(f)["records"]
    for r in records:
        if r["impl"] != "spark":
            continue
        found = ROWS.search(r["variant"])
        rows = int(found.group(1)) // 16 if found else 1
        tactic = ROWS.sub("", r["variant"])
        out[(r["n"], r["k"])][tactic][(r["m"], rows)] = r["us"]
    return out


def rank(off, pdl):
    """{(n, k): [(sum, mean_off, mean_pdl, tactic, [(m, rows, off, pdl)])]} best first;
    tactics measured in only one mode, or at an m in only one, are left out."""
    ranked = {}
    for shape in sorted(off, reverse=True):
        rows_out = []
        for tactic, a in off[shape].items():
            b = pdl.get(shape, {}).get(tactic)
            if not b:
                continue
            ms = sorted({m for m, _ in a})
            per_m = []
            for m in ms:
                both = [(a[(m, r)] + b[(m, r)], r) for mm, r in a if mm == m and (m, r) in b]
                if not both:
                    break
                _, r = min(both)
                per_m.append((m, r, a[(m, r)], b[(m, r)]))
            if len(per_m) != len(ms) or not ms:
                continue
            mo = sum(p[2] for p in per_m) / len(per_m)
            mp = sum(p[3] for p in per_m) / len(per_m)
            rows_out.append((mo + mp, mo, mp, tactic, per_m))
        ranked[shape] = sorted(rows_out, key=lambda t: t[0])
    return ranked


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("off", help="tune JSON with PDL off (mode graph)")
    ap.add_argument("pdl", help="tune JSON of the same tactics with --pdl (mode pdl_chain)")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--n", type=int, help="only this N")
    args = ap.parse_args(argv)
    for (n, k), rows in rank(load(args.off), load(args.pdl)).items():
        if args.n and n != args.n:
            continue
        print(f"N={n} K={k}: sum of means (PDL off + PDL chain), us; per m: off / chain (row tiles)")
        for total, mo, mp, tactic, per_m in rows[: args.top]:
            cells = " ".join(f"{m}:{o:.2f}/{p:.2f}(r{r})" for m, r, o, p in per_m)
            print(f"  {total:6.2f} = {mo:5.2f} + {mp:5.2f}  {tactic}  |  {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
