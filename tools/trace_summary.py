#!/usr/bin/env python3
"""Summarise a per-CTA kernel timeline (spark_decode/trace.h; `spark-decode bench
pooler --trace PREFIX` on a -DSPARK_DECODE_TRACE=ON build).

For each launch (grid), in launch order: its kernel, CTAs, when its first and
last CTA started, when its griddepcontrol.wait returned (first / last CTA) and
when its first and last CTA ended, in microseconds from the first record. Then,
over the steady-state launches, the mean of each step of the chain:
  lag    = this grid's first wait return - the previous grid's last CTA end
           (what one kernel boundary costs under programmatic dependent launch)
  early  = how many of this grid's CTAs started before the previous grid ended
           (weights streaming during the boundary)
           (where an untraced kernel runs between two launches, as the
           experts' stand-in in bench unpooler's _after_ files, lag and early
           span it: read the per-CTA segments below instead)
  tail   = this grid's last end - its last wait return (its work after release)
  wait->markN = the last CTA's kernel-specific point N - the last wait return
           (consumers: mark0 = ACTIVE arrived, mark1 = the polled data arrived;
           the on-chip engine: spark_decode/trace.h)
  cta:start, cta:markN, cta:end = within each CTA, its entry, its point N
           (or its end) - its own wait return (negative: before it), averaged
           over the CTAs that record it
  r0:...   = the same over the on-chip engine's CTAs that record mark 1 (its
           cluster rank 0, which sums and stores)
  last:markN, last:end = the same for the CTA that ends last in its launch
Usage: trace_summary.py FILE.csv[.gz] [--skip N] [--show N]
"""
import argparse
import csv
import gzip
import math
import statistics
from collections import defaultdict

def marks(row):
    """The mark indices the file has columns for (spark_decode::trace::kMarks
    of the build that wrote it)."""
    return sorted(int(k[4:-3]) for k in row if k.startswith("mark") and k.endswith("_ns"))


def mark_ns(row, i):
    """Mark i's timestamp, 0 where the CTA did not record it (or the file
    predates it)."""
    return int(row.get(f"mark{i}_ns", 0) or 0)


def per_cta(rows):
    """Each CTA's points after its own wait return: {markN or end: [us]}, over
    the CTAs that record a wait (and that mark)."""
    out = defaultdict(list)
    for r in rows:
        waited = int(r["waited_ns"])
        if not waited:
            continue
        for i in marks(r):
            t = mark_ns(r, i)
            if t:
                out[f"mark{i}"].append((t - waited) / 1e3)
        out["start"].append((int(r["start_ns"]) - waited) / 1e3)
        out["end"].append((int(r["end_ns"]) - waited) / 1e3)
    return out


def timer_step(launches):
    """The largest step that every CTA's start and end stamp is a multiple of,
    from the earliest: the resolution %globaltimer showed in this trace
    (segments shorter than it are means of quantised differences; 0 if every
    stamp is the same)."""
    stamps = [int(r[k]) for l in launches for r in l["rows"] for k in ("start_ns", "end_ns")]
    t0 = min(stamps)
    return math.gcd(*(t - t0 for t in stamps))


def load(path):
    """Launches in start order, each with its CTAs' rows and the extremes of
    their timestamps."""
    grids = defaultdict(list)
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for row in csv.DictReader(f):
            grids[int(row["grid"])].append(row)
    launches = []
    for gid, rows in grids.items():
        start = [int(r["start_ns"]) for r in rows]
        end = [int(r["end_ns"]) for r in rows]
        waited = [int(r["waited_ns"]) for r in rows if int(r["waited_ns"])]
        stamps = [[mark_ns(r, i) for r in rows if mark_ns(r, i)] for i in marks(rows[0])]
        launches.append({
            "grid": gid, "kernel": rows[0]["kernel"], "ctas": len(rows),
            "starts": sorted(start), "first_start": min(start), "last_start": max(start),
            "first_wait": min(waited) if waited else None, "last_wait": max(waited) if waited else None,
            "first_end": min(end), "last_end": max(end),
            "last_mark": [max(m) if m else None for m in stamps],
            "rows": rows,
        })
    launches.sort(key=lambda l: (l["first_start"], l["grid"]))
    return launches


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--skip", type=int, default=4, help="launches to skip at the start (ramp)")
    ap.add_argument("--show", type=int, default=12, help="launches to print")
    a = ap.parse_args()
    ls = load(a.csv)
    t0 = ls[0]["first_start"]
    us = lambda t: (t - t0) / 1e3 if t is not None else float("nan")
    print(f"{len(ls)} launches; kernels: " + ", ".join(sorted({l['kernel'] for l in ls})) +
          f"; timer step {timer_step(ls)} ns")
    print(f"{'kernel':18s} {'ctas':>5s} {'start':>8s} {'last st':>8s} {'wait1':>8s} {'waitN':>8s} "
          f"{'end1':>8s} {'endN':>8s} {'lag':>6s} {'early':>5s}")
    stats = defaultdict(lambda: defaultdict(list))
    for i, l in enumerate(ls):
        lag = early = None
        if i > 0:
            prev_end = ls[i - 1]["last_end"]
            if l["first_wait"] is not None:
                lag = (l["first_wait"] - prev_end) / 1e3
            early = sum(1 for s in l["starts"] if s < prev_end)
        if a.skip <= i < a.skip + a.show:
            print(f"{l['kernel']:18s} {l['ctas']:5d} {us(l['first_start']):8.2f} {us(l['last_start']):8.2f} "
                  f"{us(l['first_wait']):8.2f} {us(l['last_wait']):8.2f} {us(l['first_end']):8.2f} "
                  f"{us(l['last_end']):8.2f} {lag if lag is not None else float('nan'):6.2f} "
                  f"{early if early is not None else 0:5d}")
        if i >= a.skip and i < len(ls) - 1:
            s = stats[l["kernel"]]
            if lag is not None:
                s["lag"].append(lag)
            s["early"].append(early or 0)
            s["span"].append((l["last_end"] - l["first_start"]) / 1e3)
            if l["last_wait"] is not None:
                s["tail"].append((l["last_end"] - l["last_wait"]) / 1e3)
                for m in range(len(l["last_mark"])):
                    if l["last_mark"][m] is not None:
                        s[f"wait->mark{m}"].append((l["last_mark"][m] - l["last_wait"]) / 1e3)
                for name, v in per_cta(l["rows"]).items():
                    s[f"cta:{name}"].append(statistics.mean(v))
                rank0 = [r for r in l["rows"] if r["kernel"] == "onchip_mma" and mark_ns(r, 1)]
                for name, v in per_cta(rank0).items():
                    s[f"r0:{name}"].append(statistics.mean(v))
                last = max(l["rows"], key=lambda r: int(r["end_ns"]))
                for name, v in per_cta([last]).items():
                    s[f"last:{name}"].append(v[0])
    per_call = (ls[-1]["last_end"] - ls[0]["first_start"]) / 1e3
    print(f"\nwhole trace: {per_call:.1f} us over {len(ls)} launches")
    for k, s in stats.items():
        parts = [f"{name} {statistics.mean(v):.2f}" for name, v in s.items() if v]
        print(f"  {k:18s} mean over {len(s['span'])}: " + ", ".join(parts) + " (us; early: CTAs)")


if __name__ == "__main__":
    main()
