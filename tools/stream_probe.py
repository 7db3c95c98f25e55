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

    python3 tools/stream_probe.py [--gib 1] [--n 128] [--dtype fp32]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def _oneshot(s_ptr, c_ptr, y_ptr, idx_ptr, TPB, N: tl.constexpr, BP: tl.constexpr, INDIRECT: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    b = t // TPB
    offs_p = tl.arange(0, BP)
    offs_n = tl.arange(0, N)
    tile = t
    if INDIRECT:
        tile = tl.load(idx_ptr + b).to(tl.int64) * TPB + t % TPB
    S = tl.load(s_ptr + tile * BP * N + offs_p[:, None] * N + offs_n[None, :]).to(tl.float32)
    c = tl.load(c_ptr + b * N + offs_n).to(tl.float32)
    tl.store(y_ptr + t * BP + offs_p, tl.sum(S * c[None, :], axis=1))


@triton.jit
def _persist(s_ptr, c_ptr, y_ptr, idx_ptr, ntiles, TPB, N: tl.constexpr, BP: tl.constexpr,
             INDIRECT: tl.constexpr, STAGES: tl.constexpr):
    offs_p = tl.arange(0, BP)
    offs_n = tl.arange(0, N)
    for t in tl.range(tl.program_id(0), ntiles, tl.num_programs(0), num_stages=STAGES):
        t64 = t.to(tl.int64)
        b = t64 // TPB
        tile = t64
        if INDIRECT:
            tile = tl.load(idx_ptr + b).to(tl.int64) * TPB + t64 % TPB
        S = tl.load(s_ptr + tile * BP * N + offs_p[:, None] * N + offs_n[None, :]).to(tl.float32)
        c = tl.load(c_ptr + b * N + offs_n).to(tl.float32)
        tl.store(y_ptr + t64 * BP + offs_p, tl.sum(S * c[None, :], axis=1))


@triton.jit
def _tile_addr(idx_ptr, t, TPB, INDIRECT: tl.constexpr):
    if INDIRECT:
        return tl.load(idx_ptr + t // TPB).to(tl.int64) * TPB + t % TPB
    return t


@triton.jit
def _persist_db(s_ptr, c_ptr, y_ptr, idx_ptr, ntiles, TPB, N: tl.constexpr, BP: tl.constexpr,
                INDIRECT: tl.constexpr):
    offs_p = tl.arange(0, BP)
    offs_n = tl.arange(0, N)
    offs = offs_p[:, None] * N + offs_n[None, :]
    step = tl.num_programs(0)
    t = tl.program_id(0).to(tl.int64)
    tile = _tile_addr(idx_ptr, t, TPB, INDIRECT)
    S = tl.load(s_ptr + tile * BP * N + offs, mask=(t < ntiles) & (offs >= 0), other=0.0)
    while t < ntiles:
        tn = t + step
        tile_n = _tile_addr(idx_ptr, tl.minimum(tn, ntiles - 1), TPB, INDIRECT)
        Sn = tl.load(s_ptr + tile_n * BP * N + offs, mask=(tn < ntiles) & (offs >= 0), other=0.0)
        c = tl.load(c_ptr + (t // TPB) * N + offs_n).to(tl.float32)
        tl.store(y_ptr + t * BP + offs_p, tl.sum(S.to(tl.float32) * c[None, :], axis=1))
        S = Sn
        t = tn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="state size in GiB (default 1)")
    ap.add_argument("--n", type=int, default=128, help="state columns N (default 128)")
    ap.add_argument("--tpb", type=int, default=256, help="tiles per batch row (shares one C; default 256)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--indirect", action="store_true", help="also time the slot-indexed variants")
    args = ap.parse_args()
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
