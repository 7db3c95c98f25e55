"""Decode layers (replayssm.layers): the replay-method layer equals the eager-method layer in
float64, dual / shared-low precision stay close, shapes and byte helpers, padded rows."""
import pytest
import torch

from replayssm.inputs import GDNShape, Mamba2Shape
from replayssm.layers import GDNDecodeLayer, Mamba2DecodeLayer, decode_layer

F64 = torch.float64
HIDDEN = 32
DIMS = {"mamba2": Mamba2Shape(nheads=4, head_dim=8, d_state=8, n_groups=2),
        "gdn": GDNShape(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8)}
FAMILIES = list(DIMS)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def make(family, method, **kw):
    return decode_layer(family, HIDDEN, DIMS[family], method=method, **kw)


def _indices(gen, batch=4, slots=6):
    """Shuffled slots each step with random padding: cursors of different slots drift apart."""
    perm = torch.randperm(slots, generator=gen)[:batch].to(torch.int32)
    pad = torch.rand(batch, generator=gen) < 0.25
    return torch.where(pad, torch.full_like(perm, -1), perm)


def _ssm_snapshot(layer):
    if layer.rs is None:
        return [layer.state.clone()]
    rs = layer.rs
    return [t.clone() for t in (rs.hi.data, rs.cursor, *rs.buffers())] + (
        [rs.lo.data.clone()] if rs.lo is not None else [])


@pytest.mark.parametrize("family", FAMILIES)
def test_replay_layer_equals_eager_layer_fp64(family):
    kw = dict(batch=4, slots=6, buffer_len=8, flush_period=6, state_dtype="float64", dtype=F64, seed=3)
    eager, replay = make(family, "eager", **kw), make(family, "replay", **kw)
    for layer in (eager, replay):
        layer.randomize_state(5)
    gen = torch.Generator().manual_seed(11)
    worst, flushed = 0.0, 0
    for _ in range(210):
        idx = _indices(gen)
        h = torch.randn(4, HIDDEN, generator=gen, dtype=F64)
        cur = replay.rs.cursor.clone()
        ye, yr = eager.step(h, idx), replay.step(h, idx)
        live = idx[idx >= 0].long()
        flushed += int((cur[live] + 1 >= replay.flush_period).sum())
        assert torch.all(yr[idx < 0] == 0) and torch.all(ye[idx < 0] == 0)
        worst = max(worst, rel(yr, ye))
    assert ye.abs().mean() > 1e-3                      # real outputs, not vanishing ones
    assert flushed >= 20                               # many flushes happened along the way
    assert worst < 1e-10, worst
    assert torch.equal(eager.conv_state, replay.conv_state)
    assert rel(replay.ssm_state(), eager.ssm_state()) < 1e-10


@pytest.mark.parametrize("family", FAMILIES)
def test_dual_stays_close_and_shared_low_accumulates(family):
    kw = dict(batch=4, buffer_len=8, state_dtype="float32", lo_dtype="bfloat16", dtype=torch.float32, seed=4)
    eager = make(family, "eager", **kw)
    dual, shared = make(family, "replay-dual", **kw), make(family, "replay-shared-low", **kw)
    for layer in (eager, dual, shared):
        layer.randomize_state(6)
    gen = torch.Generator().manual_seed(12)
    err = {"dual": 0.0, "shared": 0.0}
    for _ in range(60):
        h = torch.randn(4, HIDDEN, generator=gen)
        y = eager.step(h)
        err["dual"] = max(err["dual"], rel(dual.step(h), y))
        err["shared"] = max(err["shared"], rel(shared.step(h), y))
    assert err["dual"] < 1e-2 and err["shared"] < 2e-2, err
    s = eager.ssm_state()
    # dual: low-precision rounding never enters the recurrence (fp32 checkpoint stays exact);
    # shared-low: the only copy is bf16 and its rounding accumulates
    assert rel(dual.ssm_state(), s) < 1e-5
    assert rel(shared.ssm_state(), s) > 1e-4


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", ["eager", "replay-dual"])
def test_padded_rows_produce_zero_and_leave_state_untouched(family, method):
    layer = make(family, method, batch=3, slots=4, buffer_len=4, lo_dtype="bfloat16", seed=1)
    layer.randomize_state(2, fill_buffer=True)
    conv0, ssm0 = layer.conv_state.clone(), _ssm_snapshot(layer)
    idx = torch.tensor([2, -1, 0], dtype=torch.int32)
    out = layer.step(torch.randn(3, HIDDEN).bfloat16(), idx)
    assert out.shape == (3, HIDDEN) and out.dtype == torch.bfloat16
    assert torch.all(out[1] == 0) and out[0].abs().sum() > 0 and out[2].abs().sum() > 0
    for s in (1, 3):                                   # unaddressed slots: untouched
        assert torch.equal(layer.conv_state[s], conv0[s])
        for now, before in zip(_ssm_snapshot(layer), ssm0):
            assert torch.equal(now[s], before[s])
    for s in (0, 2):                                   # addressed slots moved on
        assert not torch.equal(layer.conv_state[s], conv0[s])
    # a fully padded batch reads and writes nothing, returns zeros
    conv1, ssm1 = layer.conv_state[:4].clone(), _ssm_snapshot(layer)
    out = layer.step(torch.randn(2, HIDDEN).bfloat16(), torch.tensor([-1, -1], dtype=torch.int32))
    assert torch.all(out == 0)
    assert torch.equal(layer.conv_state[:4], conv1)
    assert all(torch.equal(a, b) for a, b in zip(_ssm_snapshot(layer), ssm1))


def test_mamba2_shapes_and_bytes():
    d = DIMS["mamba2"]
    H, P, N, G, K = d.nheads, d.head_dim, d.d_state, d.n_groups, 4
    layer = Mamba2DecodeLayer(HIDDEN, d, "replay-dual", batch=2, buffer_len=8, lo_dtype="bfloat16")
    h = torch.randn(2, HIDDEN).bfloat16()
    inp = layer.ssm_inputs(h)
    assert inp["x"].shape == (2, H, P) and inp["z"].shape == (2, H, P) and inp["dt"].shape == (2, H)
    assert inp["B"].shape == inp["C"].shape == (2, G, N)
    y = layer.ssm_only(inp)
    assert y.shape == (2, H, P) and layer.finish(y, inp).shape == (2, HIDDEN)
    assert layer.step(h).shape == (2, HIDDEN)
    conv_dim = H * P + 2 * G * N
    d_proj = 2 * H * P + 2 * G * N + H
    assert layer.conv_state.shape == (3, conv_dim, K - 1)     # + one scratch slot
    assert layer.weight_bytes() == 2 * (d_proj * HIDDEN + conv_dim * K + conv_dim + H * P + HIDDEN * H * P) + 3 * H * 4
    assert layer.conv_state_bytes_per_seq() == conv_dim * (K - 1) * 2
    ckpt = H * P * N * (4 + 2)                                  # fp32 high + bf16 low copy
    assert layer.ssm_state_bytes_per_seq() == ckpt + 8 * (H * P * 2 + G * N * 2 + H * 4)
    eager = Mamba2DecodeLayer(HIDDEN, d, "eager")
    assert eager.ssm_state_bytes_per_seq() == H * P * N * 4
    nb = layer.non_ssm_step_bytes(2)
    assert nb["conv_state"] == 2 * 2 * layer.conv_state_bytes_per_seq()
    assert nb["activations"] == 2 * 2 * (HIDDEN + d_proj + 2 * conv_dim + 3 * H * P + HIDDEN)


def test_gdn_shapes_and_bytes():
    d = DIMS["gdn"]
    Hk, Hv, dk, dv, K = d.num_k_heads, d.num_v_heads, d.head_k_dim, d.head_v_dim, 4
    layer = GDNDecodeLayer(HIDDEN, d, "replay", batch=2, buffer_len=8)
    inp = layer.ssm_inputs(torch.randn(2, HIDDEN).bfloat16())
    assert inp["q"].shape == inp["k"].shape == (2, Hk, dk) and inp["v"].shape == inp["z"].shape == (2, Hv, dv)
    assert inp["g"].shape == inp["beta"].shape == (2, Hv) and inp["g"].dtype == torch.float32
    assert torch.all(inp["g"] < 0) and torch.all((inp["beta"] > 0) & (inp["beta"] < 1))
    assert layer.ssm_only(inp).shape == (2, Hv, dv)
    conv_dim = 2 * Hk * dk + Hv * dv
    d_proj = 2 * Hk * dk + 2 * Hv * dv + 2 * Hv
    assert layer.weight_bytes() == 2 * (d_proj * HIDDEN + conv_dim * K + dv + HIDDEN * Hv * dv) + 2 * Hv * 4
    assert layer.conv_state_bytes_per_seq() == conv_dim * (K - 1) * 2
    assert layer.ssm_state_bytes_per_seq() == Hv * dv * dk * 4 + 8 * (Hv * dv * 4 + Hk * dk * 2 + Hv * 4)


@pytest.mark.parametrize("family,hidden,dims,d_proj", [
    ("mamba2", 3136, Mamba2Shape(96, 80, 128, 8), 17504),                  # Nemotron-3-Nano-4B
    ("gdn", 2560, GDNShape(16, 32, 128, 128), 12352),                      # Qwen3.5-4B
])
def test_real_dims_step(family, hidden, dims, d_proj):
    layer = decode_layer(family, hidden, dims, method="replay", batch=2, buffer_len=4)
    assert layer.w_in.shape == (d_proj, hidden) and layer.w_in.dtype == torch.bfloat16
    out = layer.step(torch.randn(2, hidden).bfloat16())
    assert out.shape == (2, hidden) and torch.isfinite(out).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        make("mamba2", "spec-replay")
    with pytest.raises(ValueError, match="backend"):
        make("gdn", "eager", backend="vllm")
    with pytest.raises(ValueError, match="op"):
        decode_layer("attention", HIDDEN, DIMS["gdn"])
    with pytest.raises(ValueError, match="lo_dtype"):
        make("mamba2", "replay-dual")


def test_weights_from_shares_parameters_not_state():
    a = make("gdn", "replay", batch=2, buffer_len=4, seed=1)
    b = make("gdn", "replay", batch=2, buffer_len=4, seed=2, weights_from=a)
    assert all(x is y for x, y in zip(a.weights(), b.weights()) if x is not None)
    assert b.rs is not a.rs and b.conv_state.data_ptr() != a.conv_state.data_ptr()
    with pytest.raises(ValueError, match="weights_from"):
        make("mamba2", "eager", weights_from=a)


@pytest.mark.parametrize("family", FAMILIES)
def test_triton_dual_layer_across_batch_sizes_tracks_eager(family):
    """A served dual layer (Triton, the shipped routes) whose batch size changes step by step:
    batch 1-2 take the small-batch route (high copy only, the low copy marked stale), batch 4
    buffers and flushes the stale rows first (GDN's route limit lowered to 8 value-head states,
    so the tiny dims buffer at batch 4 as the real ones do at larger batches). Outputs stay
    within the low copy's rounding of an fp32 eager layer with the same weights, and the high
    checkpoint stays the eager state."""
    from replayssm.gdn import GDNOptions
    kw = dict(batch=4, slots=6, buffer_len=6, state_dtype="float32", dtype=torch.float32, seed=8)
    eager = make(family, "eager", **kw)
    opts = GDNOptions(dual_route_heads=2 * DIMS["gdn"].num_v_heads) if family == "gdn" else None
    dual = make(family, "replay-dual", backend="triton", lo_dtype="bfloat16", weights_from=eager, options=opts, **kw)
    for layer in (eager, dual):
        layer.randomize_state(9)
    gen = torch.Generator().manual_seed(13)
    worst, routed, stale_flushed = 0.0, 0, 0
    for t in range(18):
        b = [1, 2, 4][int(torch.randint(0, 3, (1,), generator=gen))] if t > 2 else [1, 4, 4][t]
        idx = torch.randperm(6, generator=gen)[:b].to(torch.int32)
        h = torch.randn(b, HIDDEN, generator=gen)
        stale = dual.rs.lo_stale(idx.long())
        y_e, y_d = eager.step(h, idx), dual.step(h, idx)
        worst = max(worst, rel(y_d, y_e))
        if b < 4:
            routed += 1
            assert dual.rs.lo_stale(idx.long()).all()        # the route left the low copy stale
        else:
            stale_flushed += int(stale.sum())
            assert not dual.rs.lo_stale(idx.long()).any()
    assert routed >= 4 and stale_flushed >= 3, (routed, stale_flushed)
    assert worst < 2e-2, worst
    assert rel(dual.ssm_state(), eager.ssm_state()) < 1e-5
