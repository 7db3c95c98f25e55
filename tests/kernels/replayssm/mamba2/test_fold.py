"""Mamba-2 fold: flush and commit (replayssm.mamba2.flush / commit, Triton) against the exact
reference, through the commit's two routes (listed rows, one program per row)."""
from __future__ import annotations

import pytest
import torch

from replayssm import mamba2 as M
from replayssm import reference as R
from replayssm.mamba2.fold import plan_commit
from replayssm.state import Mamba2ReplayState

from kernel_checks import gen, out_tol, poisoned, rel_err
from .m2_helpers import BUFFERED, DEVICES, TINY, low_precision, make_pair, params, resync, state_check, step_inputs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode,lo", [("replay", None), ("dual", "float8_e4m3")])
def test_flush(device, mode, lo):
    g = gen(50)
    rs, rr = make_pair(TINY, 7, 5, 4, mode, "float32", lo, torch.float32, g, cursor_lo=0)
    rs.cursor[2] = rr.cursor[2] = 0                       # a slot with nothing to fold
    A = params(TINY, g)["A"]
    slots = torch.tensor([2, -1, 5, 0], dtype=torch.int32, device=device)
    M.flush(rs, slots, A=A)
    R.mamba2_flush(rr, A, slots[slots >= 0].long())
    state_check(rs, rr, "flush(slots)")
    if low_precision(rs):
        resync(rs, rr)
    M.flush(rs, A=A)
    R.mamba2_flush(rr, A)
    state_check(rs, rr, "flush(all)")
    assert (rs.cursor == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("listed,rounds", [(True, 8), (False, 8)], ids=["list", "per-row"])
def test_commit_routes_long_horizon(device, listed, rounds):
    """Rounds of verify + commit with random accepts 0..T per row over random row subsets
    (padded rows too) through the commit's two routes: the folding rows listed and folded by
    NW workers per head (options.commit_list, the default) and one fold program per row.
    Outputs, cursors and checkpoints stay the reference's; many folds, several in one commit."""
    o = BUFFERED.override("fold", list=listed)
    T, K, slots, batch = 3, 4, 9, 6
    g = gen(64)
    rs, rr = make_pair(TINY, slots, K + T, K, "replay", "float32", None, torch.bfloat16, g)
    p = params(TINY, g)
    folds = multi = 0
    for rnd in range(rounds):
        idx = torch.randperm(slots, generator=g)[:batch].to(torch.int32)
        idx[torch.rand(batch, generator=g) < 0.2] = -1
        idx = idx.to(device)
        inp = step_inputs(TINY, batch, torch.bfloat16, g, T=T)
        y = M.verify(rs, **inp, **p, state_indices=idx, out=poisoned(inp["x"]), options=o)
        assert rel_err(y, R.mamba2_verify(rr, **inp, **p, state_indices=idx)) <= out_tol(torch.bfloat16), rnd
        acc = torch.randint(0, T + 1, (batch,), generator=g).to(device=device, dtype=torch.int32)
        live = idx >= 0
        n = int((rr.cursor[idx[live].long()] + acc[live] >= K).sum())
        folds, multi = folds + n, multi + (n > 1)
        assert (plan_commit(rs, p["A"], acc, idx, options=o)[0].name == "_commit_list_kernel") == listed
        M.commit(rs, acc, state_indices=idx, A=p["A"], options=o)
        R.mamba2_commit(rr, p["A"], acc, state_indices=idx)
        state_check(rs, rr, f"round {rnd}")
    assert folds >= rounds * 3 // 4 and multi >= rounds // 8, (folds, multi)


def test_commit_list_plan():
    """The listed commit's launches up to options.commit_list_max (128) rows: one list program
    over the batch, then the fold with NW = cdiv(rows * T, K) workers per head tile (T =
    capacity - K), NT rank slots each, both programmatic dependent launches; above it the per-row
    fold and the cursor pass."""
    H, P, N, G, K, T = 96, 80, 128, 8, 16, 4
    for batch, nw in ((128, 32), (100, 25), (3, 1), (256, None)):
        rs = Mamba2ReplayState.allocate(batch, H, P, N, G, K + T, K, "replay", "float32", None, torch.bfloat16,
                                        "meta")
        acc = torch.empty(batch, dtype=torch.int32, device="meta")
        first, second = plan_commit(rs, torch.empty(H, device="meta"), acc)
        if nw is None:
            assert (first.name, second.name, first.grid[2]) == ("_fold_kernel", "_cursor_kernel", batch)
            assert first.row.startswith("fold.")
            continue
        assert first.name == "_commit_list_kernel" and first.grid == (1,)
        assert second.grid[1:] == (H, nw) and second.meta["LIST"] and second.meta["NT"] == -(-batch // nw), batch
        # both programmatic dependent launches (PDL; 'meta' plans stand for the H200)
        assert all(p.meta["GDC"] and p.meta["launch_pdl"] for p in (first, second))
    off = BUFFERED.replace(pdl=False, commit_list_max=2)
    first, second = plan_commit(rs, torch.empty(H, device="meta"), torch.empty(3, dtype=torch.int32, device="meta"),
                                options=off)
    assert (first.name, second.name) == ("_fold_kernel", "_cursor_kernel")
