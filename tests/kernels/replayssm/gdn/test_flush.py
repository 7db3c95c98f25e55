"""Standalone flush (gdn/fold.py gdn_fold_kernel) against the reference."""
from __future__ import annotations

import pytest
import torch

from replayssm import reference as R

from kernel_checks import DEV, gen
from .checks import GD, TINY, make_pair, state_check


@pytest.mark.parametrize("mode,sd,lo", [("replay", "float32", None), ("dual", "float32", "float8_e4m3"),
                                        ("shared-low", "float32", "bfloat16")], ids=["f32", "dual-fp8", "shared-bf16"])
def test_flush_matches_reference(mode, sd, lo):
    g = gen(6)
    rs, rr = make_pair(TINY, 5, 5, 5, mode, sd, lo, torch.float32, g, cursor_hi=4)
    rs.cursor[1] = rr.cursor[1] = 0          # nothing to fold
    rs.cursor[2] = rr.cursor[2] = 4
    some = torch.tensor([2, 1, 4], device=DEV)
    GD.flush(rs, some, config={"BLOCK_V": 4})
    R.gdn_flush(rr, some)
    state_check(rs, rr, "flush(slots)")
    GD.flush(rs)
    R.gdn_flush(rr)
    state_check(rs, rr, "flush(all)")
    assert (rs.cursor == 0).all()
