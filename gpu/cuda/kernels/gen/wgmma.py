#!/usr/bin/env python3
"""Writes the wgmma wrappers of kernels/hopper.cuh (between the markers
"// BEGIN wgmma wrappers" and "// END wgmma wrappers"): one function per
shape m64nNk16, A from shared memory (wg_ssN: N = 64, 128, 192, 256) or from
registers (wg_rsN: N = 64, 128), bf16 or f16 operands, fp32 accumulators
d[N/2] in the register order of the PTX accumulator fragment. Every
accumulator must be named in the asm statement, hence the generator.

    python3 gpu/cuda/kernels/gen/wgmma.py   # rewrites the section in place
"""
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
CU = os.path.join(HERE, "..", "hopper.cuh")


def regs(n):
    return ", ".join(f"%{i}" for i in range(n))


def outs(n):
    return ", ".join(f'"+f"(d[{i}])' for i in range(n))


def wrapper(n, rs):
    acc = n // 2
    name = f"wg_{'rs' if rs else 'ss'}{n}"
    if rs:
        sig = "float* d, const u32* a, u64 b, int acc"
        a_ops = f"{{%{acc}, %{acc + 1}, %{acc + 2}, %{acc + 3}}}"
        b_op, p_op = f"%{acc + 4}", f"%{acc + 5}"
        tail = f"p, 1, 1, %{acc + 6};"
        ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB)'
    else:
        sig = "float* d, u64 a, u64 b, int acc"
        a_ops = f"%{acc}"
        b_op, p_op = f"%{acc + 1}", f"%{acc + 2}"
        tail = f"p, 1, 1, 0, %{acc + 3};"
        ins = '"l"(a), "l"(b), "r"(acc), "n"(TB)'
    body = []
    for dt in ("bf16", "f16"):
        body.append(
            f'    asm volatile(\n'
            f'        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, {p_op}, 0;\\n"\n'
            f'        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dt}.{dt} "\n'
            f'        "{{{regs(acc)}}}, "\n'
            f'        "{a_ops}, {b_op}, {tail}\\n}}\\n"\n'
            f'        : {outs(acc)}\n'
            f'        : {ins}\n'
            f'        : "memory");')
    return (f"template <bool F16, int TB>\n__device__ __forceinline__ void {name}({sig}) {{\n"
            f"  if (F16) {{\n{body[1]}\n  }} else {{\n{body[0]}\n  }}\n}}\n")


def main():
    gen = "".join(wrapper(n, rs) for rs, ns in ((False, (64, 128, 192, 256)), (True, (64, 128))) for n in ns)
    src = open(CU).read()
    pat = re.compile(r"(// BEGIN wgmma wrappers[^\n]*\n).*?(// END wgmma wrappers)", re.S)
    if not pat.search(src):
        raise SystemExit("markers not found in " + CU)
    open(CU, "w").write(pat.sub(lambda m: m.group(1) + gen + m.group(2), src))


if __name__ == "__main__":
    main()
