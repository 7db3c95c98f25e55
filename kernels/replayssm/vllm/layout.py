"""The ReplaySSM state of one layer as vLLM state tensors, and back.

vLLM (0.26, ``mamba_cache_mode="none"``) gives each Mamba/GDN layer one page per request and
cuts it into one view per declared (shape, dtype), in declaration order, each view
``[num_blocks, *shape]`` with a slot stride of one page (``page_bytes / itemsize`` elements).
The plugin declares vLLM's own two tensors first and unchanged, so vLLM's prefill, conv
kernels and helpers that index [0] / [1] keep working on them:

    [0] conv window          vLLM's shape and dtype
    [1] checkpoint           vLLM's ssm shape and dtype (Mamba-2 [H, P, N], GDN [Hv, dv, dk]);
                             prefill writes it, as stock vLLM writes its state
    [2..] the replay fields  widest dtype first, so every view's byte offset stays aligned

Replay fields (names used below and in docs/vllm.md):
    Mamba-2: x [L, H, P] act, B [L, G, N] act, dt [L, H] fp32
    GDN:     u [L, Hv, dv] fp32, k [L, Hk, dk] act, g [L, Hv] fp32,
             dual only: v [L, Hv, dv] act, beta [L, Hv] fp32
    both:    cursor [1] int32 (replayssm.state's cursor word), pending [1] int32 (drafts the
             last verify appended: what a commit may accept), route_epoch [heads, ceil(rows/4)] int8,
             dual only: lo [heads, rows, cols] in the low dtype (+ lo_scale [heads, rows] fp32 for fp8)

No per-draft slot anywhere: a draft window lives in the buffer (L >= K + T).
This module imports no vLLM: shapes and views are plain torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch

from ..state import EPOCH_ROWS, Checkpoint, GDNReplayState, Mamba2ReplayState, dtype_of
from .config import ReplayConfig, ReplayConfigError


@dataclass(frozen=True)
class Field:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


def _ordered(fields: list[Field]) -> list[Field]:
    """Widest dtype first (stable), so each view's byte offset is a multiple of its itemsize."""
    return sorted(fields, key=lambda f: -torch.empty((), dtype=f.dtype).element_size())


def _check_checkpoint(cfg: ReplayConfig, ckpt_dtype: torch.dtype) -> None:
    if cfg.dual and ckpt_dtype != torch.float32:
        raise ReplayConfigError(
            f"replay-dual keeps a float32 checkpoint; mamba_ssm_cache_dtype gives {ckpt_dtype} "
            "(set mamba_ssm_cache_dtype='float32')")
    if ckpt_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ReplayConfigError(f"replayssm checkpoints are float32 / bfloat16 / float16; "
                                f"mamba_ssm_cache_dtype gives {ckpt_dtype}")


def _common(cfg: ReplayConfig, heads: int, rows: int, cols: int) -> list[Field]:
    f = [Field("cursor", (1,), torch.int32), Field("pending", (1,), torch.int32),
         Field("route_epoch", (heads, -(-rows // EPOCH_ROWS)), torch.int8)]
    if cfg.dual:
        lo = dtype_of(cfg.lo_dtype)
        f.append(Field("lo", (heads, rows, cols), lo))
        if lo == torch.float8_e4m3fn:
            f.append(Field("lo_scale", (heads, rows), torch.float32))
    return f


def mamba2_fields(cfg: ReplayConfig, *, heads: int, head_dim: int, d_state: int, n_groups: int,
                  act_dtype: torch.dtype, ckpt_dtype: torch.dtype) -> list[Field]:
    """The replay fields a Mamba-2 layer appends after vLLM's conv and ssm tensors (heads and
    groups per tensor-parallel rank)."""
    _check_checkpoint(cfg, ckpt_dtype)
    L = cfg.buffer_len
    f = [Field("x", (L, heads, head_dim), act_dtype), Field("B", (L, n_groups, d_state), act_dtype),
         Field("dt", (L, heads), torch.float32)]
    return _ordered(f + _common(cfg, heads, head_dim, d_state))


def gdn_fields(cfg: ReplayConfig, *, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
               act_dtype: torch.dtype, ckpt_dtype: torch.dtype) -> list[Field]:
    """The replay fields a GDN layer appends after vLLM's conv and ssm tensors (per TP rank)."""
    _check_checkpoint(cfg, ckpt_dtype)
    L = cfg.buffer_len
    f = [Field("u", (L, num_v_heads, head_v_dim), torch.float32), Field("k", (L, num_k_heads, head_k_dim), act_dtype),
         Field("g", (L, num_v_heads), torch.float32)]
    if cfg.dual:
        f += [Field("v", (L, num_v_heads, head_v_dim), act_dtype), Field("beta", (L, num_v_heads), torch.float32)]
    return _ordered(f + _common(cfg, num_v_heads, head_v_dim, head_k_dim))


def replay_fields(family: str, cfg: ReplayConfig, shapes, dtypes, act_dtype: torch.dtype) -> list[Field]:
    """The replay fields of a layer, derived from vLLM's own (conv, ssm) shapes and dtypes, so
    the layer and its model class (each of which starts from vLLM's shapes) declare the same.
    Mamba-2: ssm [H, P, N], conv dim H*P + 2*G*N; GDN: ssm [Hv, dv, dk], conv dim 2*Hk*dk + Hv*dv
    (per tensor-parallel rank; the conv shape may be either orientation)."""
    conv, ssm = tuple(shapes[0]), tuple(shapes[1])
    conv_dim, (h, r, c) = max(conv), ssm
    if family == "mamba2":
        groups, rem = divmod(conv_dim - h * r, 2 * c)
        if rem or groups < 1:
            raise ReplayConfigError(f"Mamba-2 conv shape {conv} does not match ssm shape {ssm}")
        return mamba2_fields(cfg, heads=h, head_dim=r, d_state=c, n_groups=groups, act_dtype=act_dtype,
                             ckpt_dtype=dtypes[1])
    if family == "gdn":
        kheads, rem = divmod(conv_dim - h * r, 2 * c)
        if rem or kheads < 1:
            raise ReplayConfigError(f"GDN conv shape {conv} does not match ssm shape {ssm}")
        return gdn_fields(cfg, num_k_heads=kheads, num_v_heads=h, head_k_dim=c, head_v_dim=r, act_dtype=act_dtype,
                          ckpt_dtype=dtypes[1])
    raise ValueError(f"family must be 'mamba2' or 'gdn'; got {family!r}")


def extend(shapes, dtypes, fields: list[Field]) -> tuple[tuple, tuple]:
    """vLLM's (shapes, dtypes) with the replay fields appended; refuses a misaligned offset."""
    shapes, dtypes = tuple(tuple(s) for s in shapes), tuple(dtypes)
    if len(shapes) != 2 or len(dtypes) != 2:
        raise ReplayConfigError(f"expected vLLM's (conv, ssm) state tensors; got {len(shapes)} shapes")
    off = 0
    for shape, dtype in zip(shapes + tuple(f.shape for f in fields), dtypes + tuple(f.dtype for f in fields)):
        size = torch.empty((), dtype=dtype).element_size()
        if off % size:
            raise ReplayConfigError(f"state tensor {shape} {dtype} would start at byte {off}, not a multiple of "
                                    f"{size}: the conv window's size breaks the page layout (mamba_cache_dtype)")
        off += prod(shape) * size
    return shapes + tuple(f.shape for f in fields), dtypes + tuple(f.dtype for f in fields)


def page_bytes(shapes, dtypes) -> int:
    """Bytes one slot's tensors take (vLLM's MambaSpec.page_size_bytes before padding)."""
    return sum(prod(s) * torch.empty((), dtype=d).element_size() for s, d in zip(shapes, dtypes))


def _named(tensors, fields: list[Field]) -> dict[str, torch.Tensor]:
    if len(tensors) != 2 + len(fields):
        raise ValueError(f"kv_cache has {len(tensors)} tensors; the replay layout declares {2 + len(fields)}")
    t = dict(zip((f.name for f in fields), tensors[2:]))
    t["cursor"], t["pending"] = t["cursor"][:, 0], t["pending"][:, 0]
    return t


def _lo(t) -> Checkpoint | None:
    return Checkpoint(t["lo"], t.get("lo_scale")) if "lo" in t else None


def mamba2_state(tensors, fields: list[Field], cfg: ReplayConfig) -> tuple[Mamba2ReplayState, torch.Tensor]:
    """(state, pending) over a layer's kv_cache views: no copy, slots are vLLM's block ids."""
    t = _named(tensors, fields)
    rs = Mamba2ReplayState(hi=Checkpoint(tensors[1]), lo=_lo(t), cursor=t["cursor"], flush_period=cfg.flush_period,
                           mode=cfg.state_mode, x=t["x"], B=t["B"], dt=t["dt"], route_epoch=t["route_epoch"])
    return rs, t["pending"]


def gdn_state(tensors, fields: list[Field], cfg: ReplayConfig) -> tuple[GDNReplayState, torch.Tensor]:
    t = _named(tensors, fields)
    rs = GDNReplayState(hi=Checkpoint(tensors[1]), lo=_lo(t), cursor=t["cursor"], flush_period=cfg.flush_period,
                        mode=cfg.state_mode, u=t["u"], k=t["k"], g=t["g"], v=t.get("v"), beta=t.get("beta"),
                        route_epoch=t["route_epoch"])
    return rs, t["pending"]


def page_views(storage: torch.Tensor, num_blocks: int, shapes, dtypes, page: int | None = None) -> list[torch.Tensor]:
    """Views of a flat uint8 `storage` the way vLLM's GPU model runner cuts a Mamba page:
    [num_blocks, *shape] per tensor, slot stride = one page. For tests and for the kernels'
    stride checks; the engine makes its own."""
    page = page or page_bytes(shapes, dtypes)
    out, off = [], 0
    for shape, dtype in zip(shapes, dtypes):
        size = torch.empty((), dtype=dtype).element_size()
        inner = torch.empty((num_blocks, *shape)).stride()[1:]
        typed = storage[: storage.numel() // size * size].view(dtype)
        out.append(torch.as_strided(typed, (num_blocks, *shape), (page // size, *inner), off // size))
        off += prod(shape) * size
    return out


def slot_strides_contiguous(rs) -> bool:
    """True if every per-slot tensor of `rs` has the slot stride of a contiguous [S, ...] tensor
    (what the Triton kernels assume today); False for vLLM's page views."""
    ts = [rs.hi.data, rs.cursor, rs.route_epoch, *rs.buffers()]
    if rs.hi.scale is not None:
        ts.append(rs.hi.scale)
    if rs.lo is not None:
        ts += [rs.lo.data] + ([rs.lo.scale] if rs.lo.scale is not None else [])
    return all(t.is_contiguous() for t in ts if t is not None)
