"""What the three kernel modules share for compiling a launch offline (no GPU): the JIT's
argument specialisation, written out as a Triton signature."""
from __future__ import annotations

import torch

TL_TYPES = {torch.float32: "fp32", torch.float64: "fp64", torch.bfloat16: "bf16", torch.float16: "fp16",
            torch.float8_e4m3fn: "fp8e4nv", torch.int32: "i32", torch.int64: "i64"}


def signature(arg_names, args, meta: dict) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) for triton's ASTSource, specialising as the JIT does at
    launch: tensors 16-byte aligned, ints divisible by 16 marked so, ints equal to 1 and bools
    constant; every key of `meta` (the launch's constexprs, num_warps removed) a constexpr."""
    sig, consts, attrs = {}, dict(meta), {}
    for i, (name, a) in enumerate(zip(arg_names, args)):
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
        else:
            raise TypeError(f"argument {name}: {type(a).__name__}")
    for name in meta:
        sig[name] = "constexpr"
    return sig, consts, attrs
