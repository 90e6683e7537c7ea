#!/usr/bin/env python3
"""Checks, in the machine code of the built library, that the kernels which
must stream their weights before griddepcontrol.wait do so (SPEC §2.1:
"weights are loaded before griddepcontrol.wait"), and that nothing written by
an earlier grid is read before it.

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
# kernel (mangled-name fragment) -> least number of loads before the wait
KERNELS = {
    "15unpooler_kernel": 2,        # the first weight chunk
    "18skinny_gemm_kernel": 2,     # the first k_unroll x outputs_per_block vectors
    "24norm_quant_gather_kernel": 2,  # the norm weight (two vectors per thread)
}


def find_tool(name):
    for d in (os.environ.get("CUDA_TOOLS_BIN", ""), "/usr/local/cuda/bin",
              os.path.join(ROOT, ".deps/cuda-tools/nvidia/cu13/bin"),
              os.path.join(ROOT, ".deps/cuda-tools/nvidia/cuda_cuobjdump/bin"),
              os.path.join(ROOT, ".deps/cuda-tools/nvidia/cuda_nvdisasm/bin")):
        p = os.path.join(d, name)
        if d and os.access(p, os.X_OK):
            return p
    return shutil.which(name)


def functions(sass):
    """{mangled name: [instruction text, ...]} of an nvdisasm listing."""
    out, name = {}, None
    for line in sass.splitlines():
        m = re.match(r"^\.text\.(\S+):", line)
        if m:
            name = m.group(1)
            out[name] = []
            continue
        m = re.match(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m and name:
            out[name].append(m.group(1))
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
            for fn, code in functions(sass).items():
                need = next((n for frag, n in KERNELS.items() if frag in fn), None)
                if need is None:
                    continue
                checked += 1
                waits = [i for i, ins in enumerate(code) if ins.split()[0].lstrip("@!P0123456789 ") == "ACQBULK"
                         or re.search(r"\bACQBULK\b", ins)]
                if not waits:
                    failures.append(f"{cubin} {fn}: no griddepcontrol.wait (ACQBULK)")
                    continue
                before = [ins for ins in code[:waits[0]] if re.search(r"\bLDG\b|\bLDG\.", ins)]
                strong = [ins for ins in before if ".STRONG" in ins]
                if len(before) < need:
                    failures.append(f"{cubin} {fn}: {len(before)} loads before griddepcontrol.wait, want >= {need}")
                if strong:
                    failures.append(f"{cubin} {fn}: a mailbox/state load before griddepcontrol.wait: {strong[0]}")
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
