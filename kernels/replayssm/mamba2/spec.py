"""Mamba-2 speculative verify: the outputs of T drafts from the checkpoint and the buffer (no
per-draft state), the drafts appended at buffer rows cursor..cursor+T-1; the cursor does not
move (commit, fold.py, moves it). Per program one [R, N] state tile times the drafts' C on the
tensor cores (tl.dot, exact-product splits of common.mma where the operands allow), the
buffered and draft entries' contributions from their Gram matrices (B_i . C_t)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.jit import cast, gdc_release, gdc_wait_prior, silu, softplus
from ..common.launch import last_contig, out_like, pdl_meta, state_scratch, tma_rows
from ..common.mma import mma_acc, mma_precision
from .fold import plan_clear_bits, plan_refresh_lo
from .host import buffer_strides, check_ckpts, ckpt_args, ckpt_strides, interpreting, np2, record, state_bytes
from .jit import outer_sum, slot_of
from .options import Mamba2Options, resolve
from .table import TABLE, tile_params


@triton.jit
def _mma_acc(a, b, acc, PREC: tl.constexpr, EXACT: tl.constexpr):
    """acc + a @ b: triton.mma precisions, plus "split3" / "split3b": b / a holds bf16 values
    and the other (fp32) operand is split into three bf16 parts (24 significant bits: three
    exact-product MMAs, outer_sum's bf16x3)."""
    if PREC == "split3":
        r = acc + outer_sum(tl.trans(a.to(tl.float32)), b, True, "bf16x3", EXACT)
    elif PREC == "split3b":
        r = acc + tl.trans(outer_sum(b.to(tl.float32), tl.trans(a), True, "bf16x3", EXACT))
    else:
        r = mma_acc(a, b, acc, PREC, EXACT)
    return r


@triton.jit
def _verify_tile_x(x_ptr, bx_ptr, b, h, bx_base, offs_p, mask_p, offs_t, mask_t, offs_l, in_l,
                   s_x_b, s_x_t, s_x_h, s_bx_l, EXACT: tl.constexpr):
    """A row tile's draft inputs XdT [R, BT] (rounded to the buffer's dtype, as appended) and
    buffered inputs XbT [R, BL] (rows in_l; rows >= n masked later by _verify_tile_out)."""
    XdT = cast(tl.load(x_ptr + b * s_x_b + offs_t[None, :] * s_x_t + h * s_x_h + offs_p[:, None],
                       mask=mask_p[:, None] & mask_t[None, :], other=0.0).to(tl.float32),
               bx_ptr.dtype.element_ty, EXACT)
    XbT = tl.load(bx_ptr + bx_base + offs_l[None, :] * s_bx_l + offs_p[:, None],
                  mask=in_l[None, :] & mask_p[:, None], other=0.0)
    return XdT, XbT


@triton.jit
def _verify_tile_out(Y, offs_p, mask_p, in_p, XbT, XdT, W, Wd, decay, mask_l, Dh, n, mask_t,
                     z_ptr, y_ptr, bx_ptr, rd_sc_ptr, b, slot, h, bx_base,
                     s_z_b, s_z_t, s_z_h, s_y_b, s_y_t, s_y_h, s_bx_l, s_sc_s, s_sc_h, L,
                     T: tl.constexpr, BLOCK_T: tl.constexpr, HAS_Z: tl.constexpr, RD_SCALE: tl.constexpr,
                     X_PREC: tl.constexpr, EXACT: tl.constexpr):
    """One row tile's outputs (rows offs_p [R]) from its checkpoint term Y = S C^T [R, BT], its
    buffered inputs XbT [R, BL] (rows >= n not yet masked) and drafts XdT [R, BT]; stores y and
    appends the drafts' x at buffer rows n..n+T-1 (see _verify_kernel)."""
    offs_t = tl.arange(0, BLOCK_T)
    if RD_SCALE:
        Y = Y * tl.load(rd_sc_ptr + slot * s_sc_s + h * s_sc_h + offs_p, mask=mask_p, other=1.0)[:, None]
    XbT = tl.where(mask_l[None, :], XbT, 0.0)   # rows >= n may be stale: never multiplied
    Y = Y * decay[None, :]
    Y = _mma_acc(XbT, W, Y, X_PREC, EXACT)
    Y = _mma_acc(XdT, Wd, Y, X_PREC, EXACT)
    Y += Dh * XdT.to(tl.float32)
    mask_pt = mask_p[:, None] & mask_t[None, :]
    if HAS_Z:
        Y = Y * silu(tl.load(z_ptr + b * s_z_b + offs_t[None, :] * s_z_t + h * s_z_h + offs_p[:, None],
                              mask=mask_pt, other=0.0).to(tl.float32))
    tl.store(y_ptr + b * s_y_b + offs_t[None, :] * s_y_t + h * s_y_h + offs_p[:, None],
             cast(Y, y_ptr.dtype.element_ty, EXACT), mask=in_p[:, None] & (offs_t < T)[None, :])
    pos = n + offs_t
    wr = mask_t & (pos < L)
    tl.store(bx_ptr + bx_base + pos[None, :] * s_bx_l + offs_p[:, None], XdT, mask=wr[None, :] & mask_p[:, None])


@triton.jit
def _verify_gram_kernel(B_ptr, C_ptr, bB_ptr, gram_ptr, idx_ptr, n_slots, L, N: tl.constexpr,
                        s_B_b, s_B_t, s_B_g, s_C_b, s_C_t, s_C_g, s_bB_s, s_bB_l, s_bB_g,
                        T: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr,
                        HAS_IDX: tl.constexpr, BC_PREC: tl.constexpr, EXACT: tl.constexpr,
                        GDC: tl.constexpr = False):
    """The verify's Gram matrices of batch row b and group g, once per group instead of once per
    program of its heads (_verify_kernel's PRE_GRAM): gram[b, g] [BLOCK_L + BLOCK_T, BLOCK_T]
    float32, rows 0..BLOCK_L-1 the buffer's B_i . C_t (rows i < L, the cursor not known here:
    the verify masks rows >= n), rows BLOCK_L.. the drafts' B_j . C_t, products exactly as the
    verify forms them (the drafts' B rounded as the buffer stores them; BC_PREC). Grid (G, b).
    GDC: the verify behind it is its programmatic dependent, let go at once (it reads gram only
    after waiting; this launch is an ordinary one, so all before it has finished)."""
    gdc_release(GDC)
    g = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    slot, live = slot_of(idx_ptr, b, n_slots, HAS_IDX)
    offs_t = tl.arange(0, BLOCK_T)
    offs_l = tl.arange(0, BLOCK_L)
    mask_t = offs_t < T
    in_l = offs_l < L
    bB_base = slot * s_bB_s + g * s_bB_g
    CB = tl.zeros([BLOCK_L, BLOCK_T], tl.float32)
    CdB = tl.zeros([BLOCK_T, BLOCK_T], tl.float32)
    for c0 in tl.range(0, N, BLOCK_N):
        offs_n = c0 + tl.arange(0, BLOCK_N)
        in_n = offs_n < N
        CdT = tl.trans(tl.load(C_ptr + b * s_C_b + offs_t[:, None] * s_C_t + g * s_C_g + offs_n[None, :],
                               mask=mask_t[:, None] & in_n[None, :], other=0.0))
        Bb = tl.load(bB_ptr + bB_base + offs_l[:, None] * s_bB_l + offs_n[None, :],
                     mask=in_l[:, None] & in_n[None, :], other=0.0)
        Bd = cast(tl.load(B_ptr + b * s_B_b + offs_t[:, None] * s_B_t + g * s_B_g + offs_n[None, :],
                          mask=mask_t[:, None] & in_n[None, :], other=0.0).to(tl.float32),
                  bB_ptr.dtype.element_ty, EXACT)
        CB = _mma_acc(Bb, CdT, CB, BC_PREC, EXACT)
        CdB = _mma_acc(Bd, CdT, CdB, BC_PREC, EXACT)
    base = gram_ptr + (b * tl.num_programs(0) + g) * ((BLOCK_L + BLOCK_T) * BLOCK_T)
    tl.store(base + offs_l[:, None] * BLOCK_T + offs_t[None, :], CB)
    tl.store(base + (BLOCK_L + offs_t)[:, None] * BLOCK_T + offs_t[None, :], CdB)


@triton.jit
def _verify_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, y_ptr, idx_ptr, n_slots,
    cur_ptr, bx_ptr, bB_ptr, bdt_ptr, rd_ptr, rd_sc_ptr, rd_desc, rd_desc_q, gram_ptr,
    P, N: tl.constexpr, L, HPG,
    s_x_b, s_x_t, s_x_h, s_dt_b, s_dt_t, s_B_b, s_B_t, s_B_g, s_C_b, s_C_t, s_C_g,
    s_z_b, s_z_t, s_z_h, s_y_b, s_y_t, s_y_h,
    s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
    s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
    T: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, TAIL_P: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr,
    RD_SCALE: tl.constexpr, S_PREC: tl.constexpr, BC_PREC: tl.constexpr, X_PREC: tl.constexpr,
    EARLY_BUF: tl.constexpr, EXACT: tl.constexpr, TMA: tl.constexpr = False, GDC: tl.constexpr = False,
    PRE_GRAM: tl.constexpr = False, GDC_WAIT: tl.constexpr = False,
):
    """Outputs of T drafts for rows [pid_p*R, +R) of head h of batch row b (R = BLOCK_P +
    TAIL_P), from the read checkpoint tile (read once for all T), buffer rows 0..n-1 and the
    drafts themselves (causally masked); writes the drafts at buffer rows n..n+T-1. No state
    is written and the cursor does not move.

    Matrix form, targets t as columns (every dim padded to >= 16 for tl.dot):
        Y [P, T] = (S [P, N] @ C^T [N, T]) * exp(c_buf + cd_t)[None, :]
                 + Xb^T [P, L] @ W [L, T]       W[i, t]  = dt_i exp(suf_i + cd_t) (B_i . C_t)
                 + Xd^T [P, T] @ Wd [T, T]      Wd[j, t] = [j <= t] dt_j exp(cd_t - cd_j) (B_j . C_t)
    with suf_i = sum_{i<j<n} dt_j A, c_buf = sum_{i<n} dt_i A and cd the drafts' inclusive
    cumulative log-decay. S C^T and the B . C Gram matrices (BC_PREC) accumulate over N in
    chunks of BLOCK_N columns whose loads feed the MMAs (the state tile is never whole in
    registers). The rows are one BLOCK_P tile and, with TAIL_P > 0, a second TAIL_P tile right
    after it (both powers of 2): a head whose row count is no power of 2 (Nano's 80 = 64 +
    16) runs in one program with no masked rows, its per-head work (the Gram matrices, W, Wd)
    done once. S_PREC: exact "bf16" for bf16 / fp8 read copies (fp8 row scales applied to Y's
    rows after), "bf16x2" / "bf16x3" / "tf32x3" for fp32 ones (_verify_state_precision);
    X_PREC "split3b": the fp32 weights split into three bf16 parts against the bf16 buffered x
    (exact products). Load order: the state chunks first (their address needs only the slot),
    then the drafts; with EARLY_BUF the buffer tiles are loaded for all BLOCK_L rows before
    the cursor arrives and rows >= n are selected away after (never multiplied: stale rows may
    hold anything; one dependent round trip less, up to K - n rows more read). TMA: the state
    chunks through TMA descriptors over the read copy as [rows, N] (rd_desc: [BLOCK_P, BLOCK_N]
    blocks, rd_desc_q: the tail's [TAIL_P, BLOCK_N]): one copy per chunk; rows past the head or
    of a null slot are read from wherever they point (their outputs are never stored). GDC:
    lets a programmatic dependent launch behind it (the commit's list launch) start early.
    PRE_GRAM: the Gram matrices come from gram_ptr (_verify_gram_kernel, launched just before;
    GDC_WAIT: as its programmatic dependent, waiting for it only before reading them) instead of
    from the program's own B tiles and MMAs.
    """
    gdc_release(GDC)
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    g = h // HPG
    slot, live = slot_of(idx_ptr, b, n_slots, HAS_IDX)
    offs_p = pid_p * (BLOCK_P + TAIL_P) + tl.arange(0, BLOCK_P)
    in_p = offs_p < P
    mask_p = in_p & live
    TP: tl.constexpr = TAIL_P if TAIL_P > 0 else 16    # the tail's shape (unused without a tail)
    offs_q = pid_p * (BLOCK_P + TAIL_P) + BLOCK_P + tl.arange(0, TP)
    in_q = offs_q < P
    mask_q = in_q & live
    ck_base = slot * s_ck_s + h * s_ck_h
    row0 = ((slot * tl.num_programs(1) + h) * P + pid_p * (BLOCK_P + TAIL_P)).to(tl.int32)   # TMA: first row
    offs_t = tl.arange(0, BLOCK_T)
    mask_t = (offs_t < T) & live
    offs_l = tl.arange(0, BLOCK_L)
    bx_base = slot * s_bx_s + h * s_bx_h
    bB_base = slot * s_bB_s + g * s_bB_g
    if EARLY_BUF:
        in_l = (offs_l < L) & live
    else:
        n = tl.load(cur_ptr + slot, mask=live, other=0)
        in_l = (offs_l < n) & live

    # Dots over N in chunks of BLOCK_N columns (loads feed the MMAs directly; the state tile is
    # never in registers whole): the checkpoint term S C^T [BP, T] (and the tail's) and the Gram
    # matrices B_i . C_t of the buffer [L, T] and of the drafts [T, T].
    Y = tl.zeros([BLOCK_P, BLOCK_T], tl.float32)
    Yq = tl.zeros([TP, BLOCK_T], tl.float32)
    CB = tl.zeros([BLOCK_L, BLOCK_T], tl.float32)
    CdB = tl.zeros([BLOCK_T, BLOCK_T], tl.float32)
    for c0 in tl.range(0, N, BLOCK_N):
        offs_n = c0 + tl.arange(0, BLOCK_N)
        in_n = offs_n < N
        if TMA:
            S = rd_desc.load([row0, c0])
            if TAIL_P > 0:
                Sq = rd_desc_q.load([row0 + BLOCK_P, c0])
        else:
            S = tl.load(rd_ptr + ck_base + offs_p[:, None] * s_ck_p + offs_n[None, :],
                        mask=mask_p[:, None] & in_n[None, :], other=0.0)
            if TAIL_P > 0:
                Sq = tl.load(rd_ptr + ck_base + offs_q[:, None] * s_ck_p + offs_n[None, :],
                             mask=mask_q[:, None] & in_n[None, :], other=0.0)
        CdT = tl.trans(tl.load(C_ptr + b * s_C_b + offs_t[:, None] * s_C_t + g * s_C_g + offs_n[None, :],
                               mask=mask_t[:, None] & in_n[None, :], other=0.0))                    # [BN, BT]
        if not PRE_GRAM:
            Bb = tl.load(bB_ptr + bB_base + offs_l[:, None] * s_bB_l + offs_n[None, :],
                         mask=in_l[:, None] & in_n[None, :], other=0.0)
            Bd = cast(tl.load(B_ptr + b * s_B_b + offs_t[:, None] * s_B_t + g * s_B_g + offs_n[None, :],
                              mask=mask_t[:, None] & in_n[None, :], other=0.0).to(tl.float32),
                      bB_ptr.dtype.element_ty, EXACT)
        Y = _mma_acc(S, CdT, Y, S_PREC, EXACT)
        if TAIL_P > 0:
            Yq = _mma_acc(Sq, CdT, Yq, S_PREC, EXACT)
        if not PRE_GRAM:
            CB = _mma_acc(Bb, CdT, CB, BC_PREC, EXACT)
            CdB = _mma_acc(Bd, CdT, CdB, BC_PREC, EXACT)

    # drafts' other inputs, then the buffer's dt and x
    A = tl.load(A_ptr + h).to(tl.float32)
    Dh = tl.load(D_ptr + h).to(tl.float32)
    bias = tl.load(dtb_ptr + h).to(tl.float32)
    dd = softplus(tl.load(dt_ptr + b * s_dt_b + offs_t * s_dt_t + h, mask=mask_t, other=0.0).to(tl.float32) + bias)
    dd = tl.where(mask_t, dd.to(bdt_ptr.dtype.element_ty).to(tl.float32), 0.0)
    XdT, XbT = _verify_tile_x(x_ptr, bx_ptr, b, h, bx_base, offs_p, mask_p, offs_t, mask_t, offs_l, in_l,
                              s_x_b, s_x_t, s_x_h, s_bx_l, EXACT)                                 # [BP, BT], [BP, BL]
    dt_i = tl.load(bdt_ptr + slot * s_bdt_s + offs_l * s_bdt_l + h, mask=in_l, other=0.0).to(tl.float32)
    if TAIL_P > 0:
        XdTq, XbTq = _verify_tile_x(x_ptr, bx_ptr, b, h, bx_base, offs_q, mask_q, offs_t, mask_t, offs_l, in_l,
                                    s_x_b, s_x_t, s_x_h, s_bx_l, EXACT)
    if PRE_GRAM:    # computed for rows i < L and every batch row: masked like the tiles above
        gdc_wait_prior(GDC_WAIT)
        gbase = gram_ptr + (b * (tl.num_programs(1) // HPG) + g) * ((BLOCK_L + BLOCK_T) * BLOCK_T)
        CB = tl.load(gbase + offs_l[:, None] * BLOCK_T + offs_t[None, :])
        CdB = tl.load(gbase + (BLOCK_L + offs_t)[:, None] * BLOCK_T + offs_t[None, :])
        CdB = tl.where(mask_t[:, None] & mask_t[None, :], CdB, 0.0)
    if EARLY_BUF:   # rows >= n are stale: selected away (never multiplied: they may hold anything)
        n = tl.load(cur_ptr + slot, mask=live, other=0)
        mask_l = (offs_l < n) & live
        dt_i = tl.where(mask_l, dt_i, 0.0)
        CB = tl.where(mask_l[:, None], CB, 0.0)
    else:
        mask_l = in_l
        if PRE_GRAM:
            CB = tl.where(mask_l[:, None], CB, 0.0)

    # decay weights: columns are targets t
    la = dt_i * A
    suf = tl.cumsum(la, 0, reverse=True) - la                 # sum_{i<j<n} la_j
    c_buf = tl.sum(la, 0)
    cd = tl.cumsum(dd * A, 0)                                  # inclusive over drafts
    W = tl.where(mask_l[:, None], dt_i[:, None] * tl.exp(suf[:, None] + cd[None, :]), 0.0) * CB     # [BL, BT]
    causal = (offs_t[:, None] <= offs_t[None, :]) & mask_t[:, None]
    Wd = dd[:, None] * tl.exp(tl.where(causal, cd[None, :] - cd[:, None], -float("inf"))) * CdB     # [BT(j), BT(t)]
    decay = tl.exp(c_buf + cd)
    _verify_tile_out(Y, offs_p, mask_p, in_p, XbT, XdT, W, Wd, decay, mask_l, Dh, n, mask_t,
                     z_ptr, y_ptr, bx_ptr, rd_sc_ptr, b, slot, h, bx_base,
                     s_z_b, s_z_t, s_z_h, s_y_b, s_y_t, s_y_h, s_bx_l, s_sc_s, s_sc_h, L,
                     T, BLOCK_T, HAS_Z, RD_SCALE, X_PREC, EXACT)
    if TAIL_P > 0:
        _verify_tile_out(Yq, offs_q, mask_q, in_q, XbTq, XdTq, W, Wd, decay, mask_l, Dh, n, mask_t,
                         z_ptr, y_ptr, bx_ptr, rd_sc_ptr, b, slot, h, bx_base,
                         s_z_b, s_z_t, s_z_h, s_y_b, s_y_t, s_y_h, s_bx_l, s_sc_s, s_sc_h, L,
                         T, BLOCK_T, HAS_Z, RD_SCALE, X_PREC, EXACT)

    # append the drafts' dt (once per head) and B rows (once per group) at rows n..n+T-1
    pos = n + offs_t
    wr = mask_t & (pos < L) & tl.where(pid_p == 0, True, False)   # i1 scalar (common/jit.py)
    tl.store(bdt_ptr + slot * s_bdt_s + pos * s_bdt_l + h, dd, mask=wr)
    if h % HPG == 0:   # the group's B rows (re-read: L2 hits)
        for c0 in tl.range(0, N, BLOCK_N):
            offs_n = c0 + tl.arange(0, BLOCK_N)
            m2 = wr[:, None] & (offs_n < N)[None, :]
            Bd = tl.load(B_ptr + b * s_B_b + offs_t[:, None] * s_B_t + g * s_B_g + offs_n[None, :], mask=m2, other=0.0)
            tl.store(bB_ptr + bB_base + pos[:, None] * s_bB_l + offs_n[None, :],
                     cast(Bd.to(tl.float32), bB_ptr.dtype.element_ty, EXACT), mask=m2)


def state_precision(rd: torch.dtype, c: torch.dtype, y: torch.dtype, f32_precision: str) -> str:
    """Precision of the verify MMA state tile x C. An fp32 tile feeding bf16 / fp16 outputs
    takes a bf16 split (~2^-16 per product, 128x below the output's own rounding): "bf16x2"
    (two passes) when C is exact in bf16, else Triton's "bf16x3" (10-17 % faster than "tf32x3"
    on the H200). fp32 outputs keep f32_precision. Only y depends on this product (the buffer
    keeps the inputs), so nothing of its error reaches a checkpoint."""
    p = mma_precision(rd, c, f32_precision)
    if p == f32_precision and y in (torch.bfloat16, torch.float16):
        return "bf16x2" if c in (torch.bfloat16, torch.float8_e4m3fn) else "bf16x3"
    return p


def plan_verify(rs, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None, out=None,
                options: Mamba2Options | None = None, refresh: bool = True):
    """([launches], y) of speculative verification; see replayssm.mamba2.verify: the verify
    launch, after a _verify_gram_kernel launch where the Gram pre-pass pays (options.verify_pre_gram),
    and with `refresh`, after the low copies' refresh (stale after the small-batch route) or the
    cursor words' epoch bits cleared (deferred route). Grid (cdiv(P, R), H, b): one [R, N] state
    tile per program, R = block_p of the verify row (every tile dim >= 16, tl.dot). A row of
    chunks 0 (the whole head in one program) adds a tail tile of next_pow2(P - block_p) rows
    (>= 16) when block_p < P: R = block_p + tail."""
    options = resolve(options)
    x, dt, B, C, z, A, D, dt_bias = (last_contig(t) for t in (x, dt, B, C, z, A, D, dt_bias))
    bsz, T, H, P = x.shape
    N, G = B.shape[-1], B.shape[2]
    L = rs.capacity
    y = out_like(out, x)
    if bsz == 0 or T == 0:
        return [], y
    check_ckpts(rs.hi, rs.lo)
    rd = rs.read_ckpt
    block_p, chunks, warps, row = tile_params("verify", head_dim=P, state_bytes=state_bytes(rd), batch=bsz, heads=H,
                                              options=options)
    ov = options.overrides_for("verify")
    block_p = max(16, min(ov.get("block_p", block_p), np2(P)))
    tail = max(16, np2(P - block_p)) if ov.get("whole", chunks > 1) and P > block_p else 0
    early_buf = ov.get("early_buf", options.verify_early_buf)
    bl = max(16, np2(min(rs.flush_period, L)))   # committed entries only: n <= K - 1 before a verify
    block_n = max(16, min(ov.get("chunk_n", options.verify_chunk_n), np2(N)))   # state columns per MMA step
    rd_d, rd_s, rd_has = ckpt_args(rd, rs.hi.data)
    # the read copy as [rows, N] through TMA (the main tile's and the tail's blocks)
    asked = bool(ov["tma"]) if "tma" in ov else TABLE.row(row).params["tma"]
    blocks = [(block_p, block_n)] + ([(tail, block_n)] if tail else [])    # no tail: rd_desc_q unread
    descs = tma_rows(rd_d, N, blocks, 'options.override("verify", tma=...)', asked)
    tma = descs is not None
    descs = [descs[0], descs[-1]] if tma else [rd_d, rd_d]
    zz = z if z is not None else x
    idx = state_indices if state_indices is not None else x
    grid = (triton.cdiv(P, block_p + tail), H, bsz)
    block_t = max(16, np2(T))
    f32 = options.verify_f32_precision
    bc_prec = mma_precision(rs.B.dtype, C.dtype, f32)
    pre_gram = ov.get("gram", options.verify_pre_gram)
    if pre_gram is None:
        pre_gram = state_bytes(rd) == 4 and not tail and bsz * H >= options.verify_pre_gram_min_work
    pre_gram = bool(pre_gram)
    pdl = pdl_meta(x.device, bool(ov.get("pdl", options.pdl)))
    launches, gram, wait = [], x, {}        # (gram unread without the pre-pass)
    if pre_gram:    # the Gram matrices once per group, ahead of the verify
        gram = state_scratch(rs, "_gram_scratch", bsz * G * (bl + block_t) * block_t,
                             x.device).view(torch.float32)
        wait = {"GDC_WAIT": pdl["GDC"], **({"launch_pdl": True} if pdl["GDC"] else {})}
        launches.append(record(_verify_gram_kernel, (G, bsz), row)(
            B, C, rs.B, gram, idx, rs.cursor.shape[0], L, N, B.stride(0), B.stride(1), B.stride(2), C.stride(0),
            C.stride(1),
            C.stride(2), rs.B.stride(0), rs.B.stride(1), rs.B.stride(2),
            T=T, BLOCK_T=block_t, BLOCK_L=bl, BLOCK_N=block_n, HAS_IDX=state_indices is not None,
            BC_PREC=bc_prec, EXACT=interpreting(), GDC=pdl["GDC"], num_warps=1))
    launches.append(record(_verify_kernel, grid, row)(
        x, dt, A, B, C, D, dt_bias, zz, y, idx, rs.cursor.shape[0],
        rs.cursor, rs.x, rs.B, rs.dt, rd_d, rd_s, *descs, gram,
        P, N, L, H // G,
        x.stride(0), x.stride(1), x.stride(2), dt.stride(0), dt.stride(1),
        B.stride(0), B.stride(1), B.stride(2), C.stride(0), C.stride(1), C.stride(2),
        zz.stride(0), zz.stride(1), zz.stride(2), y.stride(0), y.stride(1), y.stride(2),
        *buffer_strides(rs), *ckpt_strides(rs),
        T=T, BLOCK_T=block_t, BLOCK_P=block_p, TAIL_P=tail, BLOCK_N=block_n, BLOCK_L=bl,
        HAS_Z=z is not None, HAS_IDX=state_indices is not None, RD_SCALE=rd_has,
        S_PREC=ov.get("s_prec", state_precision(rd.data.dtype, C.dtype, y.dtype, f32)),
        BC_PREC=bc_prec, PRE_GRAM=pre_gram, **wait,
        X_PREC=ov.get("x_prec", "split3b" if rs.x.dtype == torch.bfloat16 else options.fold_dot_precision),
        EARLY_BUF=bool(early_buf), EXACT=interpreting(), TMA=tma, num_warps=ov.get("warps", warps),
        GDC=pdl["GDC"], **({"maxnreg": int(ov["maxnreg"])} if ov.get("maxnreg") else {})))
    if refresh and rs.lo is not None and rs.routed:     # low copies the small-batch route left stale
        launches = plan_refresh_lo(rs, state_indices, bsz) + launches
    elif refresh and rs.deferred:     # the deferred route's epoch bits: the verify reads plain counts
        launches = [plan_clear_bits(rs, state_indices, bsz)] + launches
    return launches, y
