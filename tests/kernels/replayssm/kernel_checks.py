"""What the Triton kernel tests share (mamba2, gdn, common): the device, tolerances and
the comparison against the reference. Tests run on CUDA when present, else under Triton's CPU
interpreter (tests/conftest.py sets TRITON_INTERPRET)."""
from __future__ import annotations

import torch

from replayssm.state import CURSOR_MASK, EPOCH_SHIFT, LO_STALE

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
TOL_F32 = 1e-4        # fp32 outputs / state (the output-only route reorders sums)
TOL_BF16_OUT = 8e-3   # bf16 outputs: one bf16 rounding (2^-8) relative to the largest element


def spills_allowed(base: dict, by_triton: dict) -> dict:
    """The offline compile tests' spill allowance (launch name -> bytes): `base`, plus the entries
    of `by_triton` whose key ("3.7.") prefixes the installed Triton's version."""
    import triton
    extra = [v for k, v in by_triton.items() if triton.__version__.startswith(k)]
    return {**base, **(extra[0] if extra else {})}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (norm-wise relative error, fp64 on a's device); a non-finite
    kernel value (an unwritten element of a NaN-poisoned output) fails."""
    a, b = a.double(), b.double().to(a.device)
    assert torch.isfinite(a).all(), "non-finite values in the kernel result (unwritten element?)"
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def out_tol(act) -> float:
    """Tolerance of an output in activation dtype `act`."""
    return TOL_F32 if act in (torch.float32, torch.float64) else TOL_BF16_OUT


def poisoned(like: torch.Tensor) -> torch.Tensor:
    """An output buffer full of NaN: any element a kernel does not write fails rel_err."""
    return torch.full_like(like, float("nan"))


def random_rows(slots: int, batch: int, g, pad_p: float = 0.25) -> torch.Tensor:
    """state_indices: distinct slots, some rows padded (-1)."""
    idx = torch.randperm(slots, generator=g)[:batch].to(torch.int32)
    idx[torch.rand(batch, generator=g) < pad_p] = -1
    return idx.to(DEV)


def epoch_of(c: torch.Tensor) -> torch.Tensor:
    """The deferred small-batch route's epoch in cursor words c (state.py)."""
    return (c >> EPOCH_SHIFT) & 127


def check_route_words(rs, rr, before: torch.Tensor, live: torch.Tensor, deferred: bool, rk: int, what: str) -> int:
    """Cursor words after one op of a deferred-route test: counts and stale bits as the
    reference's (the epoch is the kernel's own), slots outside the batch untouched, and the
    epochs: after a deferred route step (period rk) every live slot's is the next one where
    the word was the route's own, else 1 (the ticket), and route_epoch agrees; after any other
    op 0, or the word as it was (the every-step route at count 0). before: the words before the
    op; live: the batch's slots. Returns how many live slots moved without a ticket."""
    word = lambda c: c & (CURSOR_MASK | LO_STALE)   # noqa: E731
    assert torch.equal(word(rs.cursor), word(rr.cursor)), f"{what}: cursors"
    out = torch.ones(rs.cursor.shape[0], dtype=torch.bool, device=rs.cursor.device)
    out[live] = False
    assert torch.equal(rs.cursor[out], before[out]), f"{what}: a slot outside the batch moved"
    if not deferred:
        kept = (epoch_of(rs.cursor) == 0) | (rs.cursor == before)
        assert kept[live].all(), f"{what}: another op stored an epoch"
        return 0
    e0, n0 = epoch_of(before[live]), before[live] & CURSOR_MASK
    coherent = (e0 != 0) & (n0 < rk)
    want = torch.where(coherent, e0 % 127 + 1, torch.ones_like(e0))
    assert torch.equal(epoch_of(rs.cursor[live]), want), f"{what}: epochs"
    assert (rs.route_epoch[live].long() == want[:, None, None]).all(), f"{what}: route_epoch"
    return int(coherent.sum())


def check_epoch_wrap(rs, rr, step, ckpt_check) -> None:
    """The deferred route (period 2) over slots 0-2, whose counts the caller has left at 0 in both
    states: slot 0's word and recorded epochs set to 127 here (the next store wraps to 1, never
    0), slot 1's word to epoch 5 with epochs recorded at 9 (stale: not taken for a sibling's
    store, so the ticket and epoch 1), slot 2's word 0. step(): one route step of both states,
    returning (kernel output, reference output), bf16 activations; ckpt_check: the family's
    checkpoint comparison."""
    rs.cursor[:3] = torch.tensor([127 << EPOCH_SHIFT, 5 << EPOCH_SHIFT, 0], dtype=torch.int32)
    rs.route_epoch[0] = 127
    rs.route_epoch[1] = 9
    for i in range(3):
        o, o_ref = step()
        assert rel_err(o, o_ref) <= out_tol(torch.bfloat16), f"step {i}"
        assert torch.equal(rs.cursor & CURSOR_MASK, rr.cursor & CURSOR_MASK), f"step {i}: counts"
        ckpt_check(rs.hi, rr.hi, f"step {i}: hi")
        if i == 0:
            assert epoch_of(rs.cursor[:3]).tolist() == [1, 1, 1]
    assert epoch_of(rs.cursor[:3]).tolist() == [3, 3, 3]
    assert (rs.route_epoch[:3] == 3).all()
