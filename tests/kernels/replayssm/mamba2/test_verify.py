"""Mamba-2 speculative verify (replayssm.mamba2.verify, Triton) and its commit against the
exact reference: tiles, the Gram pre-pass, TMA reads, the precision of the state product."""
from __future__ import annotations

import copy

import pytest
import torch

from replayssm import inputs as I
from replayssm import mamba2 as M
from replayssm import reference as R
from replayssm.mamba2.spec import plan_verify, state_precision
from replayssm.state import Mamba2ReplayState

from kernel_checks import DEV, gen, out_tol
from .m2_helpers import BUFFERED, DEVICES, MODEL_DIMS, TINY, cuda_only, graph_of, make_pair, params, resync, \
    state_check, step_inputs, verify_commit_cycles

SPEC_CASES = [
    # id                 mode          state      lo             act             T
    ("replay-f32",       "replay",     "float32", None,          torch.float32,  3),
    ("replay-f32-bf16y", "replay",     "float32", None,          torch.bfloat16, 4),   # bf16x2 state product
    ("dual-fp8",         "dual",       "float32", "float8_e4m3", torch.float32,  2),
    ("shared-low-bf16",  "shared-low", "float32", "bfloat16",    torch.bfloat16, 2),
]


def test_verify_state_precision():
    """The verify's state x C product: a two-pass bf16 split for fp32 states feeding 16-bit
    outputs when C is exact in bf16 (three passes when it is fp16), the fp32 precision option
    for fp32 outputs, plain bf16 MMAs for 16-bit read copies."""
    f32, bf16, f16, fp8 = torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn
    p = BUFFERED.verify_f32_precision
    assert state_precision(f32, bf16, bf16, p) == "bf16x2"
    assert state_precision(f32, bf16, f16, p) == "bf16x2"
    assert state_precision(f32, f16, f16, p) == "bf16x3"
    assert state_precision(f32, f32, f32, p) == p
    assert state_precision(f32, bf16, f32, p) == p
    assert state_precision(bf16, bf16, bf16, p) == "bf16"
    assert state_precision(fp8, bf16, bf16, p) == "bf16"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_verify_commit(device, case):
    """verify T drafts -> commit a random accepted count (device tensor), interleaved with
    plain steps; the commit's flush decision is made on the device."""
    verify_commit_cycles(device, TINY, *case)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", SPEC_CASES[1:3] + [("late-f32", "replay", "float32", None, torch.float32, 3)],
                         ids=[c[0] for c in SPEC_CASES[1:3]] + ["late-f32"])
def test_verify_gram_prepass(device, case):
    """The verify with its Gram matrices from _verify_gram_kernel (a launch ahead of it) instead
    of its own MMAs, early or late buffer loads: the same cycles against the reference."""
    o = BUFFERED.override("verify", gram=True, early_buf=case[0] != "late-f32")
    verify_commit_cycles(device, TINY, *case, options=o)
    rs, _ = make_pair(TINY, 7, 7, 3, "replay", "float32", None, torch.bfloat16, gen(65))
    inp = step_inputs(TINY, 4, torch.bfloat16, gen(66), T=3)
    first, second = plan_verify(rs, **inp, **params(TINY, gen(67)), options=o)[0]
    assert (first.name, second.name, second.meta["PRE_GRAM"]) == ("_verify_gram_kernel", "_verify_kernel", True)


def _kernels(P, H, batch, mode="replay", lo=None, options=None):
    rs = Mamba2ReplayState.allocate(2, H, P, 128, 8, 20, 16, mode=mode, lo_dtype=lo, device="meta")
    inp = I.mamba2_step_inputs(I.Mamba2Shape(H, P, 128, 8), batch, T=4, act_dtype=torch.bfloat16, device="meta")
    prm = I.mamba2_params(I.Mamba2Shape(H, P, 128, 8), device="meta")
    return [launch.name for launch in plan_verify(rs, **inp, **prm, options=options)[0]]


def test_verify_gram_rule():
    """The Gram pre-pass by default only for fp32 read copies whose heads tile without a tail,
    from batch x heads options.verify_pre_gram_min_work; the option and an override win."""
    gram, plain = ["_verify_gram_kernel", "_verify_kernel"], ["_verify_kernel"]
    w = BUFFERED.verify_pre_gram_min_work
    assert _kernels(64, 128, w // 128) == gram and _kernels(64, 128, w // 128 - 1) == plain
    assert _kernels(80, 96, 2 * w // 96) == plain                          # a tail tile
    assert _kernels(64, 128, 2 * w // 128, "dual", "bfloat16") == plain    # 16-bit read copy
    assert _kernels(80, 96, 8, options=BUFFERED.replace(verify_pre_gram=True)) == gram
    assert _kernels(64, 128, 256, options=BUFFERED.override("verify", gram=False)) == plain


def test_verify_tma_follows_the_row():
    """The verify reads its state through TMA descriptors where its table row says (tma None)
    and the copy allows it, by pointers where the row says False; the read copy as [rows, N]
    with the main tile's and the tail's blocks."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    from replayssm.mamba2.table import TABLE
    H, P, N, G, K, T = 96, 80, 128, 8, 16, 4
    sh = I.Mamba2Shape(H, P, N, G)
    p = {k: v.to("meta") for k, v in I.mamba2_params(sh).items()}
    for batch, mode, lo in ((128, "replay", None), (128, "dual", "bfloat16"), (8, "replay", None)):
        rs = Mamba2ReplayState.allocate(batch, H, P, N, G, K + T, K, mode, "float32", lo, torch.bfloat16, "meta")
        inp = {k: v.to("meta") for k, v in I.mamba2_step_inputs(sh, batch, T=T, act_dtype=torch.bfloat16).items()}
        (la,), _ = plan_verify(rs, **inp, **p)
        tma = TABLE.row(la.row).params["tma"] is None
        assert la.meta["TMA"] == tma, (batch, mode)
        descs = [a for a in la.args if isinstance(a, TensorDescriptor)]
        if tma:
            block_p, tail = la.meta["BLOCK_P"], la.meta["TAIL_P"]
            assert [list(d.shape) for d in descs] == [[batch * H * P, N]] * 2
            assert [d.block_shape[0] for d in descs] == [block_p, tail or block_p]
        else:
            assert not descs
    with pytest.raises(ValueError, match="tma"):     # asked where TMA cannot read (rows of 12 bytes)
        rs = Mamba2ReplayState.allocate(4, 2, 8, 3, 1, 6, 4, "replay", "float32", None, torch.bfloat16, "meta")
        sh3 = I.Mamba2Shape(2, 8, 3, 1)
        plan_verify(rs, **{k: v.to("meta") for k, v in I.mamba2_step_inputs(sh3, 4, T=2).items()},
                    **{k: v.to("meta") for k, v in I.mamba2_params(sh3).items()},
                    options=BUFFERED.override("verify", tma=True))


# head dim 20 in a 16-row tile and a 16-row tail (12 rows masked), state columns in two 16-column steps
TAILED = I.Mamba2Shape(nheads=4, head_dim=20, d_state=24, n_groups=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tma", [False, True], ids=["loads", "tma"])
def test_verify_tail_tile(device, tma):
    """A whole head per program as a block_p tile plus a tail tile (Nano's 80 rows = 64 + 16):
    the plan's tiles, then verify + commit cycles against the reference; the state chunks by
    pointer loads or through TMA descriptors (the tail's rows 20-31 then read the next head's)."""
    o = BUFFERED.override("verify", block_p=16, whole=True, chunk_n=16, tma=tma)
    rs, _ = make_pair(TAILED, 7, 7, 3, "replay", "float32", None, torch.bfloat16, gen(61))
    inp = step_inputs(TAILED, 4, torch.bfloat16, gen(62), T=4)
    (launch,), _ = plan_verify(rs, **inp, **params(TAILED, gen(63)), options=o)
    assert launch.grid == (1, TAILED.nheads, 4) and launch.meta["TAIL_P"] == 16
    verify_commit_cycles(device, TAILED, "tail-f32-bf16y", "replay", "float32", None, torch.bfloat16, 4, options=o)
    verify_commit_cycles(device, TAILED, "tail-dual-bf16", "dual", "float32", "bfloat16", torch.bfloat16, 3, options=o)


@cuda_only
@pytest.mark.parametrize("model,batch,mode,lo,act", [
    ("nemotron-3-super-120b", 16, "dual", "float8_e4m3", torch.float32),
    # Nano's whole-head verify (64 + 16 rows) with the bf16x2 state product: the large bucket
    ("nemotron-3-nano-4b", 24, "replay", None, torch.bfloat16),
    # Super fp32 at batch 128: the Gram pre-pass ahead of the verify
    ("nemotron-3-super-120b", 128, "replay", None, torch.bfloat16)],
    ids=["super-dual-fp8", "nano-f32-bf16y", "super-f32-gram"])
def test_cuda_graph_spec(model, batch, mode, lo, act):
    """verify + commit captured together (accepted counts from a device tensor), 64 rounds."""
    from kernel_checks import rel_err
    shape = MODEL_DIMS[model]
    T, K, L = 3, 8, 11
    g = gen(82)
    p = params(shape, g)
    rs, rr = make_pair(shape, batch, L, K, mode, "float32", lo, act, g)
    idx = torch.arange(batch, device=DEV, dtype=torch.int32)
    static = step_inputs(shape, batch, act, g, T=T)
    acc = torch.zeros(batch, dtype=torch.int32, device=DEV)
    out = torch.empty_like(static["x"])
    scratch = copy.deepcopy(rs)

    def round_(r):
        M.verify(r, **static, **p, state_indices=idx, out=out)
        M.commit(r, acc, state_indices=idx, A=p["A"])

    graph = graph_of(lambda: round_(scratch))
    with torch.cuda.graph(graph):
        round_(rs)
    for t in range(64):
        new = step_inputs(shape, batch, act, g, T=T)
        for k, v in new.items():
            static[k].copy_(v)
        acc.copy_(torch.randint(0, T + 1, (batch,), generator=g).to(torch.int32))
        graph.replay()
        yr = R.mamba2_verify(rr, **new, **p, state_indices=idx)
        R.mamba2_commit(rr, p["A"], acc, state_indices=idx)
        assert rel_err(out, yr) <= out_tol(act), f"spec round {t}"
        state_check(rs, rr, f"spec round {t}")
        resync(rs, rr)
