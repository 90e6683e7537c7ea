#!/usr/bin/env python3
"""Plot `spark-decode step` records: the boundary time per layer, ours against
the stock path, and the step time, per batch size b (one line per record, so
records of several tp can share the figure).

    tools/plot_step.py step_tp1.json [step_tp2.json ...] [-o step.png]

Needs matplotlib; the tool runs this script where Python has it.
"""
import argparse
import json
import sys


def load(path):
    with open(path) as f:
        record = json.load(f)
    batches = [b for b in record["batches"] if "fast_step_us" in b]
    return record, batches


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="+", help="step_tp<tp>.json files")
    parser.add_argument("-o", "--out", help="the PNG (default: the first record's name with .png)")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    plotted = 0
    title = ""
    for path in args.records:
        record, batches = load(path)
        if not batches:
            print(f"{path}: nothing was timed (ranks sharing GPUs); skipped", file=sys.stderr)
            continue
        plotted += 1
        bs = [b["b"] for b in batches]
        tp = record["tp"]
        left.plot(bs, [b["fast_boundary_us_per_layer"] for b in batches], "o-", label=f"ours, tp {tp}")
        left.plot(bs, [b["stock_boundary_us_per_layer"] for b in batches], "s--", label=f"stock, tp {tp}")
        right.plot(bs, [b["fast_step_us"] / 1000 for b in batches], "o-", label=f"ours, tp {tp}")
        right.plot(bs, [b["stock_step_us"] / 1000 for b in batches], "s--", label=f"stock, tp {tp}")
        for b in batches:
            left.annotate(f'{b["boundary_speedup"]:.2f}x', (b["b"], b["fast_boundary_us_per_layer"]),
                          textcoords="offset points", xytext=(0, -14), ha="center", fontsize=8)
        title = f'{record["gpu"]}, {record["date"]}, commit {record["commit"]}, {record["layers"]} layers'
    if not plotted:
        print("no timed record: no plot", file=sys.stderr)
        return 1
    left.set_title("MoE boundaries, per layer")
    left.set_ylabel("us per layer ((step - stand-ins) / layers)")
    right.set_title("whole decode step (stand-ins included)")
    right.set_ylabel("ms per step")
    for ax in (left, right):
        ax.set_xlabel("b (decode tokens per step)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out = args.out or args.records[0].rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=120)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
