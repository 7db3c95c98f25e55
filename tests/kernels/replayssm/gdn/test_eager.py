"""GDN eager step (gdn/eager.py) against the reference."""
from __future__ import annotations

import pytest
import torch

from replayssm import inputs as I
from replayssm import reference as R

from kernel_checks import DEV, TOL_F32, gen, out_tol, poisoned, rel_err
from .checks import GD, GQA, TINY, ULP, step_inputs


# ----------------------------------------------------------------------------- eager
@pytest.mark.parametrize("config", [{"BLOCK_V": 4},
                                    # two tiles a program, no eviction hints: dv 10 leaves the second
                                    # program's second tile wholly masked
                                    {"BLOCK_V": 4, "TILES": 2, "LOAD_EV": "", "STORE_EV": "evict_last"}],
                         ids=["tile", "tiles2"])
@pytest.mark.parametrize("state_dtype,act", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                             (torch.float16, torch.float32)], ids=["f32", "bf16", "f16-state"])
def test_eager_matches_reference(state_dtype, act, config):
    g = gen(1)
    sh = GQA
    Hk, Hv, dk, dv = sh.num_k_heads, sh.num_v_heads, sh.head_k_dim, sh.head_v_dim
    st = I.random_state(6, Hv, dv, dk, dtype=state_dtype, device=DEV, gen=g)
    st_ref = st.clone()
    idx = torch.tensor([4, -1, 0, 2], dtype=torch.int32, device=DEV)
    for step in range(2):
        x = step_inputs(sh, 4, act, g)
        if step == 1:   # strided q/k/v views of one packed projection, as the decode layer passes them
            packed = torch.cat([x["q"].flatten(1), x["k"].flatten(1), x["v"].flatten(1)], 1)
            x["q"] = packed[:, :Hk * dk].view(4, Hk, dk)
            x["k"] = packed[:, Hk * dk:2 * Hk * dk].view(4, Hk, dk)
            x["v"] = packed[:, 2 * Hk * dk:].view(4, Hv, dv)
        out = poisoned(torch.empty(4, Hv, dv, dtype=act, device=DEV))
        o = GD.eager_step(st, **x, state_indices=idx, out=out, config=config)
        o_ref = R.gdn_eager_step(st_ref, **x, state_indices=idx)
        assert o is out
        assert rel_err(o, o_ref) <= out_tol(act), f"step {step}: {rel_err(o, o_ref):.3g}"
        assert (o[1] == 0).all(), "padded row must be 0"
        if state_dtype == torch.float32:
            assert rel_err(st, st_ref) <= TOL_F32
        else:
            bad = (st.double() - st_ref.double()).abs() > 2 * ULP[state_dtype] * st_ref.double().abs() + 1e-6
            assert not bad.any()
            st_ref.copy_(st)
        assert torch.equal(st[[1, 3, 5]], st_ref[[1, 3, 5]]), "untouched slots changed"


def test_eager_config_errors_name_the_key():
    st = torch.zeros(2, TINY.num_v_heads, TINY.head_v_dim, TINY.head_k_dim, device=DEV)
    x = step_inputs(TINY, 2, torch.float32, gen(3))
    with pytest.raises(ValueError, match="TILES=3: allowed 1, 2"):
        GD.eager_step(st, **x, config={"TILES": 3})
    with pytest.raises(ValueError, match="LOAD_EV='evict_normal'"):
        GD.eager_step(st, **x, config={"LOAD_EV": "evict_normal"})


def test_eager_default_config_and_no_indices():
    g = gen(2)
    st = I.random_state(3, TINY.num_v_heads, TINY.head_v_dim, TINY.head_k_dim, device=DEV, gen=g)
    st_ref = st.clone()
    x = step_inputs(TINY, 3, torch.float32, g)
    o = GD.eager_step(st, **x, scale=0.3)
    o_ref = R.gdn_eager_step(st_ref, **x, scale=0.3)
    assert rel_err(o, o_ref) <= TOL_F32 and rel_err(st, st_ref) <= TOL_F32
