#!/usr/bin/env python3
"""SASS instructions per decoded value of the L3 v1 decode kernels, counted without a GPU.

Compiles kernel.cu for one architecture (default sm_90) with nvcc (`--std=c++17`, as NVRTC compiles it at
run time, plus `-lineinfo`, which adds line tables and changes no code), disassembles the cubin with
nvdisasm (`-g`: the source line of every instruction) and reads registers, stack and static shared memory
with `cuobjdump -res-usage`. No driver and no GPU are needed: the PyPI wheels `nvidia-cuda-nvcc`,
`nvidia-cuda-nvdisasm` and `nvidia-cuda-cuobjdump` are enough.

How the value loop is found: kernel.cu marks the statement that decodes a value with a comment
`sass-count: values=N` (N values decoded per iteration of the loop around it, per thread). Every
instruction nvdisasm attributes to that line is a seed; the loop is the innermost backward branch
(a BRA whose target lies at or before it) whose range [target, branch] holds a seed. For kernel.cu before
the marker existed, the seed is the line `l3_bits(src, len, bit0 + c * nbit, nbit)` with N = 1.

For each loop it prints the instructions in the loop's range ("body"), and the fewest and the most a
thread executes in one iteration (paths through the body's forward branches, the backward edge cut; a
CALL inside counts as one instruction; a loop nested in the body, such as an unrolled loop over a gray
pixel's copies, is not entered: its remainder code, up to 3 copies, is). "per value" divides the most by N: a thread's instructions per
decoded value on the longest path, so rare paths (image edges) count as if always taken. The same longest-path
count, of single opcodes, gives per value the global stores (STG, or ST to a generic address), shared stores
and loads, local-memory (spill) loads and stores, and global loads (LDG, or LD).

    python3 l3-cuda/scripts/sass_count.py                      # the working tree's kernel.cu
    python3 l3-cuda/scripts/sass_count.py --compare main       # main's kernel.cu, then this one, and the ratio
    python3 l3-cuda/scripts/sass_count.py --kernel other.cu --arch sm_80 --block 64 --dyn-smem 4224
    python3 l3-cuda/scripts/sass_count.py --v2 --compare main  # the version-2 loops (rANS step, rows)

Tools are looked up in $NVCC / $NVDISASM / $CUOBJDUMP, then PATH, $CUDA_HOME/bin, /usr/local/cuda/bin and
the nvidia wheels of this Python (and of target/sass-venv). Exits 2 when a tool is missing.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
KERNEL = os.path.join(REPO, "l3-cuda", "src", "kernel.cu")
V1_KERNELS = ["l3_decode_u8", "l3_decode_f32", "l3_decode_f16", "l3_samples_u8", "l3_samples_f32",
              "l3_samples_f16"]
V2_KERNELS = ["l3v2_decode_u8", "l3v2_decode_f32", "l3v2_decode_f16"]
MARKER = re.compile(r"sass-count:\s*values=(\w+)")
LEGACY = "l3_bits(src, len, bit0 + c * nbit, nbit)"
# Version 2 (--v2; the l3v2_decode_* kernels): `sass-count: v2-ans values=N` marks the step of the rANS
# chain (a symbol per lane),
# `sass-count: v2-row values=N` the reconstruction of a row's columns; kernel.cu before the markers had
# the ANS step's store of a symbol (the reconstruction was several block-wide loops a row: no one loop).
V2_TAGS = {"v2-ans": "if (active) zr[c] = (u8)s;", "v2-row": None}


def find_tool(name):
    env = os.environ.get(name.upper())
    if env:
        return env
    found = shutil.which(name)
    if found:
        return found
    dirs = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin"), "/usr/local/cuda/bin"]
    import site
    roots = list(site.getsitepackages()) + [site.getusersitepackages()]
    roots += glob.glob(os.path.join(REPO, "target", "sass-venv", "lib", "python3*", "site-packages"))
    for root in roots:
        dirs += glob.glob(os.path.join(root, "nvidia", "*", "bin"))
    for d in dirs:
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    print(f"sass_count: {name} not found (pip install nvidia-cuda-nvcc nvidia-cuda-nvdisasm "
          f"nvidia-cuda-cuobjdump, or set ${name.upper()})", file=sys.stderr)
    sys.exit(2)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sass_count: {' '.join(cmd)} failed:\n{r.stderr[-4000:]}")
    return r.stdout


def seeds(source, defines, tag=None):
    """(line numbers of the value statement, values per iteration) in the kernel source; N may name a
    macro (`-D` defines first, then the source's `#define`). `tag`: a version-2 marker (V2_TAGS);
    None for the version-1 one. (None, 0) when the source has no such marker and no legacy line."""
    lines = source.splitlines()
    marker = re.compile(rf"sass-count:\s*{tag}\s+values=(\w+)") if tag else MARKER
    marked = [(i + 1, m.group(1)) for i, l in enumerate(lines) for m in [marker.search(l)] if m]
    if marked:
        n = marked[0][1]
        if not n.isdigit():
            found = re.search(rf"^\s*#\s*define\s+{n}\s+(\d+)", source, re.M)
            n = defines.get(n) or (found and found.group(1))
            if not n:
                sys.exit(f"sass_count: {marked[0][1]} has no value")
        return {line for line, _ in marked}, int(n)
    if tag:
        text = V2_TAGS[tag]
        legacy = {i + 1 for i, l in enumerate(lines) if text and text in l}
        return (legacy, 1) if legacy else (None, 0)
    legacy = {i + 1 for i, l in enumerate(lines) if LEGACY in l}
    if not legacy:
        sys.exit("sass_count: no `sass-count: values=N` marker in the kernel source")
    return legacy, 1


INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
LINE = re.compile(r'//## File ".*", line (\d+)')
LABEL = re.compile(r"^(\.L_x_\d+):")
FUNC = re.compile(r"^\s*\.section\s+\.text\.(\w+),")


def parse(sass):
    """{function: [(addr, text, line, [labels])]} from `nvdisasm -g -c`."""
    funcs, cur, line, labels = {}, None, None, []
    for raw in sass.splitlines():
        m = FUNC.match(raw)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            line, labels = None, []
            continue
        if cur is None:
            continue
        m = LINE.search(raw)
        if m:
            line = int(m.group(1))
            continue
        m = LABEL.match(raw.strip())
        if m:
            labels.append(m.group(1))
            continue
        m = INSN.search(raw)
        if m:
            cur.append((int(m.group(1), 16), m.group(2), line, labels))
            labels = []
    return funcs


def branch_target(text):
    m = re.search(r"\bBRA\b.*`\((\.L_x_\d+)\)", text)
    return m.group(1) if m else None


def loops(insns):
    """[(head index, backward branch index)] of every backward branch."""
    at = {lab: i for i, (_, _, _, labs) in enumerate(insns) for lab in labs}
    out = []
    for i, (_, text, _, _) in enumerate(insns):
        t = branch_target(text)
        if t is not None and t in at and at[t] <= i:
            out.append((at[t], i))
    return out


def opcode(text):
    """The opcode of an instruction, without its predicate and modifiers (`@P0 STG.E.U8` -> STG)."""
    words = text.split()
    op = words[1] if text.startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def paths(insns, head, end, nested, weight=lambda text: 1, through=False):
    """Fewest and most instructions from `head` to the backward branch at `end` (forward edges only),
    never entering a loop nested in it (`nested`: its (head, end) pairs). `weight` counts an instruction
    (1 each by default; for the stores per value, 1 for a store and 0 for the rest). With `through`, a
    path may pass a nested loop, at no cost, from its head to the instruction after it (a search in the
    middle of the body; its iterations are counted apart)."""
    at = {lab: i for i, (_, _, _, labs) in enumerate(insns) for lab in labs}
    lo, hi = {end: weight(insns[end][1])}, {end: weight(insns[end][1])}
    for i in range(end - 1, head - 1, -1):
        inside = [(h, e) for h, e in nested if h <= i <= e]
        if inside:
            h, e = min(inside, key=lambda he: he[0])
            if through and i == h and e + 1 in lo:
                lo[i], hi[i] = lo[e + 1], hi[e + 1]
            continue
        text = insns[i][1]
        succ = []
        op = text.split()[1] if text.startswith("@") else text.split()[0]
        # BRA.DIV leaves for the divergent fallback of a warp vote or shuffle only when the warp has
        # diverged: a conditional branch.
        unconditional = not text.startswith("@") and not op.startswith("BRA.DIV")
        t = branch_target(text)
        if op.startswith("BRA") and t is not None:
            j = at.get(t)
            if j is not None and i < j <= end:
                succ.append(j)
            if not unconditional and i + 1 <= end:
                succ.append(i + 1)
        elif op == "EXIT" and unconditional:
            pass
        elif i + 1 <= end:
            succ.append(i + 1)
        reach = [s for s in succ if s in lo]
        if reach:
            w = weight(text)
            lo[i] = w + min(lo[s] for s in reach)
            hi[i] = w + max(hi[s] for s in reach)
    return lo.get(head), hi.get(head)


def resources(cuobjdump_out):
    res, cur = {}, None
    for l in cuobjdump_out.splitlines():
        m = re.match(r"\s*Function (\w+):", l)
        if m:
            cur = m.group(1)
            continue
        if cur and "REG:" in l:
            res[cur] = {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", l)}
            cur = None
    return res


def occupancy(regs, smem, block):
    """Resident warps per SM over 64 on sm_90 (2,048 threads, 32 blocks, 64 Ki registers allocated per
    warp in units of 256, 228 KiB shared memory with 1 KiB reserved per block)."""
    warps = (block + 31) // 32
    by_threads = 2048 // block
    per_warp = ((max(regs, 1) * 32 + 255) // 256) * 256
    by_regs = (65536 // per_warp) // warps
    by_smem = (228 * 1024) // (smem + 1024)
    blocks = min(by_threads, by_regs, by_smem, 32)
    return blocks * warps / 64.0, blocks


def count(source, arch, block, dyn_smem, label, defines, tag=None):
    nvcc, nvdisasm, cuobjdump = find_tool("nvcc"), find_tool("nvdisasm"), find_tool("cuobjdump")
    lines, per_iter = seeds(source, defines, tag)
    if lines is None:
        print(f"== {label}: no `{tag}` loop (before the markers, a row was several block-wide loops)")
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        cu = os.path.join(tmp, "kernel.cu")
        with open(cu, "w") as f:
            f.write(source)
        cubin = os.path.join(tmp, "kernel.cubin")
        flags = [f"-D{k}={v}" for k, v in defines.items()]
        run([nvcc, "-cubin", f"-arch={arch}", "--std=c++17", "-lineinfo", *flags, "-o", cubin, cu])
        funcs = parse(run([nvdisasm, "-g", "-c", cubin]))
        res = resources(run([cuobjdump, "-res-usage", cubin]))
    what = f"the {tag} loop" if tag else "the value loop"
    print(f"== {label}: {arch}, {per_iter} value(s) per iteration of {what}, value line(s) "
          f"{sorted(lines)}; occupancy for {block}-thread blocks, {dyn_smem} B dynamic shared memory")
    print(f"{'kernel':16} {'insns':>6} {'regs':>4} {'stack':>5} {'smem':>6} {'occ':>5}  value loops, fastest "
          f"first: most per value (instructions in the body; fewest..most per iteration; and per value "
          f"on the longest path: global stores (STG, or ST to a generic address), shared stores and loads, "
          f"local (spill) loads and stores, global loads (LDG or generic LD))")
    best = {}
    # Version 2 has kernels of its own; before them its code was in the version-1 kernels.
    names = V2_KERNELS if tag and any(k in funcs for k in V2_KERNELS) else V1_KERNELS
    for name in names:
        insns = funcs.get(name)
        if not insns:
            print(f"{name:16} missing")
            continue
        seed = {i for i, x in enumerate(insns) if x[2] in lines}
        every = loops(insns)
        found = []
        for head, end in every:
            if not any(head <= s <= end for s in seed):
                continue
            inner = [(h, e) for h, e in every if head <= h and e <= end and (h, e) != (head, end)
                     and any(h <= s <= e for s in seed)]
            if not inner:
                found.append((head, end))
        r = res.get(name, {})
        smem = r.get("SHARED", 0) + dyn_smem
        occ, _ = occupancy(r.get("REG", 0), smem, block)
        rows = []
        for head, end in sorted(set(found)):
            nested = [(h, e) for h, e in every if head <= h and e <= end and (h, e) != (head, end)]
            through = tag is not None
            lo, hi = paths(insns, head, end, nested, through=through)
            if hi is None:
                continue  # no forward path from the head to the back edge: not a loop the value runs in
            mem = [paths(insns, head, end, nested, lambda t, o=o: int(opcode(t) in o), through)[1] / per_iter
                   for o in (("STG", "ST"), ("STS",), ("LDS",), ("STL", "LDL"), ("LDG", "LD"))]
            # Loops nested in it, outermost ones (a search, a row of copies): their most per iteration.
            outer = [(h, e) for h, e in nested if not any(h2 <= h and e <= e2 and (h2, e2) != (h, e)
                                                          for h2, e2 in nested)]
            inner = [paths(insns, h, e, [(h2, e2) for h2, e2 in nested if h <= h2 and e2 <= e
                                         and (h2, e2) != (h, e)])[1] for h, e in outer]
            rows.append((hi / per_iter, end - head + 1, lo, hi, mem, inner))
        rows.sort()
        best[name] = [x[0] for x in rows]
        desc = "; ".join(f"{v:.1f} ({body}; {lo}..{hi}; STG {m[0]:.2f}, STS {m[1]:.2f}, LDS {m[2]:.2f}, local {m[3]:.2f}, LDG {m[4]:.2f}"
                         + (f"; nested loops, most per iteration: {', '.join(str(x) for x in inner)}" if tag and inner else "")
                         + ")"
                         for v, body, lo, hi, m, inner in rows)
        print(f"{name:16} {len(insns):6} {r.get('REG', 0):4} {r.get('STACK', 0):5} {smem:6} "
              f"{occ * 100:4.0f}%  {desc or 'no loop found'}")
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", default=KERNEL, help="kernel source (default: the working tree's)")
    ap.add_argument("--compare", metavar="REF", help="also count REF's l3-cuda/src/kernel.cu (git)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--block", type=int, default=64, help="threads per block, for the occupancy")
    ap.add_argument("--dyn-smem", type=int, default=0, help="dynamic shared memory per block (bytes)")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                    help="a define for the working tree's kernel (an experiment: -D L3_VALS=16)")
    ap.add_argument("--before-dyn-smem", type=int, default=4224,
                    help="the REF kernel's dynamic shared memory (its stage: a 64x64 patch, 4,224 B)")
    ap.add_argument("--v2", action="store_true",
                    help="the version-2 loops instead: the rANS step (per symbol) and the row reconstruction")
    a = ap.parse_args()
    if a.v2:
        defines = dict(d.split("=", 1) for d in a.defines)
        with open(a.kernel) as f:
            source = f.read()
        old = run(["git", "-C", REPO, "show", f"{a.compare}:l3-cuda/src/kernel.cu"]) if a.compare else None
        for tag in V2_TAGS:
            if old is not None:
                count(old, a.arch, a.block, a.before_dyn_smem, f"{a.compare}'s kernel.cu", {}, tag)
            count(source, a.arch, a.block, a.dyn_smem, os.path.relpath(a.kernel, REPO), defines, tag)
        return
    before = None
    if a.compare:
        src = run(["git", "-C", REPO, "show", f"{a.compare}:l3-cuda/src/kernel.cu"])
        before = count(src, a.arch, a.block, a.before_dyn_smem, f"{a.compare}'s kernel.cu", {})
    defines = dict(d.split("=", 1) for d in a.defines)
    with open(a.kernel) as f:
        after = count(f.read(), a.arch, a.block, a.dyn_smem, os.path.relpath(a.kernel, REPO), defines)
    if before:
        print("== SASS instructions per decoded value, before -> after (ratio): the slowest loops (before: "
              "rows with Paeth) and the fastest loop after")
        for name in V1_KERNELS:
            if before.get(name) and after.get(name):
                b, a_lo, a_hi = max(before[name]), min(after[name]), max(after[name])
                print(f"{name:16} {b:6.1f} -> {a_hi:5.1f} ({a_hi / b:.2f}x); fastest {a_lo:5.1f} "
                      f"({a_lo / b:.2f}x)")


if __name__ == "__main__":
    main()
