"""Speculative verify: the outputs of T drafts from the read checkpoint and the buffer, with no
per-draft state (gdn_verify_kernel). Grid (cdiv(dv, BLOCK_V), Hv, batch)."""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.jit import cast, gdc_release
from ..common.mma import mm, mma_acc
from .jit import unit_tri_inv_minus_eye


@triton.jit
def _verify_dk_loop(rd_ptr, rd_desc, row0, row_off, lrows, k_ptr, q_ptr, kb_ptr, b, kh, ent, lm, dj, kcol, qcol,
                    skb, skt, skh, sqb, sqt, sqh,
                    BLOCK_V: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_K: tl.constexpr,
                    DK: tl.constexpr, HK: tl.constexpr, S_PREC: tl.constexpr, K_PREC: tl.constexpr,
                    TMA: tl.constexpr, INTERP: tl.constexpr):
    """Dots over dk in chunks of BLOCK_K columns (loads feed the MMAs; no tile is ever whole in
    registers), with the drafts packed as one operand P [BP, dk]: rows kcol = the raw draft keys,
    rows qcol = the raw draft queries (one MMA per product where separate k and q operands,
    each padded to 16 rows, took two). Returns SP = S P^T [BV, BP] of the state rows row_off,
    GP = Kb P^T [L, BP] (stored buffer keys), PP = P P^T [BP, BP], the squared norms nP [BP]
    and nkb [L]. TMA: the state chunks come through rd_desc (a TMA descriptor over the read
    copy as [rows, dk], block [BLOCK_V, BLOCK_K]) from row row0 (int32): one copy instruction per
    chunk instead of per-thread vector loads (rows past the head or of a null slot are read
    from wherever they point, never stored)."""
    SP = tl.zeros([BLOCK_V, BLOCK_P], tl.float32)
    GP = tl.zeros([BLOCK_L, BLOCK_P], tl.float32)
    PP = tl.zeros([BLOCK_P, BLOCK_P], tl.float32)
    nP = tl.zeros([BLOCK_P], tl.float32)
    nkb = tl.zeros([BLOCK_L], tl.float32)
    for c0 in tl.range(0, DK, BLOCK_K):
        cols = c0 + tl.arange(0, BLOCK_K)
        cmask = cols < DK
        pk = tl.load(k_ptr + b * skb + dj[:, None] * skt + kh * skh + cols[None, :],
                     mask=kcol[:, None] & cmask[None, :], other=0.0)
        pq = tl.load(q_ptr + b * sqb + dj[:, None] * sqt + kh * sqh + cols[None, :],
                     mask=qcol[:, None] & cmask[None, :], other=0.0)
        P = tl.where(kcol[:, None], pk, pq)
        PT = tl.trans(P)
        if TMA:
            S = rd_desc.load([row0, c0])
        else:
            S = tl.load(rd_ptr + row_off[:, None] * DK + cols[None, :], mask=lrows[:, None] & cmask[None, :],
                        other=0.0, eviction_policy="evict_first")
        SP = mma_acc(S, PT, SP, S_PREC, INTERP)
        kb = tl.load(kb_ptr + (ent * HK + kh)[:, None] * DK + cols[None, :], mask=lm[:, None] & cmask[None, :],
                     other=0.0)
        GP = mma_acc(kb, PT, GP, K_PREC, INTERP)
        PP = mma_acc(P, PT, PP, K_PREC, INTERP)
        pf = P.to(tl.float32)
        kbf = kb.to(tl.float32)
        nP += tl.sum(pf * pf, 1)
        nkb += tl.sum(kbf * kbf, 1)
    return SP, GP, PP, nP, nkb


@triton.jit
def _verify_coefs(GP, PP, nP, nkb, gch, gp, bp, lm, pc, kcol, qcol, scale, T: tl.constexpr, EPS: tl.constexpr,
                  SMALL_PREC: tl.constexpr, INTERP: tl.constexpr):
    """Per (sequence, head) coefficients of the verify solve (see gdn_verify_kernel), over the
    packed draft columns: r [BP] norm factors (q's with the scale), GPw = w * GP * r [L, BP]
    (rows >= n: 0), eC = e^C, eD [BP] = e^{D_j} of each column's draft j, X = (I + M)^-1 - I
    and Mq [BP, BP]."""
    r = tl.rsqrt(nP + EPS) * tl.where(qcol, scale, 1.0)
    c = tl.cumsum(gch, 0)
    Cn = tl.sum(gch, 0)
    w = tl.exp(Cn - c) * tl.rsqrt(nkb + EPS)                                   # exponents <= 0
    GPw = tl.where(lm[:, None], GP * w[:, None], 0.0) * r[None, :]             # stale rows selected away
    PPn = PP * r[:, None] * r[None, :]                                         # k.k, k.q of the normed drafts
    # D_j per column: the k columns' and the q columns' runs summed apart (the same sums)
    D = tl.where(kcol, tl.cumsum(tl.where(kcol, gp, 0.0), 0), tl.cumsum(tl.where(qcol, gp, 0.0), 0))
    ups = (pc[:, None] < pc[None, :]) & kcol[None, :]                          # m < j < T
    upq = kcol[:, None] & qcol[None, :] & (pc[:, None] + T <= pc[None, :])    # draft m <= draft j (q column)
    dec = tl.exp(tl.where(ups | upq, D[None, :] - D[:, None], -float("inf")))  # exponents <= 0
    M = tl.where(ups, bp[None, :] * dec * PPn, 0.0)
    X = unit_tri_inv_minus_eye(M, T, SMALL_PREC, INTERP)
    Mq = tl.where(upq, dec * PPn, 0.0)
    return r, GPw, tl.exp(Cn), tl.exp(D), X, Mq


@triton.jit
def _verify_rows(SP, rows, rmask, lrows, row_off, rd_sc_ptr, ub_ptr, vb_ptr, v_ptr, o_ptr, b, h, ent, lm, pc, dj,
                 kcol, qcol, live, n, slot64, r, GPw, eC, eD, bp, X, Mq,
                 svb, svt, svh, sob, sot, soh, HV: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
                 RD_FP8: tl.constexpr, DUAL: tl.constexpr, SMALL_PREC: tl.constexpr, INTERP: tl.constexpr):
    """Outputs of one row tile from its raw state dots SP [BV, BP]: adds the buffer, solves the
    drafts, stores o and the drafts' u (dual: v) at buffer rows n..n+T-1."""
    if RD_FP8:
        rsc = tl.load(rd_sc_ptr + row_off, mask=lrows, other=1.0)
        SP = SP * rsc[:, None]
    Vd = tl.load(v_ptr + b * svb + dj[None, :] * svt + h * svh + rows[:, None], mask=lrows[:, None] & kcol[None, :],
                 other=0.0).to(tl.float32)                                     # [BV, BP], k columns
    Ut = tl.load(ub_ptr + (ent[None, :] * HV + h) * DV + rows[:, None], mask=lrows[:, None] & lm[None, :],
                 other=0.0).to(tl.float32)                                     # [BV, BL]
    SPn = eC * (SP * r[None, :]) + mm(Ut, GPw, SMALL_PREC, INTERP)            # S_{n-1} k_j | S_{n-1} q_j
    R = bp[None, :] * (Vd - eD[None, :] * SPn)                                # bp = 0 off the k columns
    Ud = R + mm(R, X, SMALL_PREC, INTERP)                                   # drafts' u = R (I + X) [BV, BP]
    O = tl.where(qcol[None, :], eD[None, :] * SPn, 0.0) + mm(Ud, Mq, SMALL_PREC, INTERP)
    tl.store(o_ptr + b * sob + dj[None, :] * sot + h * soh + rows[:, None], cast(O, o_ptr.dtype.element_ty, INTERP),
             mask=rmask[:, None] & qcol[None, :])
    pos = n + pc
    dent = slot64 * L + pos
    um = lrows[:, None] & (kcol & live & (pos < L))[None, :]
    tl.store(ub_ptr + (dent[None, :] * HV + h) * DV + rows[:, None], Ud, mask=um)
    if DUAL:
        tl.store(vb_ptr + (dent[None, :] * HV + h) * DV + rows[:, None], cast(Vd, vb_ptr.dtype.element_ty, INTERP),
                 mask=um)


@triton.jit
def gdn_verify_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr, n_slots, rd_ptr, rd_sc_ptr, rd_desc,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, cur_ptr,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sgb, sgt, sgh, sbb, sbt, sbh, sob, sot, soh,
    scale,
    T: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr,
    RD_FP8: tl.constexpr, DUAL: tl.constexpr, S_PREC: tl.constexpr, K_PREC: tl.constexpr,
    EARLY_BUF: tl.constexpr, SMALL_PREC: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
    TMA: tl.constexpr = False, GDC: tl.constexpr = False,
):
    """All T draft outputs for [BLOCK_V, dk] state tiles from the read checkpoint and the
    buffer, in matrix form. The drafts are packed as columns of one operand: column j < T is
    draft j's key, column T + j its query (BLOCK_P = max(16, next_pow2(2T)) columns; every
    tile dim >= 16 for tl.dot), so each product with the state or the stored keys is one MMA.

    n = cursor (plain read, not moved); c_i = g_0 + .. + g_i over the buffer, C = c_{n-1};
    D_j = gd_0 + .. + gd_j over the drafts; k, q l2-normalised (q also scaled) by factors
    applied after the raw dots, so the Gram and state MMAs multiply stored values.
        SP = S_c P^T                                               [BV, BP]  (MMA over dk: S_PREC)
        S_{n-1} p = e^C SP + U^T (w * Kb P^T),  w_i = e^{C - c_i}     (every column p)
    Drafts: u_j = beta_j (v_j - e^{D_j} S_{n-1} k_j - sum_{m<j} e^{D_j - D_m} (k_m.k_j) u_m),
    i.e. Ud (I + M) = R with M[m, j] = [m < j < T] beta_j e^{D_j - D_m} (k_m.k_j) strictly
    upper triangular and R[:, j] = beta_j (v_j - e^{D_j} S_{n-1} k_j) (zero off the k columns);
    (I + M)^-1 = (I - M)(I + M^2)... exactly (M^T = 0).
        O[:, T + j] = e^{D_j} (S_{n-1} q_j) + (Ud Mq)[:, T + j],  Mq[m, T + j] = [m <= j] e^{D_j - D_m} (k_m.q_j)
    Grid (row tiles, Hv, batch): one tile per program, its dk loop computing the state dots and
    the (per-head) Gram matrices together, so the state loads go first. EARLY_BUF loads the
    buffer rows < BLOCK_L before the cursor arrives; rows >= n are selected away (never
    multiplied). No per-draft state; drafts written to the buffer at n..n+T-1 (u; k, g once;
    dual: v, beta). TMA: the state chunks through a TMA descriptor (_verify_dk_loop). GDC: lets
    a programmatic dependent launch behind it (the commit's cursor launch) start early.
    """
    gdc_release(GDC)
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    GROUP: tl.constexpr = HV // HK
    kh = h // GROUP
    pc = tl.arange(0, BLOCK_P)
    kcol0 = pc < T
    qcol0 = (pc >= T) & (pc < 2 * T)
    dj = tl.where(kcol0, pc, pc - T)                                           # draft of each column
    ll = tl.arange(0, BLOCK_L)
    slot = tl.load(idx_ptr + b)
    slot = tl.where(slot < n_slots, slot, -1)      # past the pool: a no-op row, as padding
    live = tl.where(slot >= 0, True, False)  # i1 scalar (common/jit.py)
    slot64 = tl.maximum(slot, 0).to(tl.int64)
    kcol = kcol0 & live
    qcol = qcol0 & live
    ent = slot64 * L + ll
    if EARLY_BUF:
        lm = (ll < L) & live
    else:
        n = tl.load(cur_ptr + slot64, mask=live, other=0)
        lm = (ll < n) & live
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < DV
    lrows = rmask & live
    row_off = (slot64 * HV + h) * DV + rows
    row0 = ((slot64 * HV + h) * DV + pid_v * BLOCK_V).to(tl.int32)      # TMA: the tile's first row
    SP, GP, PP, nP, nkb = _verify_dk_loop(
        rd_ptr, rd_desc, row0, row_off, lrows, k_ptr, q_ptr, kb_ptr, b, kh, ent, lm, dj, kcol, qcol,
        skb, skt, skh, sqb, sqt, sqh,
        BLOCK_V, BLOCK_P, BLOCK_L, BLOCK_K, DK, HK, S_PREC, K_PREC, TMA, INTERP)
    gp = tl.load(g_ptr + b * sgb + dj * sgt + h * sgh, mask=kcol | qcol, other=0.0).to(tl.float32)
    bp = tl.load(beta_ptr + b * sbb + dj * sbt + h * sbh, mask=kcol, other=0.0).to(tl.float32)
    gch = tl.load(gb_ptr + ent * HV + h, mask=lm, other=0.0).to(tl.float32)
    if EARLY_BUF:
        n = tl.load(cur_ptr + slot64, mask=live, other=0)
        lm = (ll < n) & live
        gch = tl.where(lm, gch, 0.0)
    r, GPw, eC, eD, X, Mq = _verify_coefs(GP, PP, nP, nkb, gch, gp, bp, lm, pc, kcol, qcol, scale, T, EPS,
                                          SMALL_PREC, INTERP)
    _verify_rows(SP, rows, rmask, lrows, row_off, rd_sc_ptr, ub_ptr, vb_ptr, v_ptr, o_ptr, b, h, ent, lm, pc, dj,
                 kcol0, qcol0, live, n, slot64, r, GPw, eC, eD, bp, X, Mq,
                 svb, svt, svh, sob, sot, soh, HV, DV, L, RD_FP8, DUAL, SMALL_PREC, INTERP)

    # the drafts' g (dual: beta) once per head, raw keys once per key head (re-read: L2 hits)
    pos = n + pc
    pm = kcol & (pos < L)
    dent = slot64 * L + pos
    if pid_v == 0:
        tl.store(gb_ptr + dent * HV + h, gp, mask=pm)
        if DUAL:
            tl.store(bb_ptr + dent * HV + h, bp, mask=pm)
        if h % GROUP == 0:
            for c0 in tl.range(0, DK, BLOCK_K):
                cols = c0 + tl.arange(0, BLOCK_K)
                cm = pm[:, None] & (cols < DK)[None, :]
                kr = tl.load(k_ptr + b * skb + pc[:, None] * skt + kh * skh + cols[None, :], mask=cm, other=0.0)
                tl.store(kb_ptr + (dent * HK + kh)[:, None] * DK + cols[None, :],
                         cast(kr.to(tl.float32), kb_ptr.dtype.element_ty, INTERP), mask=cm)
