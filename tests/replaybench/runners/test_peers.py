"""vLLM peer adapters: the translation logic on CPU, the whole adapter against CPU emulations of
vLLM 0.26.0's kernels (written from their Triton source: slot/null-block/num_accepted semantics,
packed layout, in-kernel gating), and - where vLLM and a GPU exist - against the real kernels."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from replayssm.inputs import GDNShape, Mamba2Shape

from replaybench.models import get_model
from replaybench.runners import peers as P

M2 = Mamba2Shape(nheads=4, head_dim=8, d_state=16, n_groups=2)
GD = GDNShape(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8)


# ----------------------------------------------------------------------------- pure translation
def test_slot_table_null_block_and_padding():
    idx = torch.tensor([0, 2, -1, 1], dtype=torch.int32)
    t = P.slot_table(idx, 1)
    assert t.dtype == torch.int32 and t.shape == (4, 1) and t.is_contiguous()
    assert t[:, 0].tolist() == [1, 3, P.NULL_BLOCK_ID, 2]
    t3 = P.slot_table(idx, 3)
    assert t3.tolist() == [[1, 2, 3], [7, 8, 9], [0, 0, 0], [4, 5, 6]]
    assert P.reference_slots(t3)[2].tolist() == [-1, -1, -1]


def test_mamba2_tied_params_are_stride0_like_vllm():
    H, Pd, N = 4, 8, 16
    A, D, dtb = -torch.rand(H) - 1, torch.rand(H), torch.rand(H)
    A_d, D_d, dtb_d = P.mamba2_tied_params(A, D, dtb, Pd, N, torch.bfloat16)
    assert A_d.shape == (H, Pd, N) and A_d.stride() == (1, 0, 0) and A_d.dtype == torch.float32
    assert D_d.shape == dtb_d.shape == (H, Pd) and D_d.stride() == dtb_d.stride() == (1, 0)
    assert D_d.dtype == dtb_d.dtype == torch.bfloat16
    dt = torch.randn(3, H)
    dt_d = P.mamba2_tied_dt(dt, Pd)
    assert dt_d.shape == (3, H, Pd) and dt_d.stride() == (H, 1, 0)
    assert P.is_tied(A_d, dt_d, dtb_d)
    assert not P.is_tied(A_d.contiguous(), dt_d, dtb_d)      # a contiguous A takes vLLM's slow path
    assert torch.equal(A_d[:, 3, 5], A) and torch.equal(dt_d[:, :, 7], dt.to(torch.bfloat16))


def test_softplus_inverse():
    y = torch.tensor([1e-8, 1e-3, 0.1, 1.0, 5.0], dtype=torch.float64)
    assert torch.allclose(F.softplus(P.softplus_inverse(y)), y, rtol=1e-12, atol=0)


def test_gdn_gating_reproduces_g_and_beta():
    gen = torch.Generator().manual_seed(3)
    g = torch.log(0.9 + 0.1 * torch.rand(5, 4, generator=gen, dtype=torch.float64))
    beta = 0.05 + 0.9 * torch.rand(5, 4, generator=gen, dtype=torch.float64)
    A_log = torch.log(0.5 + 3.5 * torch.rand(4, generator=gen, dtype=torch.float64))
    dtb = 2 * torch.rand(4, generator=gen, dtype=torch.float64) - 1
    # exact in float64
    a, b = P.gdn_raw_gating(g, beta, A_log, dtb, torch.float64)
    g2, b2 = P.gdn_effective_gating(A_log, a, dtb, b, "sigmoid")
    assert torch.allclose(g2, g, rtol=1e-9) and torch.allclose(b2, beta, rtol=1e-9)
    # model dtype: close to the target, and the effective values are what the kernel computes
    A32, dtb16 = A_log.float(), dtb.to(torch.bfloat16)
    a, b = P.gdn_raw_gating(g, beta, A32, dtb16, torch.bfloat16)
    assert a.dtype == b.dtype == torch.bfloat16
    ge, be = P.gdn_effective_gating(A32, a, dtb16, b, "packed")
    assert torch.allclose(torch.exp(ge), torch.exp(g), rtol=2e-3)   # alpha within bf16 rounding
    assert torch.allclose(be, beta, rtol=2e-2)
    x = a.double() + dtb16.double()
    assert torch.allclose(ge, -torch.exp(A32.double()) * F.softplus(x), rtol=1e-12)
    assert torch.equal(be, torch.sigmoid(b.double()).to(torch.bfloat16).double())


def test_pack_qkv_layout():
    q, k, v = torch.randn(3, 2, 4), torch.randn(3, 2, 4), torch.randn(3, 5, 6)
    out = P.pack_qkv(q, k, v, torch.empty(3, 2 * 8 + 30))
    assert torch.equal(out[:, :8], q.reshape(3, 8)) and torch.equal(out[:, 8:16], k.reshape(3, 8))
    assert torch.equal(out[:, 16:], v.reshape(3, 30))


def test_module_import_does_not_import_vllm():
    code = "import sys, replaybench.runners.peers as p; assert 'vllm' not in sys.modules; print(p.VLLM_VERSION)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_vllm_available_is_a_bool():
    assert isinstance(P.vllm_available(), bool)


# ----------------------------------------------------------------------------- CPU emulations of vLLM's kernels
def _softplus(x, thr=20.0):
    return torch.where(x <= thr, torch.log1p(torch.exp(x.clamp(max=thr))), x)


def emu_selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                               state_batch_indices=None, dst_state_batch_indices=None, null_block_id=0,
                               out=None, num_accepted_tokens=None, cu_seqlens=None, is_blackwell=False, **_):
    """mamba_ssm.py:selective_state_update semantics (wrapper asserts + _selective_scan_update_kernel)."""
    sbi, dsbi = state_batch_indices, dst_state_batch_indices
    if sbi is not None and sbi.dim() == 1:
        sbi = sbi.unsqueeze(1)
    if dsbi is not None and dsbi.dim() == 1:
        dsbi = dsbi.unsqueeze(1)
    if num_accepted_tokens is not None:
        assert sbi is not None and sbi.dim() == 2
    _, H, Pd, Nd = state.shape
    batch = x.shape[0]
    N = len(cu_seqlens) - 1 if cu_seqlens is not None else batch
    assert x.shape == (batch, H, Pd) and dt.shape == x.shape and A.shape == (H, Pd, Nd)
    G = B.shape[1]
    assert B.shape == (batch, G, Nd) and C.shape == B.shape and D.shape == (H, Pd) and dt_bias.shape == (H, Pd)
    assert out.shape == x.shape
    if dsbi is None:
        dsbi = sbi
    if num_accepted_tokens is not None:
        assert num_accepted_tokens.shape == (N,)
    for n in range(N):
        bos, L = (int(cu_seqlens[n]), int(cu_seqlens[n + 1] - cu_seqlens[n])) if cu_seqlens is not None else (n, 1)
        if L == 0:
            continue
        t0 = max(int(num_accepted_tokens[n]) - 1, 0) if num_accepted_tokens is not None else 0
        src = int(sbi[n, t0])
        S = state[src].float() if src != null_block_id else torch.zeros(H, Pd, Nd)
        for t in range(L):
            tok = bos + t
            d = dt[tok].float() + dt_bias.float()
            d = _softplus(d) if dt_softplus else d                          # [H, Pd]
            dA = torch.exp(A.float() * d[..., None])
            Bh = B[tok].float().repeat_interleave(H // G, 0)
            Ch = C[tok].float().repeat_interleave(H // G, 0)
            S = S * dA + Bh[:, None, :] * d[..., None] * x[tok].float()[..., None]
            if num_accepted_tokens is not None:
                dst = int(dsbi[n, t])
                if dst != null_block_id:
                    state[dst] = S.to(state.dtype)
            y = (S * Ch[:, None, :]).sum(-1) + x[tok].float() * D.float()
            if z is not None:
                y = y * F.silu(z[tok].float())
            out[tok] = y.to(out.dtype)
        if num_accepted_tokens is None and src != null_block_id:
            state[int(dsbi[n, 0])] = S.to(state.dtype)


def _l2(t):
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)


def _gdn_token(h, q, k, v, a, b, A_log, dt_bias, scale, HV, round_beta_to=None):
    H = q.shape[0]
    q = _l2(q.float()).repeat_interleave(HV // H, 0) * scale
    k = _l2(k.float()).repeat_interleave(HV // H, 0)
    g = -torch.exp(A_log.float()) * _softplus(a.float() + dt_bias.float())
    beta = torch.sigmoid(b.float())
    if round_beta_to is not None:
        beta = beta.to(round_beta_to).float()
    h = h * torch.exp(g)[:, None, None]
    u = (v.float() - (h * k[:, None, :]).sum(-1)) * beta[:, None]
    h = h + u[..., None] * k[:, None, :]
    return h, (h * q[:, None, :]).sum(-1)


def emu_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                      use_qk_l2norm_in_kernel=False):
    """fused_recurrent.py:fused_recurrent_gated_delta_rule_packed_decode semantics."""
    assert use_qk_l2norm_in_kernel
    assert mixed_qkv.ndim == 2 and mixed_qkv.stride(-1) == 1 and a.ndim == b.ndim == 2
    assert a.stride(-1) == b.stride(-1) == 1 and A_log.ndim == dt_bias.ndim == 1 and ssm_state_indices.ndim == 1
    assert out.is_contiguous() and initial_state.ndim == 4 and initial_state.stride(-1) == 1
    Bn = mixed_qkv.shape[0]
    HV, V, K = initial_state.shape[-3:]
    assert a.shape == b.shape == (Bn, HV) and ssm_state_indices.shape == (Bn,) and out.shape == (Bn, 1, HV, V)
    qd = (mixed_qkv.shape[1] - HV * V) // 2
    H = qd // K
    for n in range(Bn):
        s = int(ssm_state_indices[n])
        if s <= 0:
            out[n] = 0
            continue
        row = mixed_qkv[n]
        q, k, v = row[:qd].view(H, K), row[qd:2 * qd].view(H, K), row[2 * qd:].view(HV, V)
        h, o = _gdn_token(initial_state[s].float(), q, k, v, a[n], b[n], A_log, dt_bias, scale, HV, b.dtype)
        out[n, 0] = o.to(out.dtype)
        initial_state[s] = h.to(initial_state.dtype)
    return out, initial_state


def emu_sigmoid_update(A_log, a, b, dt_bias, q, k, v, beta=1.0, threshold=20.0, scale=None, initial_state=None,
                       inplace_final_state=True, cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                       use_qk_l2norm_in_kernel=False, is_kda=False):
    """fused_sigmoid_gating.py:fused_sigmoid_gating_delta_rule_update semantics (varlen, in place)."""
    assert use_qk_l2norm_in_kernel and inplace_final_state and cu_seqlens is not None and q.shape[0] == 1
    HV = v.shape[2]
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    o = torch.full((1, *v.shape), float("nan"), dtype=q.dtype)       # vLLM: new_empty
    ind = ssm_state_indices if ssm_state_indices.ndim == 2 else ssm_state_indices[:, None]
    assert ind.shape[1] == 1 or ind.stride(-1) == 1                   # the kernel adds i_t unstrided
    for n in range(len(cu_seqlens) - 1):
        bos, eos = int(cu_seqlens[n]), int(cu_seqlens[n + 1])
        if eos == bos:
            continue
        t0 = int(num_accepted_tokens[n]) - 1 if num_accepted_tokens is not None else 0
        s = int(ind[n, t0])
        if s <= 0:
            continue
        h = initial_state[s].float()
        for t in range(eos - bos):
            tok = bos + t
            h, out = _gdn_token(h, q[0, tok], k[0, tok], v[0, tok], a[tok], b[tok], A_log, dt_bias, scale, HV)
            o[0, 0, tok] = out.to(o.dtype)
            f = int(ind[n, t])
            if f > 0:
                initial_state[f] = h.to(initial_state.dtype)
    return o.squeeze(0), initial_state


EMULATED = {"ssu": emu_selective_state_update, "packed": emu_packed_decode, "sigmoid": emu_sigmoid_update}


@pytest.fixture
def emulated(monkeypatch):
    monkeypatch.setattr(P, "_kernels", lambda: dict(EMULATED))


@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("gate", [False, True])
def test_adapter_vs_emulated_mamba2(emulated, state_dtype, gate):
    err = P.check_vllm_layer("mamba2", M2, 3, state_dtype, "cpu", steps=3, gate=gate)
    assert err < (1e-5 if state_dtype == "float32" else 1e-2)


@pytest.mark.parametrize("kernel", P.GDN_KERNELS)
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
def test_adapter_vs_emulated_gdn(emulated, kernel, state_dtype):
    err = P.check_vllm_layer("gdn", GD, 3, state_dtype, "cpu", steps=3, gdn_kernel=kernel)
    assert err < (1e-5 if state_dtype == "float32" else 1e-2)


@pytest.mark.parametrize("op,dims", [("mamba2", M2), ("gdn", GD)])
@pytest.mark.parametrize("T", [1, 3])
def test_spec_adapter_vs_emulated(emulated, op, dims, T):
    err = P.check_vllm_spec_layer(op, dims, 3, T, "float32", "cpu", steps=3)
    assert err < 1e-5


def test_layer_state_layout_and_tied_call(emulated):
    gen = torch.Generator().manual_seed(1)
    seen = {}

    def spy(*args, **kw):
        seen["A"], seen["dt"], seen["dt_bias"] = args[3], args[2], kw["dt_bias"]
        seen["sbi"], seen["z"] = kw["state_batch_indices"], kw["z"]
        return emu_selective_state_update(*args, **kw)

    layer = P.VllmEagerLayer("mamba2", M2, 4, "float32", "cpu", gen)
    layer._ssu = spy
    assert layer.state.shape == (5, M2.nheads, M2.head_dim, M2.d_state) and layer.state.abs().min() > 0
    inp, params = layer.random_inputs(gen)
    layer.step(inp, params, torch.tensor([0, 1, 2, -1], dtype=torch.int32))
    assert P.is_tied(seen["A"], seen["dt"], seen["dt_bias"]) and seen["z"] is None
    assert seen["sbi"].shape == (4, 1) and seen["sbi"][:, 0].tolist() == [1, 2, 3, 0]
    g = P.VllmEagerLayer("gdn", GD, 2, "float32", "cpu", gen)
    assert g.state.shape == (3, GD.num_v_heads, GD.head_v_dim, GD.head_k_dim)        # [slots, Hv, dv, dk]


def test_translation_is_cached_between_steps(emulated):
    gen = torch.Generator().manual_seed(2)
    layer = P.VllmEagerLayer("gdn", GD, 2, "float32", "cpu", gen)
    inp, params = layer.random_inputs(gen)
    idx = torch.arange(2, dtype=torch.int32)
    layer.step(inp, params, idx)
    before = (layer._m_inp.val, layer._m_gate.val, layer._m_idx.val)
    layer.step(inp, params, idx)
    assert all(x is y for x, y in zip(before, (layer._m_inp.val, layer._m_gate.val, layer._m_idx.val)))
    inp["g"].mul_(1.0)                                                # in-place change: re-translate
    layer.step(inp, params, idx)
    assert layer._m_gate.src is not None and layer._m_gate.ver[0] == inp["g"]._version


def test_check_catches_a_wrong_state_layout(monkeypatch):
    def wrong(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices, **kw):
        st = initial_state.transpose(-1, -2)                           # reads S as [dk, dv]
        return emu_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, st.contiguous(), out,
                                 ssm_state_indices, **kw)
    monkeypatch.setattr(P, "_kernels", lambda: dict(EMULATED, packed=wrong))
    sq = GDNShape(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8)
    assert P.check_vllm_layer("gdn", sq, 3, "float32", "cpu") > 0.1


def test_run_skips_without_cuda():
    from replaybench.runners import SkipCase
    from replaybench.scenario import TimingConfig
    from replaybench.runners import RunContext

    class C:
        method, model, batch, spec_window, state_dtype, seed, flush_period = "vllm-eager", "tiny-gdn", 2, 0, \
            "float32", 0, 1
    with pytest.raises(SkipCase):
        P.run(C, RunContext(device="cpu", timing=TimingConfig()))


# ----------------------------------------------------------------------------- the real thing (GPU + vLLM)
REAL_SHAPES = [
    ("mamba2", get_model("nemotron-3-super-120b-a12b").ssm),
    ("mamba2", M2),
    ("gdn", get_model("qwen3.5-122b-a10b").ssm),
    ("gdn", get_model("qwen3.5-4b").ssm),
]


@pytest.mark.parametrize("op,dims", REAL_SHAPES)
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
def test_real_vllm_eager_matches_reference(op, dims, state_dtype):
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    kernels = P.GDN_KERNELS if op == "gdn" else ("packed",)
    for kern in kernels:
        err = P.check_vllm_layer(op, dims, 5, state_dtype, "cuda", gdn_kernel=kern)
        assert err < P.CHECK_TOL[state_dtype], (kern, err)


@pytest.mark.parametrize("op,dims", REAL_SHAPES)
@pytest.mark.parametrize("T", [1, 4])
def test_real_vllm_spec_matches_reference(op, dims, T):
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    err = P.check_vllm_spec_layer(op, dims, 5, T, "float32", "cuda")
    assert err < P.CHECK_TOL["float32"], err


def test_real_vllm_step_is_graph_capturable():
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    gen = torch.Generator().manual_seed(0)
    for op, dims in REAL_SHAPES[::2]:
        layer = P.VllmEagerLayer(op, dims, 4, "float32", "cuda", gen)
        inp, params = layer.random_inputs(gen)
        idx = torch.arange(4, dtype=torch.int32, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                layer.step(inp, params, idx)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer.step(inp, params, idx)
        before = layer.state.clone()
        graph.replay()
        torch.cuda.synchronize()
        assert not torch.equal(before[1:], layer.state[1:]) and math.isfinite(layer.state.float().sum().item())
