#!/usr/bin/env python3
"""Checks, in the machine code of the built library, what each kernel does
before its griddepcontrol.wait: the GEMMs stream weights there (the design's
rule: weights are loaded before griddepcontrol.wait, activations after;
docs/design.md, "Engines") and read nothing else; no
kernel touches mailbox memory or stage words there (no strong load, no store);
the on-chip engine, whose weights go to shared memory by bulk copies, does
nothing there but those copies and its mbarriers' setup (BULK_BEFORE_WAIT).
That the mailbox kernels use no local memory (NO_LOCAL_LOADS). And two
orders that a measured speed depends on: x loads ahead of the weight
copies (X_BEFORE_COPIES), and the fused consumer's two launch points
(LAUNCH_POINTS).

Why a machine-code check: the order in the source and the PTX is not the
order that runs. ptxas moved every `ld.global.nc` weight load of the GEMMs
below griddepcontrol.wait (SASS ACQBULK), so under programmatic dependent
launch no weight was in flight before the previous grid finished; coherent
loads stay where they are written.

Usage: check_sass.py OBJECT... (the library's object files). Needs cuobjdump
and nvdisasm (the CUDA toolkit's, or the PyPI wheels that tools/setup-deps.sh
puts in .deps/cuda-tools); exits 77 (skipped) without them.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What each kernel may do before its griddepcontrol.wait (mangled-name
# fragment -> (least loads before it, whether each of them must be a weight
# stream: `LDG.E.NA`, or `LDGSTS` where the kernel is listed in CP_ASYNC)). Every kernel listed must also not touch mailbox
# memory or stage words before it: no strong (volatile / relaxed.sys) load or
# store, and no store at all (mailbox_device.cuh, orderings 1, 5 and 6).
KERNELS = {
    # The GEMMs stream weights before the wait; x, written by the previous
    # grid, is read with plain loads, so any other load before it is a bug.
    "17splitk_mma_kernel": (2, True),
    "18skinny_gemm_kernel": (2, True),
    # The ring engine's weights go to shared memory by cp.async (LDGSTS).
    "15ring_mma_kernel": (2, True),
    # The on-chip engine loads nothing before the wait (BULK_BEFORE_WAIT).
    "17onchip_mma_kernel": (0, False),
    # The fused consumer reads its norm weight (a parameter) before the wait
    # (and its swizzled variant's pad CTAs store zeros off the wait's path:
    # ZERO_STORES_OFF_THE_WAIT).
    "18gather_norm_kernel": (2, False),
    # The mailbox's own kernels read nothing before it.
    "22mailbox_publish_kernel": (0, False),
    "21mailbox_gather_kernel": (0, False),
}


# Kernels that may store zeros before griddepcontrol.wait on a path that
# exits without waiting: the swizzled consumer's pad CTAs write the scales'
# zero padding while the grid before it (in Pooler::run the Pooler's own,
# which triggers only after its own wait) still runs, and return (design.md,
# "Outputs before the wait"). ptxas may lay that branch out ahead of the wait
# (sm_100a does), so the head is judged by control flow: a store on a path
# to the wait still fails, and so does one of anything but zeros (RZ).
ZERO_STORES_OFF_THE_WAIT = ("18gather_norm_kernel",)


# Kernels that may not load from local memory (LDL): taking the address of
# a kernel parameter (passing the mailbox view by reference to an out-of-line
# function) makes the compiler copy the whole parameter block to local memory
# at the kernel's start and read it back from there, which was measured
# slower on the consumer's critical path. (Stores to local memory remain for
# printf's arguments on the failure path.)
NO_LOCAL_LOADS = ("18gather_norm_kernel", "21mailbox_gather_kernel", "22mailbox_publish_kernel")


# Kernels whose NVFP4 block conversion must compile without a branch, from
# the block scale's conversion to E4M3 to the codes' store: sm_90a has no
# E2M1 instruction, and an early return per value in the software conversion
# (for NaN) compiled to a branch region per value, sixteen in a row, which
# was most of the quantizer's time (docs/perf/consumer.md, "The quantizer's
# machine code"). gather_norm_kernel<1>, <2>: the consumer's NVFP4 formats.
BRANCH_FREE_QUANTIZER = ("18gather_norm_kernelILi1E", "18gather_norm_kernelILi2E", "21nvfp4_quantize_kernel")


def quantizer_branches(code):
    """The branches between the first E4M3 conversion (F2FP.SATFINITE.E4M3)
    and the next global store, or None where there is no such conversion."""
    start = next((i for i, ins in enumerate(code) if re.search(r"\bF2FP\.SATFINITE\.E4M3\b", ins)), None)
    if start is None:
        return None
    branches = []
    for ins in code[start:]:
        if opcode(ins) == "STG":
            break
        if opcode(ins) in ("BRA", "BSSY"):
            branches.append(ins)
    return branches


# Kernels whose weight streams are cp.async copies into shared memory
# (LDGSTS): only there does an LDGSTS before the wait count as a weight load.
CP_ASYNC = ("15ring_mma_kernel",)


# Kernels whose x loads after the wait (plain LDG) must reach the memory
# system ahead of the weight copies (LDGSTS) of the same cp.async group (on
# sm_90a, where it was measured): the
# ring engine at its 8-token tile loads x three stages ahead, and that paid
# (docs/perf/pooler_gemm.md, "The ring's x loads") only where ptxas put the
# loads before the copies; a rewrite of the same source that it scheduled
# behind them was slower than loading x one stage ahead. (The prefix names
# the 8-token tile: ring_mma_kernel<8>.)
X_BEFORE_COPIES = ("15ring_mma_kernelILi8E",)


def x_after_copies(code, wait):
    """Where the x loads (plain LDG) after the wait are not all ahead of the
    weight copies (LDGSTS) of their cp.async group (a group ends at its
    LDGDEPBAR): the first group with copies and an x load after its first
    copy, or none before it, or x loads after the last group (a stage's x
    moved past its own commit); None where every group is in order."""
    def is_x(ins):
        return re.search(r"\bLDG\.", ins) and ".STRONG" not in ins and ".NA" not in ins
    group = []
    for ins in code[wait + 1:]:
        if re.search(r"\bLDGDEPBAR\b", ins):
            copies = [i for i, g in enumerate(group) if "LDGSTS" in g]
            xs = [i for i, g in enumerate(group) if is_x(g)]
            if copies and (not xs or xs[-1] > copies[0]):
                return group
            group = []
        else:
            group.append(ins)
    return group if any(is_x(g) for g in group) else None


# Kernels whose whole weight slice goes to shared memory by bulk copies
# (cp.async.bulk, SASS UBLKCP) before griddepcontrol.wait, with at least this
# many copies there (one stage: 16 rows): before the wait they may do only
# that, the mbarriers' setup (SYNCS.EXCH init, SYNCS.ARRIVE expect_tx, the
# init fence), block and cluster barriers and arithmetic. No load from memory
# (x is the previous grid's; constants and a thread's own spills aside), no
# store (a spill aside), no wait on an mbarrier and no MMA: everything that
# uses the data comes after the wait, so that the copies are all the CTA
# issues while the previous grid drains (docs/perf/onchip.md).
BULK_BEFORE_WAIT = {"17onchip_mma_kernel": 16}

_LOADS = {"LDG", "LD", "LDS", "LDSM", "LDGSTS", "LDGDEPBAR"}
_STORES = {"STG", "ST", "STS", "STAS", "RED", "ATOM", "ATOMG", "ATOMS"}


# An instruction's guard predicate ("@!P0 ", "@UP1 ", "@PT ").
_GUARD = r"^@!?U?P[T0-9]+\s+"


def opcode(ins):
    """An instruction's opcode without its predicate and modifiers
    ("@!P0 LDG.E.128 R4, ..." -> "LDG")."""
    text = re.sub(_GUARD, "", ins.strip())
    return text.split()[0].split(".")[0] if text else ""


def bulk_head_violations(head, min_copies):
    """What the code before the wait (`head`) does beyond bulk copies and
    mbarrier setup: a list of reasons, empty where it keeps to them."""
    out = []
    copies = sum(1 for ins in head if opcode(ins) == "UBLKCP")
    if copies < min_copies:
        out.append(f"{copies} bulk copies (UBLKCP) before griddepcontrol.wait, want >= {min_copies}")
    for ins in head:
        op = opcode(ins)
        if op in _LOADS:
            out.append("a load before griddepcontrol.wait: " + ins)
        elif op in _STORES:
            out.append("a store before griddepcontrol.wait: " + ins)
        elif op == "SYNCS" and "PHASECHK" in ins:
            out.append("an mbarrier wait before griddepcontrol.wait: " + ins)
        elif op.startswith("HMMA"):
            out.append("an MMA before griddepcontrol.wait: " + ins)
    return out


# Kernels with two griddepcontrol.launch_dependents (SASS PREEXIT), chosen
# at run time: one before griddepcontrol.wait (the next grid launches at this
# one's start) and one after its first polling load, a strong 16-byte load
# (not the 4-byte stage word before it): once the data has arrived. Measured
# apart per Pooler layer (docs/perf/consumer.md); PREEXIT has no memory effect,
# so ptxas may move it, and this says if it did (a copy of the kernel without
# the first point fails here: checked by hand, 2026-12-02).
LAUNCH_POINTS = ("18gather_norm_kernel",)


def launch_points_missing(code, wait):
    """Which of the two launch points is missing: "before the wait", "after
    the polls" (after the first strong 16-byte load past the wait), or None
    where both are there."""
    if not any(re.search(r"\bPREEXIT\b", ins) for ins in code[:wait]):
        return "before the wait"
    poll = next((i for i in range(wait + 1, len(code)) if re.search(r"\bLDG\.\S*128\S*STRONG", code[i])), None)
    if poll is None or not any(re.search(r"\bPREEXIT\b", ins) for ins in code[poll + 1:]):
        return "after the polls"
    return None


def successors(code, labels, i):
    """The instructions control may reach from code[i]; None where it cannot
    be told (an indirect branch). A predicated BRA or EXIT may fall through;
    "BRA P4, ..." is conditional too."""
    ins = code[i].strip()
    op = opcode(ins)
    predicated = re.match(_GUARD, ins) is not None and not ins.startswith("@PT")
    nxt = [i + 1] if i + 1 < len(code) else []
    if op in ("BRX", "JMX", "RET", "JMP"):
        return None
    if op == "EXIT":
        return nxt if predicated else []
    if op == "BRA":
        m = re.search(r"`\((\.L_\w+)\)", ins)
        if not m or m.group(1) not in labels:
            return None
        conditional = predicated or re.match(r"^BRA(\.\S+)?\s+!?U?P[0-9]", re.sub(_GUARD, "", ins))
        return [labels[m.group(1)]] + (nxt if conditional else [])
    return nxt


def on_path_to(code, labels, target):
    """The indices of code[:target] that lie on some path from the entry to
    code[target] (control flow); every index where the flow cannot be told."""
    succ = {}
    for i in range(target):
        s = successors(code, labels, i)
        if s is None:
            return set(range(target))
        succ[i] = s
    # Forward from the entry, stopping at the wait (code past it, reached by
    # a branch around it, is not expanded), then back from the wait over the
    # instructions reached.
    reach, todo = {0}, [0]
    while todo:
        i = todo.pop()
        for j in succ.get(i, []):
            if j not in reach:
                reach.add(j)
                todo.append(j)
    preds = {}
    for i in reach:
        for j in succ.get(i, []):
            preds.setdefault(j, []).append(i)
    leads, todo = set(), [target]
    while todo:
        for i in preds.get(todo.pop(), []):
            if i not in leads:
                leads.add(i)
                todo.append(i)
    return leads


def head_stores(fn, code, labels, wait):
    """The stores before the wait that the kernel's rule forbids."""
    stores = [i for i in range(wait) if re.search(r"\b(STG|ST|RED|ATOMG)\.", code[i])]
    if not any(frag in fn for frag in ZERO_STORES_OFF_THE_WAIT):
        return [code[i] for i in stores]
    path = on_path_to(code, labels, wait)
    return [code[i] for i in stores if i in path or not re.search(r",\s*RZ$", code[i])]


def find_tool(name):
    for d in (os.environ.get("CUDA_TOOLS_BIN", ""), "/usr/local/cuda/bin",
              os.path.join(ROOT, ".deps/cuda-tools/nvidia/cu13/bin")):
        p = os.path.join(d, name)
        if d and os.access(p, os.X_OK):
            return p
    return shutil.which(name)


def functions(sass):
    """{mangled name: ([instruction text, ...], {label: index of the
    instruction it names})} of an nvdisasm listing."""
    out, name = {}, None
    for line in sass.splitlines():
        m = re.match(r"^\.text\.(\S+):", line)
        if m:
            name = m.group(1)
            out[name] = ([], {})
            continue
        if not name:
            continue
        code, labels = out[name]
        m = re.match(r"^(\.L_\w+):", line)
        if m:
            labels[m.group(1)] = len(code)
            continue
        m = re.match(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m:
            code.append(m.group(1))
    return out


def main(objects):
    cuobjdump, nvdisasm = find_tool("cuobjdump"), find_tool("nvdisasm")
    if not cuobjdump or not nvdisasm:
        print("skipped: cuobjdump and nvdisasm not found (tools/setup-deps.sh installs them into .deps/cuda-tools)")
        return 77
    failures, checked = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for obj in objects:
            # Host-only objects have no device code: cuobjdump says so and we go on.
            subprocess.run([cuobjdump, "-xelf", "all", os.path.abspath(obj)], cwd=tmp, check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for cubin in sorted(f for f in os.listdir(tmp) if f.endswith(".cubin")):
            sass = subprocess.run([nvdisasm, "-c", os.path.join(tmp, cubin)], check=True,
                                  capture_output=True, text=True).stdout
            for fn, (code, labels) in functions(sass).items():
                if any(frag in fn for frag in BRANCH_FREE_QUANTIZER):
                    checked += 1
                    branches = quantizer_branches(code)
                    if branches is None:
                        failures.append(f"{cubin} {fn}: no E4M3 block-scale conversion (F2FP.SATFINITE.E4M3)")
                    elif branches:
                        failures.append(f"{cubin} {fn}: {len(branches)} branches in the NVFP4 block conversion: "
                                        + branches[0])
                rule = next((r for frag, r in KERNELS.items() if frag in fn), None)
                if rule is None:
                    continue
                need, weights_only = rule
                checked += 1
                waits = [i for i, ins in enumerate(code) if re.search(r"\bACQBULK\b", ins)]
                if not waits:
                    failures.append(f"{cubin} {fn}: no griddepcontrol.wait (ACQBULK)")
                    continue
                head = code[:waits[0]]
                loads = [ins for ins in head if re.search(r"\bLDG(STS)?\.", ins)]
                stores = head_stores(fn, code, labels, waits[0])
                if len(loads) < need:
                    failures.append(f"{cubin} {fn}: {len(loads)} loads before griddepcontrol.wait, want >= {need}")
                # Weight streams: LDG.E.NA (ld_stream_v4), or LDGSTS
                # (cp_async_stream_16) in the kernels that stage weights.
                staged = any(frag in fn for frag in CP_ASYNC)
                others = [ins for ins in loads if ".NA" not in ins and not (staged and "LDGSTS" in ins)]
                if weights_only and others:
                    failures.append(f"{cubin} {fn}: a non-weight load before griddepcontrol.wait: " + others[0])
                if any(".STRONG" in ins for ins in loads):
                    failures.append(f"{cubin} {fn}: a mailbox/state load before griddepcontrol.wait: "
                                    + next(ins for ins in loads if ".STRONG" in ins))
                if stores:
                    failures.append(f"{cubin} {fn}: a store before griddepcontrol.wait: {stores[0]}")
                bulk = next((n for frag, n in BULK_BEFORE_WAIT.items() if frag in fn), None)
                if bulk is not None:
                    failures.extend(f"{cubin} {fn}: {why}" for why in bulk_head_violations(head, bulk))
                # (sm_90a only: the order was measured there, not on sm_100a.)
                if (any(frag in fn for frag in X_BEFORE_COPIES) and "sm_90" in cubin
                        and x_after_copies(code, waits[0]) is not None):
                    failures.append(f"{cubin} {fn}: x loads scheduled behind the weight copies of a cp.async group")
                if any(frag in fn for frag in NO_LOCAL_LOADS):
                    local = [ins for ins in code if re.search(r"\bLDL\b", ins)]
                    if local:
                        failures.append(f"{cubin} {fn}: a local-memory load: {local[0]}")
                if any(frag in fn for frag in LAUNCH_POINTS):
                    missing = launch_points_missing(code, waits[0])
                    if missing:
                        failures.append(f"{cubin} {fn}: no launch_dependents (PREEXIT) {missing}")
    if checked == 0:
        print("FAILED: none of the checked kernels was found in " + " ".join(objects))
        return 1
    for f in failures:
        print("FAILED: " + f)
    print(f"{checked} kernel variants checked, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    # CTest hands $<TARGET_OBJECTS:...> over as one ;-separated argument.
    sys.exit(main([p for arg in sys.argv[1:] for p in arg.split(";") if p]))
