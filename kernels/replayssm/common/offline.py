"""What the kernel families share for compiling a launch offline (no GPU): the JIT's
argument specialisation, written out as a Triton signature, and the compile + resource report."""
from __future__ import annotations

import torch
from triton.runtime.jit import mangle_type
from triton.tools.tensor_descriptor import TensorDescriptor

TL_TYPES = {torch.float32: "fp32", torch.float64: "fp64", torch.bfloat16: "bf16", torch.float16: "fp16",
            torch.float8_e4m3fn: "fp8e4nv", torch.int8: "i8", torch.int32: "i32", torch.int64: "i64"}


def signature(arg_names, args, meta: dict) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) for triton's ASTSource, specialising as the JIT does at
    launch: tensors 16-byte aligned, TMA descriptors typed by dtype and block, ints divisible by
    16 marked so, ints equal to 1 and bools constant; every key of `meta` (the launch's
    constexprs, num_warps removed) a constexpr."""
    sig, consts, attrs = {}, dict(meta), {}
    for i, (name, a) in enumerate(zip(arg_names, args)):
        if name in meta:
            continue
        if isinstance(a, torch.Tensor):
            sig[name] = "*" + TL_TYPES[a.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, bool):
            sig[name], consts[name] = "constexpr", a
        elif isinstance(a, int):
            if a == 1:
                sig[name], consts[name] = "constexpr", 1
                continue
            sig[name] = "i32" if -2 ** 31 <= a < 2 ** 31 else "i64"
            if a % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, float):
            sig[name] = "fp32"
        elif isinstance(a, TensorDescriptor):       # a host-side TMA descriptor ("tensordesc<...>")
            sig[name] = mangle_type(a)
        else:
            raise TypeError(f"argument {name}: {type(a).__name__}")
    for name in meta:
        sig[name] = "constexpr"
    return sig, consts, attrs


def compile_launch(kernel, args, meta: dict, arch: int = 90, asm: bool = False) -> dict:
    """Compile one launch (JIT kernel, its arguments, its constexprs + num_warps / num_stages /
    maxnreg / launch_pdl) for CUDA sm_<arch> without a GPU, with Triton's bundled LLVM, ptxas
    and cuobjdump. Returns per thread / CTA: 'regs', 'spill_stores' and 'spill_loads' (bytes, ptxas -v),
    'stack', 'local', 'shared' (cuobjdump's resource usage), 'smem' (the shared memory the
    launch asks for) and, with asm=True, 'asm' (Triton's ttgir / ptx / cubin ...). An EXACT constexpr is
    compiled as False (the GPU code path). Needs TRITON_INTERPRET unset in this process
    (kernels are interpreted otherwise); the arguments may be tensors on the 'meta' device."""
    import os
    import re
    import shutil
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if not isinstance(kernel, triton.runtime.JITFunction):
        raise RuntimeError("compiling offline needs TRITON_INTERPRET unset (kernels are interpreted)")
    meta = dict(meta)
    options = {"num_warps": meta.pop("num_warps")}
    for opt in ("num_stages", "maxnreg", "launch_pdl"):
        if meta.get(opt) is not None:
            options[opt] = meta.pop(opt)
        meta.pop(opt, None)
    if "EXACT" in meta:
        meta["EXACT"] = False
    # the arguments a launch leaves at their defaults, bound as the JIT binds them (Triton 3.8
    # no longer types an argument missing from the signature)
    rest = [p for p in kernel.params[len(args):] if p.name not in meta]
    meta.update({p.name: p.default for p in rest if p.is_constexpr})
    args = list(args) + [None if p.name in meta else p.default for p in kernel.params[len(args):]]
    sig, consts, attrs = signature(kernel.arg_names, args, meta)
    ck = triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", arch, 32), options=options)
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    tools = {}
    for tool in ("ptxas", "cuobjdump"):
        path = os.path.join(bindir, tool)
        tools[tool] = path if os.path.exists(path) else shutil.which(tool)
        if tools[tool] is None:
            raise RuntimeError(f"{tool} not found (Triton's NVIDIA backend binaries, or PATH)")
    # the ptxas Triton itself assembled with: its PTX version follows that one (Triton 3.9 uses
    # its newer bundled ptxas-blackwell from sm_90 on; the plain ptxas rejects that PTX)
    tools["ptxas"] = _triton_ptxas(arch) or tools["ptxas"]
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(ptx, "w") as f:
            f.write(ck.asm["ptx"])
        res = subprocess.run([tools["ptxas"], f"-arch=sm_{arch}{'a' if arch >= 90 else ''}", "-v", ptx, "-o",
                              cubin], capture_output=True, text=True, check=True)
        with open(cubin, "wb") as f:     # the cubin Triton built (the one that would run)
            f.write(ck.asm["cubin"])
        usage = subprocess.run([tools["cuobjdump"], "--dump-resource-usage", cubin], capture_output=True,
                               text=True, check=True).stdout
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", res.stderr)
    use = dict(re.findall(r"(REG|STACK|LOCAL|SHARED):(\d+)", usage.split("Function", 1)[1]))
    return {"regs": int(use["REG"]), "spill_stores": int(spill.group(1)) if spill else 0,
            "spill_loads": int(spill.group(2)) if spill else 0, "stack": int(use["STACK"]),
            "local": int(use["LOCAL"]), "shared": int(use["SHARED"]), "smem": int(ck.metadata.shared),
            **({"asm": ck.asm} if asm else {})}


def _triton_ptxas(arch: int) -> str | None:
    """The path of the ptxas Triton's NVIDIA backend uses for `arch`, None where it cannot say."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return get_ptxas(arch).path
    except Exception:    # a Triton without the helper, or without its NVIDIA tools
        return None
