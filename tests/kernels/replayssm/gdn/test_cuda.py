"""GDN kernels on a CUDA GPU: the real Qwen3.5 dims and CUDA-graph capture."""
from __future__ import annotations

import copy

import pytest
import torch

from replayssm import inputs as I
from replayssm import reference as R
from replayssm.gdn import plan as TK
from replayssm.gdn.options import GDNOptions

from kernel_checks import CUDA, DEV, TOL_BF16_OUT, TOL_F32, gen, poisoned, random_rows, rel_err
from .checks import GD, SHIPPED, QWEN, ULP, make_pair, opts, state_check, step_inputs


QWEN = {"qwen3.5-4b": I.GDNShape(16, 32, 128, 128), "qwen3.5-122b": I.GDNShape(16, 64, 128, 128)}
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


@cuda_only
@pytest.mark.parametrize("model", list(QWEN))
@pytest.mark.parametrize("batch", [1, 7, 16, 64, 512])   # 16: the dual rows' 64-row MMA chunks
@pytest.mark.parametrize("mode,lo,sd", [("replay", None, "float32"), ("dual", "bfloat16", "float32"),
                                        ("replay", None, "bfloat16"), ("dual", "float8_e4m3", "float32")],
                         ids=["f32", "dual-bf16", "bf16-state", "dual-fp8"])
def test_real_dims(model, batch, mode, lo, sd):
    sh = QWEN[model]
    g = gen(8)
    K, L, T = 4, 8, 4
    rs, rr = make_pair(sh, batch, L, K, mode, sd, lo, torch.bfloat16, g)
    st = I.random_state(batch, sh.num_v_heads, sh.head_v_dim, sh.head_k_dim, device=DEV, gen=g)
    st_ref = st.clone()
    idx = torch.arange(batch, dtype=torch.int32, device=DEV).flip(0)
    if batch > 1:
        idx[1] = -1
    for step in range(K + 1):
        x = step_inputs(sh, batch, torch.bfloat16, g)
        o = GD.eager_step(st, **x, state_indices=idx, out=poisoned(x["v"]))
        assert rel_err(o, R.gdn_eager_step(st_ref, **x, state_indices=idx)) <= TOL_BF16_OUT
        o = GD.replay_step(rs, **x, state_indices=idx, out=poisoned(x["v"]))
        assert rel_err(o, R.gdn_replay_step(rr, **x, state_indices=idx)) <= TOL_BF16_OUT
        state_check(rs, rr, f"step {step}")
    assert rel_err(st, st_ref) <= TOL_F32
    x = step_inputs(sh, batch, torch.bfloat16, g, T=T)
    o = GD.verify(rs, **x, state_indices=idx, out=poisoned(x["v"]))
    assert rel_err(o, R.gdn_verify(rr, **x, state_indices=idx)) <= TOL_BF16_OUT
    acc = torch.randint(0, T + 1, (batch,), generator=g).to(DEV)
    GD.commit(rs, acc, idx)
    R.gdn_commit(rr, acc, idx)
    state_check(rs, rr, "commit")


@cuda_only
@pytest.mark.parametrize("model", list(QWEN))
@pytest.mark.parametrize("batch", [256, 512])     # 512: two tiles a program, no eviction hints
def test_eager_bf16_state_real_dims(model, batch):
    sh = QWEN[model]
    g = gen(9)
    st = I.random_state(batch, sh.num_v_heads, sh.head_v_dim, sh.head_k_dim, dtype=torch.bfloat16, device=DEV, gen=g)
    st_ref = st.clone()
    idx = torch.arange(batch, dtype=torch.int32, device=DEV).flip(0)
    idx[3] = -1
    for step in range(3):
        x = step_inputs(sh, batch, torch.bfloat16, g)
        o = GD.eager_step(st, **x, state_indices=idx, out=poisoned(x["v"]))
        assert rel_err(o, R.gdn_eager_step(st_ref, **x, state_indices=idx)) <= TOL_BF16_OUT, f"step {step}"
        assert (o[3] == 0).all(), "padded row must be 0"
        bad = (st.double() - st_ref.double()).abs() > 2 * ULP[torch.bfloat16] * st_ref.double().abs() + 1e-6
        assert not bad.any(), f"step {step}: {int(bad.sum())} state elements off by > 2 ulp"
        st_ref.copy_(st)


@cuda_only
@pytest.mark.parametrize("model", list(QWEN))
@pytest.mark.parametrize("mode,sd,lo", [("dual", "float32", "bfloat16"), ("replay", "bfloat16", None),
                                        ("dual", "float32", "float16")], ids=["dual-bf16", "bf16-state", "dual-f16"])
@pytest.mark.parametrize("cfg", [{"RD_MMA": False}, {"RD_MMA": True, "num_stages": 1},
                                 {"RD_MMA": True, "num_stages": 1, "BLOCK_V": 64, "NR": 2, "maxnreg": 80}],
                         ids=["unpacked", "mma", "mma-64x2"])
def test_16bit_read_dots_keep_fp32_accuracy(model, mode, sd, lo, cfg):
    # RD_MMA: the read copy's S k and S q as 16-bit tensor-core products (wgmma at
    # these tiles) with k and q as three 16-bit terms, against the reference with fp32 activations,
    # so no output rounding hides an error of the dots: as tight as the unpacking route's
    sh = QWEN[model]
    g = gen(21)
    batch = 128
    rs, rr = make_pair(sh, batch, 16, 16, mode, sd, lo, torch.float32, g)
    row = TK.pick("replay", opts(), batch=batch, heads=sh.num_v_heads, dv=sh.head_v_dim, dk=sh.head_k_dim, L=16,
                  state_bytes=2, dual=mode == "dual")
    row = {k: v for k, v in row.items() if k in GDNOptions.TUNABLE["replay"]}
    for step in range(3):
        x = step_inputs(sh, batch, torch.float32, g)
        o = GD.replay_step(rs, **x, out=poisoned(x["v"]), config={**row, **cfg})
        err = rel_err(o, R.gdn_replay_step(rr, **x))
        assert err <= TOL_F32, f"step {step}: {err:.3g}"
        state_check(rs, rr, f"step {step}")


@cuda_only
@pytest.mark.parametrize("mode,lo,batch", [("replay", None, 12), ("dual", "float8_e4m3", 12), ("replay", None, 24),
                                           ("dual", "bfloat16", 24)],
                         ids=["f32", "dual-fp8", "f32-b24", "dual-bf16-b24"])
def test_cuda_graph_replay_steps(mode, lo, batch):
    """Capture one replay step in a CUDA graph; replay 72 steps (K = 8: flushes at different
    steps per sequence) comparing with the reference step by step. Batch 12: the routes of small
    batches (fp32: the eager route; dual fp8 at 384 heads: the high copy's); 24: the buffered
    SPLIT rows, state chunks through TMA."""
    sh, K = QWEN["qwen3.5-4b"], 8
    g = gen(9)
    rs, rr = make_pair(sh, batch + 4, K, K, mode, "float32", lo, torch.bfloat16, g)
    idx = random_rows(batch + 4, batch, g)
    static = step_inputs(sh, batch, torch.bfloat16, g)
    out = torch.empty_like(static["v"])
    GD.replay_step(rs, **static, state_indices=idx, out=out)      # compile + warm up outside the graph
    R.gdn_replay_step(rr, **static, state_indices=idx)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        GD.replay_step(rs, **static, state_indices=idx, out=out)
    torch.cuda.current_stream().wait_stream(s)
    state_check(rs, rr, "after capture")   # capturing must not have run the step
    for step in range(72):
        x = step_inputs(sh, batch, torch.bfloat16, g)
        for k_, v_ in x.items():
            static[k_].copy_(v_)
        out.fill_(float("nan"))
        graph.replay()
        o_ref = R.gdn_replay_step(rr, **x, state_indices=idx)
        assert rel_err(out, o_ref) <= TOL_BF16_OUT, f"step {step}"
        state_check(rs, rr, f"graph step {step}")


@cuda_only
def test_cuda_graph_dual_route_and_buffered_steps():
    """A dual bf16 state at Qwen3.5-4B's dims driven by two captured steps over overlapping
    slots: the shipped eager route at batch 2 (high copy only, low copy marked stale) and the
    buffered SPLIT step at batch 24, replayed 64 times in a random order: the buffered step
    flushes the rows the route left stale, all on the device. Checked against the reference's
    route semantics after every replay."""
    sh, K, slots = QWEN["qwen3.5-4b"], 8, 28
    g = gen(13)
    rs, rr = make_pair(sh, slots, K, K, "dual", "float32", "bfloat16", torch.bfloat16, g)
    perm = torch.randperm(slots, generator=g).to(device=DEV, dtype=torch.int32)
    idx = {2: perm[:2].clone(), 24: perm[:24].clone()}       # the small batch's slots are in the large one
    idx[24][5] = -1
    static = {b: step_inputs(sh, b, torch.bfloat16, g) for b in idx}
    assert TK.state_route_period(rs, static[2]["k"], static[2]["v"])
    assert not TK.state_route_period(rs, static[24]["k"], static[24]["v"])
    out = {b: torch.empty_like(static[b]["v"]) for b in idx}
    graphs = {}
    for b in idx:
        scratch = copy.deepcopy(rs)
        SHIPPED.replay_step(scratch, **static[b], state_indices=idx[b], out=out[b])    # compile outside the graph
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        graphs[b] = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s), torch.cuda.graph(graphs[b], stream=s):
            SHIPPED.replay_step(rs, **static[b], state_indices=idx[b], out=out[b])
        torch.cuda.current_stream().wait_stream(s)
    order = [2 if r < 0.5 else 24 for r in torch.rand(64, generator=g).tolist()]
    stale_flushed = 0
    for t, b in enumerate(order):
        x = step_inputs(sh, b, torch.bfloat16, g)
        for k_, v_ in x.items():
            static[b][k_].copy_(v_)
        out[b].fill_(float("nan"))
        live = idx[b][idx[b] >= 0].long()
        stale_flushed += int(rr.lo_stale(live).sum()) if b == 24 else 0
        graphs[b].replay()
        o_ref = R.gdn_replay_step(rr, **x, state_indices=idx[b], route=b == 2)
        assert rel_err(out[b], o_ref) <= TOL_BF16_OUT, f"graph step {t} (batch {b})"
        if b == 2:      # rows past the cursor: the reference appended there, the route does not
            for name in ("u", "k", "g", "v", "beta"):
                getattr(rs, name).copy_(getattr(rr, name))
        state_check(rs, rr, f"graph step {t} (batch {b})")
    assert stale_flushed >= 4, stale_flushed


@cuda_only
@pytest.mark.parametrize("mode,lo,batch,T", [("dual", "bfloat16", 8, 4), ("dual", "bfloat16", 8, 6),
                                            ("replay", None, 96, 4)], ids=["dual-T4", "dual-T6", "f32-b96-T4"])
def test_cuda_graph_verify_commit(mode, lo, batch, T):
    """verify + commit (accepted counts read from a device tensor) captured in one graph, 64
    rounds; dual bf16 at T 4 and 6, the table's register-budgeted verify launches; fp32 at
    batch 96, whose commit takes the balanced fold (a grid of 6 programs per SM, whatever the
    number of flushing rows)."""
    sh, K = QWEN["qwen3.5-4b"], 6
    g = gen(10)
    rs, rr = make_pair(sh, batch + 8, K + T, K, mode, "float32", lo, torch.bfloat16, g)
    if batch > 64:
        plan = TK.plan_commit(rs, torch.zeros(batch, dtype=torch.int64, device=DEV), None, opts())
        assert plan[1].kernel is TK.gdn_commit_balanced_kernel
    idx = random_rows(batch + 8, batch, g)
    static = step_inputs(sh, batch, torch.bfloat16, g, T=T)
    acc = torch.zeros(batch, dtype=torch.int64, device=DEV)
    out = torch.empty_like(static["v"])
    GD.verify(rs, **static, state_indices=idx, out=out)
    GD.commit(rs, acc, idx)
    R.gdn_verify(rr, **static, state_indices=idx)
    R.gdn_commit(rr, acc, idx)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        GD.verify(rs, **static, state_indices=idx, out=out)
        GD.commit(rs, acc, idx)
    torch.cuda.current_stream().wait_stream(s)
    for cyc in range(64):
        x = step_inputs(sh, batch, torch.bfloat16, g, T=T)
        for k_, v_ in x.items():
            static[k_].copy_(v_)
        acc.copy_(torch.randint(0, T + 1, (batch,), generator=g))
        out.fill_(float("nan"))
        graph.replay()
        o_ref = R.gdn_verify(rr, **x, state_indices=idx)
        R.gdn_commit(rr, acc, idx)
        assert rel_err(out, o_ref) <= TOL_BF16_OUT, f"cycle {cyc}"
        state_check(rs, rr, f"graph cycle {cyc}")
