"""The plugin's layout and decode step without vLLM: replay state over vLLM-style page views
(one page per slot, every tensor at a page stride) decodes exactly as the eager recurrence on
a contiguous state, for plain steps and for speculative windows with vLLM's accepted counts."""
import pytest
import torch

from replayssm import gdn, mamba2
from replayssm.inputs import GDNShape, Mamba2Shape, gdn_step_inputs, mamba2_params, mamba2_step_inputs
from replayssm.vllm import decode
from replayssm.vllm.config import ReplayConfig
from replayssm.vllm.layout import (extend, gdn_state, mamba2_state, page_bytes, page_views, replay_fields,
                                   slot_strides_contiguous)

M2 = Mamba2Shape(nheads=4, head_dim=8, d_state=8, n_groups=2)
GD = GDNShape(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8)
NUM_BLOCKS, BLOCKS = 8, torch.tensor([5, 0, 2])     # block 0: vLLM's null block (a padded row)
LIVE = torch.tensor([0, 2])


def _vllm_base(family, num_spec):
    """(shapes, dtypes) as vLLM 0.26 declares them: conv (K-1+s, conv_dim) bf16, ssm fp32."""
    if family == "mamba2":
        conv = M2.nheads * M2.head_dim + 2 * M2.n_groups * M2.d_state
        return ((3 + num_spec, conv), (M2.nheads, M2.head_dim, M2.d_state)), (torch.bfloat16, torch.float32)
    conv = 2 * GD.num_k_heads * GD.head_k_dim + GD.num_v_heads * GD.head_v_dim
    return ((3 + num_spec, conv), (GD.num_v_heads, GD.head_v_dim, GD.head_k_dim)), (torch.bfloat16, torch.float32)


def _pages(family, mode, num_spec, pad=64):
    cfg = ReplayConfig(mode=mode, flush_period=4, buffer_len=None, backend="reference").resolve(num_spec)
    base_s, base_d = _vllm_base(family, num_spec)
    fields = replay_fields(family, cfg, base_s, base_d, torch.bfloat16)
    shapes, dtypes = extend(base_s, base_d, fields)
    page = page_bytes(shapes, dtypes) + pad          # vLLM pads the page to the attention page
    storage = torch.zeros(NUM_BLOCKS * page, dtype=torch.uint8)
    views = page_views(storage, NUM_BLOCKS, shapes, dtypes, page)
    make = mamba2_state if family == "mamba2" else gdn_state
    rs, pending = make(views, fields, cfg)
    return cfg, rs, pending


def test_layout_keeps_vllm_tensors_first_and_aligns():
    cfg, rs, pending = _pages("mamba2", "replay-dual", 3)
    assert cfg.buffer_len == 4 + 4                    # K + (1 + num_spec)
    assert rs.hi.data.shape == (NUM_BLOCKS, M2.nheads, M2.head_dim, M2.d_state)
    assert rs.x.shape == (NUM_BLOCKS, cfg.buffer_len, M2.nheads, M2.head_dim)
    assert rs.lo.data.dtype == torch.bfloat16 and pending.shape == (NUM_BLOCKS,)
    assert not slot_strides_contiguous(rs)            # what the Triton kernels must learn to take
    with pytest.raises(ValueError, match="mamba_cache_dtype"):
        extend(((3, 3), (2, 2, 2)), (torch.bfloat16, torch.float32), [])     # 18-byte conv: fp32 misaligned


def test_refusals_name_the_option():
    with pytest.raises(ValueError, match="buffer_len"):
        ReplayConfig("replay", 16, 18, backend="reference").resolve(3)
    with pytest.raises(ValueError, match="mamba_ssm_cache_dtype"):
        replay_fields("mamba2", ReplayConfig("replay-dual", 4, 8), *_vllm_base("mamba2", 0)[:1],
                      (torch.bfloat16, torch.bfloat16), torch.bfloat16)


def _mamba2_eager(S, inp, p, t):
    return mamba2.eager_step(S, inp["x"][:, t], inp["dt"][:, t], p["A"], inp["B"][:, t], inp["C"][:, t], p["D"],
                             p["dt_bias"], None, None, backend="reference")


def _gdn_eager(S, inp, t):
    return gdn.eager_step(S, inp["q"][:, t], inp["k"][:, t], inp["v"][:, t], inp["g"][:, t], inp["beta"][:, t],
                          None, backend="reference")


def _flat(inp, keys):
    """[b, T, ...] -> token-major [b*T, ...] as vLLM hands decode tokens to the layer."""
    return {k: inp[k].flatten(0, 1) for k in keys}


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("num_spec", [0, 3])
def test_decode_over_pages_matches_eager(family, num_spec):
    gen = torch.Generator().manual_seed(0)
    cfg, rs, pending = _pages(family, "replay", num_spec)
    b, T, steps = len(BLOCKS), 1 + num_spec, 7
    heads = (M2.nheads, M2.head_dim, M2.d_state) if family == "mamba2" else \
        (GD.num_v_heads, GD.head_v_dim, GD.head_k_dim)
    S0 = torch.randn(b, *heads, generator=gen) * 0.3
    rs.hi.data[BLOCKS[LIVE]] = S0[LIVE]                # what vLLM's prefill writes
    decode.after_prefill(rs, pending, BLOCKS)
    S = S0.clone()                                     # eager state of each row (contiguous)
    p = mamba2_params(M2, gen=gen)
    accepted = torch.ones(b, dtype=torch.int32)        # vLLM's count after a prefill
    cu = torch.arange(b + 1, dtype=torch.int32) * T
    for _ in range(steps):
        if family == "mamba2":
            inp = mamba2_step_inputs(M2, b, T, gate=False, gen=gen)
            tok = _flat(inp, ("x", "dt", "B", "C"))
            out = torch.zeros_like(tok["x"])
            decode.mamba2_decode(rs, pending, tok["x"], tok["dt"], p["A"], tok["B"], tok["C"], p["D"], p["dt_bias"],
                                 BLOCKS, out, backend="reference", num_accepted=accepted if num_spec else None,
                                 cu_seqlens=cu if num_spec else None, window=T)
        else:
            inp = gdn_step_inputs(GD, b, T, gen=gen)
            tok = _flat(inp, ("q", "k", "v", "g", "beta"))
            out = torch.zeros_like(tok["v"])
            decode.gdn_decode(rs, pending, tok["q"], tok["k"], tok["v"], tok["g"], tok["beta"], BLOCKS, out,
                              backend="reference", num_accepted=accepted if num_spec else None,
                              cu_seqlens=cu if num_spec else None, window=T)
        out = out.view(b, T, *out.shape[1:])
        accepted = torch.randint(1, T + 1, (b,), generator=gen, dtype=torch.int32)
        states = []
        W = S.clone()
        for t in range(T):                             # eager over the whole window from the committed state
            y = _mamba2_eager(W, inp, p, t) if family == "mamba2" else _gdn_eager(W, inp, t)
            torch.testing.assert_close(out[LIVE, t].float(), y[LIVE].float(), rtol=2e-2, atol=2e-2)
            states.append(W.clone())
        S = torch.stack([states[int(a) - 1][i] for i, a in enumerate(accepted)])


def test_dual_low_copy_follows_prefill():
    cfg, rs, pending = _pages("gdn", "replay-dual", 0)
    rs.hi.data[BLOCKS[LIVE]] = torch.randn(len(LIVE), *rs.hi.data.shape[1:])
    rs.cursor[BLOCKS[LIVE]] = 3
    decode.after_prefill(rs, pending, BLOCKS)
    assert (rs.entries(BLOCKS[LIVE]) == 0).all()
    torch.testing.assert_close(rs.lo.data[BLOCKS[LIVE]].float(), rs.hi.data[BLOCKS[LIVE]], rtol=1e-2, atol=1e-2)


def test_gdn_gates_match_vllm_formula():
    A_log, dt_bias = torch.randn(4), torch.randn(4)
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    g, beta = decode.gdn_gates(A_log, a, b, dt_bias)
    torch.testing.assert_close(g, -A_log.exp() * torch.log1p(torch.exp(a + dt_bias)))
    torch.testing.assert_close(beta, torch.sigmoid(b))


def test_entry_point_declared():
    """vLLM finds the plugin through this entry point (group vllm.general_plugins)."""
    import tomllib
    from pathlib import Path

    import replayssm.vllm
    root = Path(__file__).resolve().parents[4]
    ep = tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"]["vllm.general_plugins"]
    assert ep == {"replayssm": "replayssm.vllm:register"}
    assert callable(replayssm.vllm.register)


def test_prefill_hooks_fold_continued_and_reset_new_sequences():
    """A chunked prefill that continues a sequence starts from its current state (entries
    folded); a block new to its sequence may hold another layer group's bytes: its cursor is
    reset, never read."""
    cfg, rs, pending = _pages("mamba2", "replay", 0)
    gen = torch.Generator().manual_seed(3)
    p = mamba2_params(M2, gen=gen)
    blocks = torch.tensor([5, 2])
    rs.hi.data[blocks] = torch.randn(2, *rs.hi.data.shape[1:], generator=gen)
    decode.after_prefill(rs, pending, blocks)
    inp = mamba2_step_inputs(M2, 2, gate=False, gen=gen)
    S = rs.hi.data[blocks].clone()
    for _ in range(2):
        decode.mamba2_decode(rs, pending, inp["x"], inp["dt"], p["A"], inp["B"], inp["C"], p["D"], p["dt_bias"],
                             blocks, torch.zeros_like(inp["x"]), backend="reference")
        mamba2.eager_step(S, inp["x"], inp["dt"], p["A"], inp["B"], inp["C"], p["D"], p["dt_bias"], None, None,
                          backend="reference")
    rs.cursor[2] = 0x7FFF_00C3                        # garbage: block 2 now starts a new sequence
    decode.mamba2_before_prefill(rs, p["A"], blocks, torch.tensor([True, False]), backend="reference")
    assert int(rs.entries(torch.tensor([5]))) == 0 and int(rs.cursor[2]) == 0
    torch.testing.assert_close(rs.hi.data[5], S[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_triton_ops_on_page_views(family):
    """The plugin refuses backend='triton' while the Triton ops reject vLLM's page views
    (docs/vllm.md lists what they must accept); once they take them, they must match the
    reference on them, and engine.KERNELS_ACCEPT_PAGE_STRIDES can be flipped."""
    from replayssm.vllm.engine import KERNELS_ACCEPT_PAGE_STRIDES
    outs = {}
    for backend in ("reference", "triton"):
        cfg, rs, pending = _pages(family, "replay", 0)
        idx = decode.state_indices(BLOCKS)
        if family == "mamba2":
            p, inp = mamba2_params(M2, gen=torch.Generator().manual_seed(5)), mamba2_step_inputs(
                M2, len(BLOCKS), gate=False, gen=torch.Generator().manual_seed(6))
            call = lambda: mamba2.replay_step(rs, inp["x"], inp["dt"], p["A"], inp["B"], inp["C"], p["D"],  # noqa: E731
                                              p["dt_bias"], None, idx, backend=backend)
        else:
            inp = gdn_step_inputs(GD, len(BLOCKS), gen=torch.Generator().manual_seed(6))
            call = lambda: gdn.replay_step(rs, inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], idx,  # noqa: E731
                                           backend=backend)
        if backend == "triton" and not KERNELS_ACCEPT_PAGE_STRIDES:
            with pytest.raises(ValueError, match="contiguous"):
                call()
            return
        outs[backend] = call()
    torch.testing.assert_close(outs["triton"][LIVE].float(), outs["reference"][LIVE].float(), rtol=2e-2, atol=2e-2)


def test_settings_from_additional_config_or_environment(monkeypatch):
    from types import SimpleNamespace

    import replayssm.vllm as plugin
    from replayssm.vllm.config import ReplayConfigError, from_env, from_vllm_config
    env = {"REPLAYBENCH_VLLM": "replay-dual", "REPLAYBENCH_VLLM_FLUSH_PERIOD": "8",
           "REPLAYBENCH_VLLM_LO_DTYPE": "float8_e4m3", "REPLAYBENCH_VLLM_BACKEND": "reference"}
    cfg = from_env(env)
    assert (cfg.mode, cfg.flush_period, cfg.lo_dtype, cfg.backend, cfg.state_mode) == \
        ("replay-dual", 8, "float8_e4m3", "reference", "dual")
    assert from_env({}) is None and from_env({"REPLAYBENCH_VLLM": "off"}) is None
    vc = SimpleNamespace(additional_config={"replayssm": {"mode": "replay", "flush_period": 4}})
    assert from_vllm_config(vc, env).mode == "replay"                 # additional_config wins
    assert from_vllm_config(SimpleNamespace(additional_config={}), env).mode == "replay-dual"
    for bad, word in (({"mode": "fast"}, "mode"), ({"mode": "replay", "lo": 1}, "unknown"),
                      ({"mode": "replay", "backend": "cuda"}, "backend"), ({"mode": "replay", "buffer_len": "x"},
                                                                            "buffer_len")):
        with pytest.raises(ReplayConfigError, match=word):
            from_vllm_config(SimpleNamespace(additional_config={"replayssm": bad}), {})
    monkeypatch.setenv("REPLAYBENCH_VLLM", "off")
    plugin.register()                                                   # returns before importing vLLM
