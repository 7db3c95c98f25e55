"""How fast can a Triton program stream a state tile that it only reads? (H200 study tool.)

The replay step's output path reads each [rows, N] checkpoint tile once, multiplies it by a
vector and writes one value per row. This probe times that pattern alone, at the shapes of
the replay kernels (1 GiB of fp32 or bf16 state, tiles of `rows` x N), three ways:

  oneshot      one program per tile (the shipped replay kernels' grid);
  persist      a persistent grid (`progs` programs per SM) looping over tiles with
               tl.range(num_stages=stages) (Triton's software pipeliner);
  persist-db   a persistent grid with an explicit register double buffer (the next tile's
               load is issued before the current one is reduced);
optionally through a slot index (`indirect`: the tile's address needs a load first, as a
serving batch's state_indices do). The copy ceiling is torch.add(x, 0, out=y) in the same
run. Prints one line per variant: time, achieved read bandwidth, % of the copy ceiling.

    python3 tools/stream_probe.py [--gib 1] [--n 128] [--dtype fp32] [--indirect]
    python3 tools/stream_probe.py --lite 256,128,64,128,8     (Super dims; Nano: 256,96,80,128,8)

--lite times the output path of a Mamba-2 replay step (_lite: checkpoint tile . C plus the
buffer's terms, no flush) with HPP heads of a group per program, beside the shipped step.
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def _tile_addr(idx_ptr, t, TPB, INDIRECT: tl.constexpr):
    """Index of tile t in the state: t itself, or (INDIRECT) through its batch row's slot."""
    if INDIRECT:
        return tl.load(idx_ptr + t // TPB).to(tl.int64) * TPB + t % TPB
    return t


@triton.jit
def _reduce_store(S, c_ptr, y_ptr, t, TPB, N: tl.constexpr, BP: tl.constexpr):
    """y[t * BP + rows] = S [BP, N] . C[t // TPB] (fp32)."""
    c = tl.load(c_ptr + (t // TPB) * N + tl.arange(0, N)).to(tl.float32)
    tl.store(y_ptr + t * BP + tl.arange(0, BP), tl.sum(S.to(tl.float32) * c[None, :], axis=1))


@triton.jit
def _tile_offsets(N: tl.constexpr, BP: tl.constexpr):
    return tl.arange(0, BP)[:, None] * N + tl.arange(0, N)[None, :]


@triton.jit
def _oneshot(s_ptr, c_ptr, y_ptr, idx_ptr, TPB, N: tl.constexpr, BP: tl.constexpr, INDIRECT: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    S = tl.load(s_ptr + _tile_addr(idx_ptr, t, TPB, INDIRECT) * BP * N + _tile_offsets(N, BP))
    _reduce_store(S, c_ptr, y_ptr, t, TPB, N, BP)


@triton.jit
def _persist(s_ptr, c_ptr, y_ptr, idx_ptr, ntiles, TPB, N: tl.constexpr, BP: tl.constexpr,
             INDIRECT: tl.constexpr, STAGES: tl.constexpr):
    for t in tl.range(tl.program_id(0), ntiles, tl.num_programs(0), num_stages=STAGES):
        t64 = t.to(tl.int64)
        S = tl.load(s_ptr + _tile_addr(idx_ptr, t64, TPB, INDIRECT) * BP * N + _tile_offsets(N, BP))
        _reduce_store(S, c_ptr, y_ptr, t64, TPB, N, BP)


@triton.jit
def _persist_db(s_ptr, c_ptr, y_ptr, idx_ptr, ntiles, TPB, N: tl.constexpr, BP: tl.constexpr,
                INDIRECT: tl.constexpr):
    offs = _tile_offsets(N, BP)
    step = tl.num_programs(0)
    t = tl.program_id(0).to(tl.int64)
    tile = _tile_addr(idx_ptr, t, TPB, INDIRECT)
    S = tl.load(s_ptr + tile * BP * N + offs, mask=(t < ntiles) & (offs >= 0), other=0.0)
    while t < ntiles:
        tn = t + step
        tile_n = _tile_addr(idx_ptr, tl.minimum(tn, ntiles - 1), TPB, INDIRECT)
        Sn = tl.load(s_ptr + tile_n * BP * N + offs, mask=(tn < ntiles) & (offs >= 0), other=0.0)
        _reduce_store(S, c_ptr, y_ptr, t, TPB, N, BP)
        S = Sn
        t = tn


@triton.jit
def _lite(s_ptr, bx_ptr, bB_ptr, bdt_ptr, C_ptr, A_ptr, cur_ptr, idx_ptr, y_ptr, H, P, G, L,
          N: tl.constexpr, BP: tl.constexpr, BL: tl.constexpr, HPP: tl.constexpr, HPG: tl.constexpr,
          BUF: tl.constexpr, STAGES: tl.constexpr):
    """The output path of a Mamba-2 replay step, without the flush, the append and z: y[b, h, rows] =
    total (S C) + sum_i w_i (B_i . C) x_i, for HPP heads of one group per program (the group's
    B_i . C computed once for them). BUF False: y = S C only (the stream)."""
    pid_p = tl.program_id(0)
    h0 = tl.program_id(1) * HPP
    b = tl.program_id(2).to(tl.int64)
    g = h0 // HPG
    slot = tl.load(idx_ptr + b).to(tl.int64)
    offs_p = pid_p * BP + tl.arange(0, BP)
    offs_n = tl.arange(0, N)
    offs_l = tl.arange(0, BL)
    in_p = offs_p < P
    n = tl.load(cur_ptr + slot)
    mask_l = offs_l < n
    C = tl.load(C_ptr + (b * G + g) * N + offs_n).to(tl.float32)
    if BUF:
        Bb = tl.load(bB_ptr + ((slot * L + offs_l[:, None]) * G + g) * N + offs_n[None, :], mask=mask_l[:, None],
                     other=0.0).to(tl.float32)
        bc = tl.sum(Bb * C[None, :], 1)
    for hh in tl.range(0, HPP, num_stages=STAGES, loop_unroll_factor=1):
        h = h0 + hh
        S = tl.load(s_ptr + ((slot * H + h) * P + offs_p[:, None]) * N + offs_n[None, :], mask=in_p[:, None],
                    other=0.0)
        yv = tl.sum(S * C[None, :], 1)
        if BUF:
            A = tl.load(A_ptr + h)
            dt_i = tl.load(bdt_ptr + (slot * L + offs_l) * H + h, mask=mask_l, other=0.0)
            la = dt_i * A
            w = tl.where(mask_l, dt_i * tl.exp(tl.cumsum(la, 0, reverse=True) - la), 0.0)
            Xb = tl.load(bx_ptr + ((slot * L + offs_l[:, None]) * H + h) * P + offs_p[None, :],
                         mask=mask_l[:, None] & in_p[None, :], other=0.0).to(tl.float32)
            yv = tl.exp(tl.sum(la, 0)) * yv + tl.sum(Xb * (w * bc)[:, None], 0)
        tl.store(y_ptr + (b * H + h) * P + offs_p, yv, mask=in_p)


def lite(batch: int, H: int, P: int, N: int, G: int, L: int = 16) -> None:
    """Time _lite variants beside the shipped replay step (replayssm) at one shape, fp32 state."""
    from replayssm.inputs import Mamba2Shape, mamba2_params, mamba2_step_inputs
    from replayssm.state import Mamba2ReplayState
    from replayssm.triton import mamba2 as tk
    dev = "cuda"
    rs = Mamba2ReplayState.allocate(batch, H, P, N, G, L, L, "replay", "float32", None, torch.bfloat16, dev)
    rs.hi.data.normal_()
    rs.x.normal_()
    rs.B.normal_()
    rs.dt.uniform_(0.01, 0.1)
    rs.cursor.copy_(torch.arange(batch, device=dev, dtype=torch.int32) % L)
    sh = Mamba2Shape(H, P, N, G)
    inp = {k: v.to(dev) for k, v in mamba2_step_inputs(sh, batch).items()}
    prm = {k: v.to(dev) for k, v in mamba2_params(sh).items()}
    idx = torch.randperm(batch, device=dev, dtype=torch.int32)
    state_bytes = rs.hi.data.numel() * 4
    t = triton.testing.do_bench(lambda: tk.replay_step(rs, **inp, **prm, state_indices=idx), warmup=30, rep=200)
    print(f"shipped replay_step b{batch} H{H} P{P}     {t * 1e3:8.1f} us  state read {state_bytes / t / 1e9:6.2f} TB/s",
          flush=True)
    cur = torch.randint(0, L - 1, (batch,), device=dev, dtype=torch.int32)
    y = torch.empty(batch, H, P, device=dev)
    Cin = inp["C"].contiguous()
    for buf, hpps in ((False, (1,)), (True, (1, 2, 4, 8, 16))):
        for hpp in hpps:
            if (H // G) % hpp:
                continue
            for bp, w in ((64, 4), (32, 2), (32, 4), (16, 1)):
                bp = min(bp, triton.next_power_of_2(P))
                for stages in ((1,) if hpp == 1 else (1, 2)):
                    def go(bp=bp, w=w, hpp=hpp, stages=stages):
                        _lite[(triton.cdiv(P, bp), H // hpp, batch)](
                            rs.hi.data, rs.x, rs.B, rs.dt, Cin, prm["A"], cur, idx, y, H, P, G, L, N=N, BP=bp, BL=L,
                            HPP=hpp, HPG=H // G, BUF=buf, STAGES=stages, num_warps=w)
                    try:
                        t = triton.testing.do_bench(go, warmup=30, rep=200)
                    except Exception as e:  # noqa: BLE001
                        print(f"lite buf{int(buf)} hpp{hpp} rows{bp} w{w} s{stages} failed: {str(e)[:100]}")
                        continue
                    print(f"lite buf{int(buf)} hpp{hpp:<2d} rows{bp} w{w} s{stages}         {t * 1e3:8.1f} us  "
                          f"state read {state_bytes / t / 1e9:6.2f} TB/s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="state size in GiB (default 1)")
    ap.add_argument("--n", type=int, default=128, help="state columns N (default 128)")
    ap.add_argument("--tpb", type=int, default=256, help="tiles per batch row (shares one C; default 256)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--indirect", action="store_true", help="also time the slot-indexed variants")
    ap.add_argument("--lite", default="", help="instead: replay-output variants at B,H,P,N,G (e.g. 256,128,64,128,8)")
    args = ap.parse_args()
    if args.lite:
        lite(*(int(v) for v in args.lite.split(",")))
        return
    dt = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    dev = "cuda"
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    elems = int(args.gib * 2**30) // dt.itemsize
    state = torch.randn(elems, device=dev).to(dt)
    x = torch.empty(elems, device=dev, dtype=dt)
    t_copy = triton.testing.do_bench(lambda: torch.add(state, 0, out=x), warmup=50, rep=300)
    copy_bw = 2 * state.numel() * dt.itemsize / t_copy / 1e9
    print(f"copy torch.add {t_copy * 1e3:8.1f} us  {copy_bw:6.2f} TB/s (read + write)", flush=True)
    N = args.n

    def bench(name, rows, launch):
        ntiles = elems // (rows * N)
        nb = triton.cdiv(ntiles, args.tpb)
        c = torch.randn(nb, N, device=dev)
        y = torch.empty(ntiles * rows, device=dev)
        idx = torch.randperm(nb, device=dev, dtype=torch.int32)
        try:
            t = triton.testing.do_bench(lambda: launch(ntiles, c, y, idx), warmup=30, rep=200)
        except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported, not fatal
            print(f"{name:44s} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
            return
        bw = ntiles * rows * N * dt.itemsize / t / 1e9
        print(f"{name:44s} {t * 1e3:8.1f} us  {bw:6.2f} TB/s  {100 * bw / copy_bw:5.1f} % of copy", flush=True)

    for ind in (False, True) if args.indirect else (False,):
        tag = "ind" if ind else "dir"
        for rows, w in ((64, 4), (32, 4), (32, 2), (16, 1), (16, 2), (64, 8)):
            bench(f"oneshot {tag} rows{rows} w{w}", rows, lambda nt, c, y, idx, rows=rows, w=w: _oneshot[(nt,)](
                state, c, y, idx, args.tpb, N=N, BP=rows, INDIRECT=ind, num_warps=w))
        for rows, w in ((64, 4), (32, 4), (16, 2), (16, 1)):
            for progs in (4, 8):
                for stages in (1, 2, 3):
                    bench(f"persist {tag} rows{rows} w{w} p{progs} s{stages}", rows,
                          lambda nt, c, y, idx, rows=rows, w=w, progs=progs, stages=stages: _persist[
                              (min(nt, progs * nsm),)](state, c, y, idx, nt, args.tpb, N=N, BP=rows, INDIRECT=ind,
                                                        STAGES=stages, num_warps=w))
                bench(f"persist-db {tag} rows{rows} w{w} p{progs}", rows,
                      lambda nt, c, y, idx, rows=rows, w=w, progs=progs: _persist_db[(min(nt, progs * nsm),)](
                          state, c, y, idx, nt, args.tpb, N=N, BP=rows, INDIRECT=ind, num_warps=w))


if __name__ == "__main__":
    main()
