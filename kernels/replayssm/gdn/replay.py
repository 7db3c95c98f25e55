"""The ReplaySSM replay step: the output from the read checkpoint plus the buffered entries,
and the new entry appended (gdn_replay_kernel); fused with the flush (ticket cursor) or, SPLIT,
followed by the flush step (flush_step.py).

A program owns HP value heads of one key head x NR chunks of BLOCK_R rows and loops over them,
so the per-sequence work (cursor, q/k norms, buffered keys, decay weights) is done once per
program. Ticket cursor: every program of a sequence takes the cursor with one relaxed
atomic_add(cursor, TICKET); the one that draws ticket nprog - 1 knows all others have read it and
stores the new word. Needs L < 256 and nprog < 32768."""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.jit import cast, gdc_release, prefetch_hint
from ..common.mma import bf16_split3
from .jit import TICKET, CUR_MASK, STALE_BIT, ckpt_store, hint_chunk


# fp16 read copies (RD_MMA): k and q scaled by 2^12 before their split into fp16 terms, so the
# third term of a unit-norm vector stays clear of fp16's subnormals (undone exactly by 2^-12)
_F16_KQ_SCALE = tl.constexpr(4096.0)


@triton.jit
def _opaque(x, INTERP: tl.constexpr):
    """int32 identity the compiler cannot see through. Indexing the buffered u rows with it
    hides their contiguity, so their [rows, entries] tile gets a plain layout instead of one
    vectorised along the rows, and Triton then converts the small per-row sums into the state
    chunk's layout rather than the whole chunk into theirs. No-op when interpreting."""
    if not INTERP:
        x = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
    return x


@triton.jit
def _rd_dots(rd_ptr, rd_desc, row, row0, rm, cp, kn_0, kn_1, kn_2, kn_3, qn_0, qn_1, qn_2, qn_3,
             DK: tl.constexpr, PK: tl.constexpr, RD_KIND: tl.constexpr, TMA: tl.constexpr, INTERP: tl.constexpr):
    """(S k, S q) [R] of the state rows `row` [R] (row indices into [*, DK]) of the read copy.

    PK > 1 (16- and 8-bit copies): read as int32 words of PK elements and unpacked to fp32 with
    bit operations (bf16) or cvt (fp16, fp8 e4m3); phase t holds the columns PK j + t and is
    dotted with the matching phase of k and q (kn_t, qn_t). The words are laid out like an
    fp32 tile (16-byte vectors, the row sums within a warp); loaded in their own dtype and
    widened, Triton would move the whole chunk through shared memory into another layout
    (it hoists the layout conversion above the widening). RD_KIND: 0 fp32/fp64, 1 bf16, 2 fp16, 3 fp8.
    TMA: the rows come through rd_desc, a TMA descriptor over the copy as [rows, DK] (fp32) or
    [rows, DK / PK] int32 words, block [R, that width], from row row0 (int32; rows past the head
    are read from the next one and never stored): one copy instruction per chunk and no address
    registers. Under the interpreter fp16 / fp8 words keep their strided loads.
    """
    DW: tl.constexpr = DK // PK
    m2 = rm[:, None] & (cp < DW)[None, :]
    if PK == 1:
        if TMA:
            Sf = rd_desc.load([row0, 0]).to(tl.float32)
        else:
            Sf = tl.load(rd_ptr + row[:, None] * DK + cp[None, :], mask=m2, other=0.0,
                         eviction_policy="evict_first").to(tl.float32)
        Pk = Sf * kn_0[None, :]
        Pq = Sf * qn_0[None, :]
    else:
        if INTERP and RD_KIND != 1:   # no inline asm under the interpreter: strided element loads
            base = rd_ptr + row[:, None] * DK + cp[None, :] * PK
            S0 = tl.load(base, mask=m2, other=0.0).to(tl.float32)
            S1 = tl.load(base + 1, mask=m2, other=0.0).to(tl.float32)
            if PK == 4:
                S2 = tl.load(base + 2, mask=m2, other=0.0).to(tl.float32)
                S3 = tl.load(base + 3, mask=m2, other=0.0).to(tl.float32)
        else:
            if TMA:
                W = rd_desc.load([row0, 0])
            else:
                W = tl.load(rd_ptr.to(tl.pointer_type(tl.int32)) + row[:, None] * DW + cp[None, :], mask=m2, other=0,
                            eviction_policy="evict_first")
            if RD_KIND == 1:
                S0 = (W << 16).to(tl.float32, bitcast=True)
                S1 = (W & -65536).to(tl.float32, bitcast=True)
            elif RD_KIND == 2:
                S0, S1 = tl.inline_asm_elementwise(
                    "{ .reg .b16 a, b; mov.b32 {a, b}, $2; cvt.f32.f16 $0, a; cvt.f32.f16 $1, b; }",
                    "=r,=r,r", [W], dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
            else:
                S0, S1, S2, S3 = tl.inline_asm_elementwise(
                    "{ .reg .b16 lo, hi, a, b, c, d; .reg .b32 x, y; mov.b32 {lo, hi}, $4;"
                    " cvt.rn.f16x2.e4m3x2 x, lo; cvt.rn.f16x2.e4m3x2 y, hi; mov.b32 {a, b}, x; mov.b32 {c, d}, y;"
                    " cvt.f32.f16 $0, a; cvt.f32.f16 $1, b; cvt.f32.f16 $2, c; cvt.f32.f16 $3, d; }",
                    "=r,=r,=r,=r,r", [W], dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True,
                    pack=1)
        Pk = S0 * kn_0[None, :] + S1 * kn_1[None, :]
        Pq = S0 * qn_0[None, :] + S1 * qn_1[None, :]
        if PK == 4:
            Pk += S2 * kn_2[None, :] + S3 * kn_3[None, :]
            Pq += S2 * qn_2[None, :] + S3 * qn_3[None, :]
    return tl.sum(Pk, 1), tl.sum(Pq, 1)


@triton.jit
def _f16_split3(a):
    """(hi, mid, lo) fp16 with a ~= hi + mid + lo: |a - hi - mid - lo| <= 2^-33 |a| while the
    terms are normal fp16 (lo ~ 2^-22 |a| >= 2^-14: |a| >= 2^8, i.e. components of a unit
    vector scaled by _F16_KQ_SCALE down to 2^-4; below, lo's subnormal rounding still errs by
    less than 2^-24 of the scaled vector's norm)."""
    hi = a.to(tl.float16)
    r = a - hi.to(tl.float32)
    mid = r.to(tl.float16)
    return hi, mid, (r - mid.to(tl.float32)).to(tl.float16)


@triton.jit
def _kq_operand(kn, qn, F16: tl.constexpr, INTERP: tl.constexpr):
    """[BLOCK_K, 16] second operand of _rd_dots_mma: columns 0-2 the normalised k [BLOCK_K] as
    three terms of the read copy's dtype (bf16: mma.bf16_split3, their sum is k to 2^-24; fp16
    (F16): _f16_split3 of k * _F16_KQ_SCALE), columns 3-5 q's, the rest 0. In that dtype (fp32
    holding the same values under the interpreter, whose 16-bit dots are wrong)."""
    c = tl.arange(0, 16)[None, :]
    if F16:
        k0, k1, k2 = _f16_split3(kn * _F16_KQ_SCALE)
        q0, q1, q2 = _f16_split3(qn * _F16_KQ_SCALE)
    else:
        k0, k1, k2 = bf16_split3(kn, INTERP, "bf16x3e")
        q0, q1, q2 = bf16_split3(qn, INTERP, "bf16x3e")
    kq = tl.where(c == 0, k0.to(tl.float32)[:, None], 0.0)
    kq = tl.where(c == 1, k1.to(tl.float32)[:, None], kq)
    kq = tl.where(c == 2, k2.to(tl.float32)[:, None], kq)
    kq = tl.where(c == 3, q0.to(tl.float32)[:, None], kq)
    kq = tl.where(c == 4, q1.to(tl.float32)[:, None], kq)
    kq = tl.where(c == 5, q2.to(tl.float32)[:, None], kq)
    if not INTERP:
        kq = kq.to(tl.float16 if F16 else tl.bfloat16)
    return kq


@triton.jit
def _rd_dots_mma(rd_ptr, rd_desc, row, row0, rm, cols, KQ, DK: tl.constexpr, F16: tl.constexpr, TMA: tl.constexpr,
                 INTERP: tl.constexpr):
    """(S k, S q) [R] of the 16-bit read copy's rows `row` as one tensor-core product (RD_MMA):
    the chunk [R, BLOCK_K] (bf16, or fp16 with F16), read through rd_desc (a TMA
    descriptor over the copy as [rows, DK] elements, from row row0) or pointers, times KQ
    (_kq_operand) -> [R, 16] fp32, then k's three columns summed and q's. Every product is
    exact (16 x 16 bits in fp32) and the terms of k and q sum to them within 2^-24, so the dots
    keep fp32 accuracy. The chunk goes from the TMA copy's shared memory straight into the
    MMA: it never occupies registers and is never unpacked, which _rd_dots spends most of its
    registers and instructions on (the 16-bit output launch: 168 registers, 3 programs per SM,
    its warps mostly waiting on their one chunk in flight)."""
    if TMA:
        Sb = rd_desc.load([row0, 0])
    else:
        Sb = tl.load(rd_ptr + row[:, None] * DK + cols[None, :], mask=rm[:, None] & (cols < DK)[None, :], other=0.0,
                     eviction_policy="evict_first")
    if INTERP:
        P = tl.dot(Sb.to(tl.float32), KQ, input_precision="ieee")
    else:
        P = tl.dot(Sb, KQ)
    c = tl.arange(0, 16)[None, :]
    sk = tl.sum(tl.where(c < 3, P, 0.0), 1)
    sq = tl.sum(tl.where((c >= 3) & (c < 6), P, 0.0), 1)
    if F16:
        sk = sk * (1.0 / _F16_KQ_SCALE)
        sq = sq * (1.0 / _F16_KQ_SCALE)
    return sk, sq


@triton.jit
def gdn_replay_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr, n_slots,
    hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, cur_ptr, nxt_ptr, rd_desc,
    sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, sob, soh,
    scale, flush_period, nprog,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, NR: tl.constexpr, HP: tl.constexpr,
    SPLIT: tl.constexpr, PREFETCH: tl.constexpr, PF: tl.constexpr, PF_DIST: tl.constexpr, PK: tl.constexpr,
    RD_KIND: tl.constexpr,
    RD_LPR: tl.constexpr, RD_LS: tl.constexpr, HI_LPR: tl.constexpr, HI_LS: tl.constexpr, U_LPR: tl.constexpr,
    HI_FP8: tl.constexpr, LO_FP8: tl.constexpr, DUAL: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
    GDC: tl.constexpr = False, LOOP_STAGES: tl.constexpr = None, TMA: tl.constexpr = False,
    RD_MMA: tl.constexpr = False,
):
    """One ReplaySSM step. A program owns HP value heads (of one key head) x NR chunks of
    BLOCK_R rows of one sequence and streams its HP * NR chunks (state rows, buffered u rows,
    v) in one loop, with prefetch hints PF_DIST chunks ahead; what does not depend on the rows
    (the cursor ticket, q/k normalisation, the buffered keys and their dot products with k and
    q, every head's decay weights) is computed once per program. The state chunk keeps the
    layout it is loaded in (fp32 tile, or int32 words of a 16/8-bit copy: _rd_dots).

    n = cursor, c_i = g_0 + .. + g_i, C = c_{n-1}, w_i = exp(C - c_i) (i < n; every exponent <= 0).
    Output-only route, per chunk (fp8: the row scale multiplies the dot products):
        acc_k = sum_i w_i (k_i . k) u_i,  acc_q = sum_i w_i (k_i . q) u_i
        u = beta (v - alpha (e^C S_c k + acc_k)),  o = alpha (e^C S_c q + acc_q) + u (k . q)
    writes u and o, appends the entry (position n is read by no program of the launch).
    Flush step (n + 1 >= K), decided per sequence:
      non-dual: the output route, then the chunk is re-read as a plain tile (a cache hit) and
        S_t = alpha (e^C S_c + sum_i w_i u_i k_i^T) + u k^T (an unrolled loop over the entries,
        whose rows the route has just read), written back.
      dual: the HIGH chunks are streamed instead; u_0..u_{n-1} are recomputed against them in
        order (no u computed from the low copy enters the state), then this step eagerly;
        o from the high state; high and low copies written; u not stored (as the reference).
    PREFETCH: the buffer's addresses do not depend on the cursor (rows 0..BLOCK_L-1 are read
    whatever n is and rows >= n are zeroed with where), so these loads issue with the first
    chunk and the ticket instead of after the ticket returns; costs BLOCK_L - n extra rows.
    SPLIT: the output-only route alone (no flush code, which would cost every program registers,
    hence occupancy): a plain read of the cursor, n stored to nxt[b] (-1: padded row) for
    gdn_flush_step_kernel, launched next, which folds, writes the state and moves the cursor.
    Dual flush steps only append here (their output comes from the high copy, in that kernel).
    Dual states flush also where the cursor word says the low copy is stale (LO_STALE, left by
    the eager route; then n = 0): the low copy is refreshed by that flush instead of read.
    GDC (SPLIT): lets that launch, a programmatic dependent, start early (it waits for this one).
    """
    gdc_release(GDC)
    GROUP: tl.constexpr = HV // HK
    RP: tl.constexpr = BLOCK_R * NR
    NRS: tl.constexpr = (DV + RP - 1) // RP
    NJ: tl.constexpr = HP * NR
    RD_FP8: tl.constexpr = LO_FP8 if DUAL else HI_FP8
    pid0 = tl.program_id(0)
    kh = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    hs = pid0 // NRS
    r0 = (pid0 % NRS) * RP
    h0 = kh * GROUP + hs * HP
    ar = tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    cp = tl.arange(0, BLOCK_K // PK)
    hidx = tl.arange(0, HP)
    ei = tl.arange(0, BLOCK_L)
    slot = tl.load(idx_ptr + b)
    slot = tl.where(slot < n_slots, slot, -1)      # past the pool: a no-op row, as padding
    if slot < 0:
        zero = cast(tl.zeros([BLOCK_R], tl.float32), o_ptr.dtype.element_ty, INTERP)
        for j in range(NJ):
            rr = r0 + (j % NR) * BLOCK_R + ar
            tl.store(o_ptr + b * sob + (h0 + j // NR) * soh + rr, zero, mask=rr < DV)
        if SPLIT:
            if (pid0 == 0) & (kh == 0):
                tl.store(nxt_ptr + b, -1)
    else:
        slot64 = slot.to(tl.int64)
        if DUAL:
            rd_ptr = lo_ptr
            rd_sc_ptr = lo_sc_ptr
        else:
            rd_ptr = hi_ptr
            rd_sc_ptr = hi_sc_ptr
        # 1. hints for the first chunks of the read copy (addresses independent of the cursor)
        for c in tl.static_range(PF_DIST):
            if c < NJ:
                hint_chunk(rd_ptr, slot64, h0, r0, c, ar, HV, DV, DK, NR, BLOCK_R, RD_LPR, RD_LS, PF,
                            INTERP)
        # 2. the cursor: SPLIT: plain read (the flush-step kernel moves it); else the ticket
        #    (module docstring): low bits cursor, high bits programs so far
        if SPLIT:
            old = tl.load(cur_ptr + slot64)
        else:
            old = tl.atomic_add(cur_ptr + slot64, TICKET, sem="relaxed")
        # 3. inputs: k, q (whole, and split by column phase for _rd_dots), per-head g, beta
        k_raw = tl.load(k_ptr + b * skb + kh * skh + cols, mask=cmask, other=0.0)
        qn = tl.load(q_ptr + b * sqb + kh * sqh + cols, mask=cmask, other=0.0).to(tl.float32)
        if PK > 1:
            kq_in = k_ptr + b * skb + kh * skh + cp * PK
            qq_in = q_ptr + b * sqb + kh * sqh + cp * PK
            kn_0 = tl.load(kq_in, mask=cp * PK < DK, other=0.0).to(tl.float32)
            kn_1 = tl.load(kq_in + 1, mask=cp * PK + 1 < DK, other=0.0).to(tl.float32)
            qn_0 = tl.load(qq_in, mask=cp * PK < DK, other=0.0).to(tl.float32)
            qn_1 = tl.load(qq_in + 1, mask=cp * PK + 1 < DK, other=0.0).to(tl.float32)
            kn_2, kn_3, qn_2, qn_3 = kn_0, kn_1, qn_0, qn_1
            if PK == 4:
                kn_2 = tl.load(kq_in + 2, mask=cp * PK + 2 < DK, other=0.0).to(tl.float32)
                kn_3 = tl.load(kq_in + 3, mask=cp * PK + 3 < DK, other=0.0).to(tl.float32)
                qn_2 = tl.load(qq_in + 2, mask=cp * PK + 2 < DK, other=0.0).to(tl.float32)
                qn_3 = tl.load(qq_in + 3, mask=cp * PK + 3 < DK, other=0.0).to(tl.float32)
        g2 = tl.load(g_ptr + b * sgb + (h0 + hidx) * sgh).to(tl.float32)       # [HP]
        b2 = tl.load(beta_ptr + b * sbb + (h0 + hidx) * sbh).to(tl.float32)    # [HP]
        # 4. buffer: keys [BL, dk] and decays [HP, BL]
        e = slot64 * L + ei
        if PREFETCH:
            lm = ei < L
        else:
            lm = ei < (old & CUR_MASK)
        kb = tl.load(kb_ptr + (e * HK + kh)[:, None] * DK + cols[None, :], mask=lm[:, None] & cmask[None, :],
                     other=0.0).to(tl.float32)
        G2 = tl.load(gb_ptr + (e * HV)[None, :] + (h0 + hidx)[:, None], mask=lm[None, :], other=0.0).to(tl.float32)
        n = old & CUR_MASK
        do_flush = n + 1 >= flush_period
        if DUAL:    # a stale low copy (left by the eager route) is not read: this step flushes
            do_flush = do_flush | ((old & STALE_BIT) != 0)
        if SPLIT:
            if (pid0 == 0) & (kh == 0):
                tl.store(nxt_ptr + b, old & (STALE_BIT | CUR_MASK))
        else:
            if (old >> 16) == nprog - 1:
                tl.atomic_xchg(cur_ptr + slot64, tl.where(do_flush, 0, n + 1), sem="relaxed")
        em = ei < n
        if PREFETCH:   # rows >= n may hold anything (even non-finite): zero them
            kb = tl.where(em[:, None], kb, 0.0)
            G2 = tl.where(em[None, :], G2, 0.0)
        kn = k_raw.to(tl.float32)
        k_inv = tl.rsqrt(tl.sum(kn * kn, 0) + EPS)
        q_inv = tl.rsqrt(tl.sum(qn * qn, 0) + EPS) * scale
        kn = kn * k_inv
        qn = qn * q_inv
        kq = tl.sum(kn * qn, 0)
        if PK > 1:
            kn_0, kn_1, kn_2, kn_3 = kn_0 * k_inv, kn_1 * k_inv, kn_2 * k_inv, kn_3 * k_inv
            qn_0, qn_1, qn_2, qn_3 = qn_0 * q_inv, qn_1 * q_inv, qn_2 * q_inv, qn_3 * q_inv
        else:
            kn_0, kn_1, kn_2, kn_3, qn_0, qn_1, qn_2, qn_3 = kn, kn, kn, kn, qn, qn, qn, qn
        if RD_MMA:   # k and q as one MMA operand, once per program (_rd_dots_mma)
            KQ = _kq_operand(kn, qn, RD_KIND == 2, INTERP)
        rn = tl.rsqrt(tl.sum(kb * kb, 1) + EPS)                                  # key norms [BL]
        kk_ = tl.sum(kb * kn[None, :], 1) * rn
        kq_ = tl.sum(kb * qn[None, :], 1) * rn
        C2 = tl.sum(G2, 1)                                                      # [HP]
        W2 = tl.where(em[None, :], tl.exp(C2[:, None] - tl.cumsum(G2, 1)), 0.0)  # [HP, BL]
        ec2 = tl.exp(C2)
        a2 = tl.exp(g2)
        ent = slot64 * L + n
        ok = tl.where(n < L, True, False)  # i1 scalar (common/jit.py)
        if PREFETCH:
            um = lm
        else:
            um = em

        if SPLIT and DUAL and do_flush:
            # ---- dual flush step, SPLIT: append v only (the flush-step kernel does the rest)
            for j in range(NJ):
                h = h0 + j // NR
                rr = r0 + (j % NR) * BLOCK_R + ar
                v_c = tl.load(v_ptr + b * svb + h * svh + rr, mask=rr < DV, other=0.0)
                tl.store(vb_ptr + (ent * HV + h) * DV + rr, cast(v_c.to(tl.float32), vb_ptr.dtype.element_ty, INTERP),
                         mask=(rr < DV) & ok)
        elif (not SPLIT) and DUAL and do_flush:
            # ---- dual flush: stream the HIGH chunks, recompute u_i against them, step, write both
            for c in tl.static_range(PF_DIST):
                if c < NJ:
                    hint_chunk(hi_ptr, slot64, h0, r0, c, ar, HV, DV, DK, NR, BLOCK_R, HI_LPR, HI_LS, PF,
                                INTERP)
            for j in range(NJ):
                hh = j // NR
                h = h0 + hh
                rr = r0 + (j % NR) * BLOCK_R + ar
                rm = rr < DV
                row = (slot64 * HV + h) * DV + rr
                cn = j + PF_DIST
                if cn < NJ:
                    hint_chunk(hi_ptr, slot64, h0, r0, cn, ar, HV, DV, DK, NR, BLOCK_R, HI_LPR, HI_LS, PF,
                                INTERP)
                # this chunk's raw v rows: the entry loop below reads them (hinted into L1 now)
                if not INTERP:
                    prefetch_hint(vb_ptr, ((slot64 * L + ei) * HV + h) * DV + r0 + (j % NR) * BLOCK_R, 1, 1, 2,
                                  INTERP)
                S = tl.load(hi_ptr + row[:, None] * DK + cols[None, :], mask=rm[:, None] & cmask[None, :], other=0.0,
                            eviction_policy="evict_first").to(tl.float32)
                v_c = tl.load(v_ptr + b * svb + h * svh + rr, mask=rm, other=0.0).to(tl.float32)
                sel = hidx == hh
                al_h = tl.sum(tl.where(sel, a2, 0.0), 0)
                bt_h = tl.sum(tl.where(sel, b2, 0.0), 0)
                for i in range(BLOCK_L):     # dynamic: an unrolled loop hoists every entry's loads (registers)
                    i_ok = tl.where(i < n, True, False)  # i1 scalar (common/jit.py)
                    ei_ = (slot64 * L + i) * HV + h
                    ki = tl.load(kb_ptr + ((slot64 * L + i) * HK + kh) * DK + cols, mask=cmask & i_ok,
                                 other=0.0).to(tl.float32)
                    ki = ki * tl.rsqrt(tl.sum(ki * ki, 0) + EPS)
                    vi = tl.load(vb_ptr + ei_ * DV + rr, mask=rm & i_ok, other=0.0).to(tl.float32)
                    # masked: BLOCK_L may exceed L (rows past the slot's, past the tensor for the last)
                    ai = tl.exp(tl.load(gb_ptr + ei_, mask=i_ok, other=0.0).to(tl.float32))
                    bi = tl.load(bb_ptr + ei_, mask=i_ok, other=0.0).to(tl.float32)
                    ui = bi * (vi - ai * tl.sum(S * ki[None, :], 1))
                    S = ai * S + ui[:, None] * ki[None, :]
                u = bt_h * (v_c - al_h * tl.sum(S * kn[None, :], 1))
                S = al_h * S + u[:, None] * kn[None, :]
                o = tl.sum(S * qn[None, :], 1)
                tile = row[:, None] * DK + cols[None, :]
                m2 = rm[:, None] & cmask[None, :]
                ckpt_store(hi_ptr, hi_sc_ptr, tile, row, S, m2, rm, HI_FP8, INTERP)
                ckpt_store(lo_ptr, lo_sc_ptr, tile, row, S, m2, rm, LO_FP8, INTERP)
                tl.store(o_ptr + b * sob + h * soh + rr, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rm)
                tl.store(vb_ptr + (ent * HV + h) * DV + rr, cast(v_c, vb_ptr.dtype.element_ty, INTERP), mask=rm & ok)
        else:
            # ---- output-only route (+ the non-dual fold on flush steps), chunk by chunk
            for j in tl.range(0, NJ, num_stages=LOOP_STAGES):
                hh = j // NR
                h = h0 + hh
                rs = r0 + (j % NR) * BLOCK_R
                rr = rs + ar
                rm = rr < DV
                row = (slot64 * HV + h) * DV + rr
                cn = j + PF_DIST
                if cn < NJ:
                    hn = h0 + cn // NR
                    rsn = r0 + (cn % NR) * BLOCK_R
                    if not INTERP:
                        prefetch_hint(rd_ptr, ((slot64 * HV + hn) * DV + tl.minimum(rsn + ar, DV - 1)) * DK,
                                      RD_LPR, RD_LS, PF, INTERP)
                    if not INTERP:
                        prefetch_hint(ub_ptr, tl.where(um, (e * HV + hn) * DV + rsn, (slot64 * L * HV + hn) * DV + rsn),
                                      U_LPR, 32, PF, INTERP)
                sel = hidx == hh
                w_h = tl.sum(tl.where(sel[:, None], W2, 0.0), 0)
                ec_h = tl.sum(tl.where(sel, ec2, 0.0), 0)
                al_h = tl.sum(tl.where(sel, a2, 0.0), 0)
                bt_h = tl.sum(tl.where(sel, b2, 0.0), 0)
                if RD_FP8:
                    sc_c = tl.load(rd_sc_ptr + row, mask=rm, other=1.0)
                U_c = tl.load(ub_ptr + ((e * HV + h) * DV)[None, :] + (rr if INTERP else _opaque(rr, INTERP))[:, None],
                              mask=um[None, :] & rm[:, None], other=0.0).to(tl.float32)     # [BR, BL]
                v_c = tl.load(v_ptr + b * svb + h * svh + rr, mask=rm, other=0.0).to(tl.float32)
                row0 = ((slot64 * HV + h) * DV + rs).to(tl.int32)    # the chunk's first row (TMA)
                if RD_MMA:
                    skc, sqc = _rd_dots_mma(rd_ptr, rd_desc, row, row0, rm, cols, KQ, DK, RD_KIND == 2, TMA, INTERP)
                else:
                    skc, sqc = _rd_dots(rd_ptr, rd_desc, row, row0, rm, cp, kn_0, kn_1, kn_2, kn_3, qn_0, qn_1, qn_2,
                                        qn_3, DK, PK, RD_KIND, TMA, INTERP)
                if RD_FP8:
                    skc = skc * sc_c
                    sqc = sqc * sc_c
                if PREFETCH:
                    U_c = tl.where(em[None, :], U_c, 0.0)
                bk = tl.sum(U_c * (w_h * kk_)[None, :], 1)
                bq = tl.sum(U_c * (w_h * kq_)[None, :], 1)
                u = bt_h * (v_c - al_h * (ec_h * skc + bk))
                o = al_h * (ec_h * sqc + bq) + u * kq
                if DUAL:
                    tl.store(vb_ptr + (ent * HV + h) * DV + rr, cast(v_c, vb_ptr.dtype.element_ty, INTERP),
                             mask=rm & ok)
                elif not SPLIT:
                    if do_flush:
                        # the checkpoint chunk again (just read: a cache hit), as a plain tile
                        S = tl.load(hi_ptr + row[:, None] * DK + cols[None, :], mask=rm[:, None] & cmask[None, :],
                                    other=0.0).to(tl.float32)
                        if HI_FP8:
                            S = S * sc_c[:, None]
                        S = ec_h * S
                        wrun = 1.0    # w_i = prod_{i < j < n} alpha_j, from the newest entry down
                        for ii in range(BLOCK_L):    # dynamic: an unrolled loop hoists every entry's loads
                            i = BLOCK_L - 1 - ii
                            i_ok = tl.where(i < n, True, False)  # i1 scalar (common/jit.py)
                            ei_ = (slot64 * L + i) * HV + h
                            ki = tl.load(kb_ptr + ((slot64 * L + i) * HK + kh) * DK + cols, mask=cmask & i_ok,
                                         other=0.0).to(tl.float32)
                            ui = tl.load(ub_ptr + ei_ * DV + rr, mask=rm & i_ok, other=0.0).to(tl.float32)
                            ci = tl.where(i_ok, wrun * tl.rsqrt(tl.sum(ki * ki, 0) + EPS), 0.0)
                            S += (ci * ui)[:, None] * ki[None, :]
                            wrun = wrun * tl.exp(tl.load(gb_ptr + ei_, mask=i_ok, other=0.0).to(tl.float32))
                        S = al_h * S + u[:, None] * kn[None, :]
                        ckpt_store(hi_ptr, hi_sc_ptr, row[:, None] * DK + cols[None, :], row, S,
                                    rm[:, None] & cmask[None, :], rm, HI_FP8, INTERP)
                tl.store(ub_ptr + (ent * HV + h) * DV + rr, u, mask=rm & ok)
                tl.store(o_ptr + b * sob + h * soh + rr, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rm)
        # append the rest of entry n: k once per key head, g (and beta) once per head
        if r0 == 0:
            tl.store(gb_ptr + ent * HV + h0 + hidx, g2, mask=ok & (hidx < HP))
            if DUAL:
                tl.store(bb_ptr + ent * HV + h0 + hidx, b2, mask=ok & (hidx < HP))
            if hs == 0:
                tl.store(kb_ptr + (ent * HK + kh) * DK + cols, cast(k_raw.to(tl.float32), kb_ptr.dtype.element_ty,
                                                                    INTERP), mask=cmask & ok)
