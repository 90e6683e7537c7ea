#!/usr/bin/env python3
"""Project the decode step's saving at tp 4 and tp 8 from one GPU's figures.
PROJECTED, not measured: no machine with four or eight GPUs has run the step.

    tools/project_step.py STEP_TP1_JSON --unpooler UNPOOLER_JSON --pooler POOLER_JSON
                          [--gather GATHER_TP2_JSON] [--tp 4,8] [--markdown]

The method, per layer and batch size b (every figure in microseconds):
  measured at tp 1 (`spark-decode step --tp 1`): the boundary per layer, ours
    B1 and stock S1;
  from the one-GPU shard benchmarks (`bench unpooler`, `bench pooler`): each
    GEMM at tp 1 and at tp T, ours in a PDL chain (as the step runs them),
    cuBLAS in a plain graph;
  the rest of a boundary at tp 1 (consumer, norm, quantize, launches) stays:
    ours(T)  = B1 - ours' GEMMs at tp 1 + ours' GEMMs at tp T + 2 mailbox exchanges
    stock(T) = S1 - cuBLAS at tp 1 + cuBLAS at tp T + 2 ncclAllGathers
  the exchanges (none at tp 1) at the tp 2 figures of `bench gather` (rows of
    P and of H), the only multi-GPU exchange measured: a lower bound at tp 4 and
    8 for both. Without --gather they are left out (both paths' exchanges
    omitted: the saving then counts the GEMMs alone).
The step saving = layers x (stock(T) - ours(T)); per token / b; per million
tokens the same figure in seconds (per tensor-parallel group; x T GPU-seconds).
"""
import argparse
import json
import sys


def records(path):
    with open(path) as f:
        return json.load(f)["records"]


def pick(recs, op, impl, tp, m, mode, variant_prefix=None, n=None):
    """The record's us at the nearest available m (and whether m was there)."""
    cands = [r for r in recs if r["op"] == op and r["impl"] == impl and r["tp"] == tp and r["mode"] == mode
             and (variant_prefix is None or r.get("variant", "").startswith(variant_prefix))
             and (n is None or r["n"] == n)]
    if not cands:
        return None, False
    best = min(cands, key=lambda r: (abs(r["m"] - m), r["m"]))
    return best["us"], best["m"] == m


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", help="step_tp1.json")
    p.add_argument("--unpooler", required=True, help="bench unpooler's unpooler.json (one GPU, every tp)")
    p.add_argument("--pooler", required=True, help="bench pooler's pooler.json (the GEMM sweep, every tp)")
    p.add_argument("--gather", help="bench gather's gather_tp2.json (two GPUs)")
    p.add_argument("--tp", default="4,8")
    p.add_argument("--markdown", action="store_true", help="a markdown table")
    a = p.parse_args()
    with open(a.step) as f:
        step = json.load(f)
    if step["tp"] != 1 or not step.get("timed"):
        sys.exit("the projection starts from a timed step at tp 1")
    unp, pool = records(a.unpooler), records(a.pooler)
    gat = records(a.gather) if a.gather else []
    layers, H, P = step["layers"], 8192, 4096
    rows, notes = [], set()

    def need(value, what):
        if value[0] is None:
            sys.exit(f"no record for {what}")
        if not value[1]:
            notes.add(f"{what}: the nearest b measured")
        return value[0]

    for tp in [int(t) for t in a.tp.split(",")]:
        for b in step["batches"]:
            m = b["b"]
            ours_g = lambda t: (need(pick(unp, "unpooler", "spark", t, m, "pdl_chain"), f"unpooler ours tp {t}") +
                                need(pick(pool, "pooler_gemm", "spark", t, m, "pdl_chain", "table="),
                                     f"pooler GEMM ours tp {t}"))
            blas_g = lambda t: (need(pick(unp, "unpooler", "cublas", t, m, "graph"), f"unpooler cuBLAS tp {t}") +
                                need(pick(pool, "pooler_gemm", "cublas", t, m, "graph"), f"pooler cuBLAS tp {t}"))
            x_ours = x_stock = 0.0
            if gat:
                for n in (P, H):
                    x_ours += need(pick(gat, "gather", "spark", 2, m, "graph", n=n), f"mailbox exchange n={n}")
                    x_stock += need(pick(gat, "gather", "nccl", 2, m, "graph", n=n), f"ncclAllGather n={n}")
            ours = b["fast_boundary_us_per_layer"] - ours_g(1) + ours_g(tp) + x_ours
            stock = b["stock_boundary_us_per_layer"] - blas_g(1) + blas_g(tp) + x_stock
            saving = layers * (stock - ours)
            rows.append((tp, m, ours, stock, stock / ours, saving, saving / m))
    hdr = ("tp", "b", "ours us/layer", "stock us/layer", "boundaries x", "saving us/step", "saving us/token = s per 1M tokens")
    if a.markdown:
        print("PROJECTED (not measured) from " + a.step + (", exchanges at the tp 2 figures" if gat else
                                                           ", exchanges left out") + ":\n")
        print("| " + " | ".join(hdr) + " |")
        print("|" + " --- |" * len(hdr))
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.2f} | {r[4]:.2f}x | {r[5]:.0f} | {r[6]:.2f} |")
    else:
        print("PROJECTED (not measured); exchanges " + ("at the tp 2 figures" if gat else "left out"))
        for r in rows:
            print(f"  tp {r[0]} b {r[1]:2d}: ours {r[2]:6.2f} us/layer, stock {r[3]:6.2f} -> {r[4]:.2f}x; "
                  f"saving {r[5]:7.0f} us per step, {r[6]:6.2f} us per token (= s per 1M tokens)")
    for n in sorted(notes):
        print(("- " if a.markdown else "  note: ") + n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
