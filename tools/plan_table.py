"""Reads a plan table (src/tuning/<machine>.inc: one C++ initializer per line)
for the tools that rank measurements (rank_tune.py, rank_pooler.py --check)."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "src", "tuning", "h200.inc")
FIELDS = ("op", "tp", "b_first", "b_last", "engine", "splits", "kw", "accs", "token_tile", "row_tiles",
          "cluster_balance", "row_swizzle", "onchip_splits", "onchip_stage_warps", "onchip_cluster_balance",
          "onchip_row_tiles", "publish", "consumer")
ROW = re.compile(r'^\{(.*),\s*"(.*)"\},\s*$')
H, P = 8192, 4096  # the model's shapes (spark_decode/model_shape.h)


def read(path=DEFAULT):
    """[row dict] in file order; ints and bools converted, `measured` kept."""
    rows = []
    with open(path) as f:
        for line in f:
            m = ROW.match(line.strip())
            if not m:
                continue
            values = [v.strip() for v in m.group(1).split(",")]
            if len(values) != len(FIELDS):
                raise ValueError(f"{path}: a row of {len(values)} fields, want {len(FIELDS)}: {line.strip()}")
            row = dict(zip(FIELDS, values))
            for k in ("tp", "b_first", "b_last", "splits", "kw", "accs", "token_tile", "row_tiles", "onchip_splits",
                      "onchip_stage_warps", "onchip_row_tiles"):
                row[k] = int(row[k])
            for k in ("cluster_balance", "row_swizzle", "onchip_cluster_balance"):
                row[k] = row[k] == "true"
            row["measured"] = m.group(2)
            rows.append(row)
    return rows


def row_of(rows, op, tp, b):
    return next((r for r in rows if r["op"] == op and r["tp"] == tp and r["b_first"] <= b <= r["b_last"]), None)


def op_tp_of_shape(n, k):
    """(op, tp) of a model shape [n, k], or None."""
    for tp in (1, 2, 4, 8):
        if k == P and n * tp == H:
            return "unpooler", tp
        if k == H and n * tp == P:
            return "pooler", tp
    return None


def engine_of(name):
    """The table's engine for a benchmark's engine name (PoolerGemmChoice::to_string)."""
    return "skinny" if name.startswith("skinny") else name
