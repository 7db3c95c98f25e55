"""The vLLM plugin against vLLM 0.26.0's own classes, on CPU: registration, the layers' and
model classes' state shapes / dtypes, agreement with vLLM's page planner, the routed decode
call, and the engine-start refusals.

Needs vLLM 0.26.0 importable beside the CPU torch (pip install --no-deps; docs/vllm.md);
skipped otherwise: the suite itself runs without vLLM.
"""
import json
import tempfile

import pytest
import torch

try:
    import vllm
    if getattr(vllm, "__file__", None) is None:     # only a namespace directory named vllm on sys.path
        raise ImportError("no module named 'vllm'")
    _SKIP = None if vllm.__version__ == "0.26.0" else f"vLLM {vllm.__version__} installed; the plugin targets 0.26.0"
except Exception as e:  # not installed (CI), or installed without its dependencies
    _SKIP = f"vLLM 0.26.0 not importable ({type(e).__name__}: {e}); install the optional extra `.[vllm]`"
if _SKIP:
    pytest.skip(_SKIP, allow_module_level=True)

from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SpeculativeConfig,  # noqa: E402
                         VllmConfig, set_current_vllm_config)
from vllm.v1.kv_cache_interface import MambaSpec  # noqa: E402

import replayssm.vllm as plugin  # noqa: E402
from replayssm import gdn, mamba2  # noqa: E402
from replayssm.vllm import engine  # noqa: E402
from replayssm.vllm.config import ReplayConfigError  # noqa: E402
from replayssm.vllm.layout import page_bytes, page_views  # noqa: E402

NEMOTRON_H = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "torch_dtype": "bfloat16",
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
    "hybrid_override_pattern": "MM*M", "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "mlp_hidden_act": "relu2", "attention_bias": False, "mlp_bias": False, "use_bias": False,
    "layer_norm_epsilon": 1e-5, "residual_in_fp32": False, "max_position_embeddings": 1024,
    "ssm_state_size": 16, "mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 2, "conv_kernel": 4,
    "expand": 2, "use_conv_bias": True, "mamba_proj_bias": False, "mamba_hidden_act": "silu", "chunk_size": 128,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "torch_dtype": "bfloat16",
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "hidden_act": "silu", "rms_norm_eps": 1e-6,
    "rope_theta": 10000000, "partial_rotary_factor": 0.25, "max_position_embeddings": 1024,
    "full_attention_interval": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
    "norm_topk_prob": True, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-models")
    out = {}
    for name, cfg in (("nemotron_h", NEMOTRON_H), ("qwen3_next", QWEN3_NEXT)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
        out[name] = str(root / name)
    return out


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    """Settings come from additional_config here; the environment must not leak in."""
    for k in list(__import__("os").environ):
        if k.startswith(plugin.ENV):
            monkeypatch.delenv(k)


def make_config(model_dir, replay=None, spec=0, ssm_dtype="float32", prefix_caching=False):
    mc = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16")
    pc = ParallelConfig()
    sc = SpeculativeConfig(method="ngram", num_speculative_tokens=spec, prompt_lookup_max=3, prompt_lookup_min=1,
                           target_model_config=mc, target_parallel_config=pc) if spec else None
    return VllmConfig(model_config=mc, parallel_config=pc, speculative_config=sc,
                      device_config=DeviceConfig(device="cpu"),
                      cache_config=CacheConfig(mamba_ssm_cache_dtype=ssm_dtype, enable_prefix_caching=prefix_caching),
                      additional_config={"replayssm": replay} if replay else {})


@pytest.fixture(scope="module")
def dist(models):
    """One-process tensor-parallel group (vLLM's layers ask for their TP rank)."""
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    plugin.register()
    with set_current_vllm_config(make_config(models["nemotron_h"])):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tempfile.mktemp()}")
        initialize_model_parallel(1, 1)
    yield
    from vllm.distributed import destroy_distributed_environment, destroy_model_parallel
    destroy_model_parallel()
    destroy_distributed_environment()


_n = iter(range(10**6))


def mamba2_layer(vc):
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    hf = vc.model_config.hf_config
    with set_current_vllm_config(vc):
        return MambaMixer2(hidden_size=hf.hidden_size, ssm_state_size=hf.ssm_state_size,
                           conv_kernel_size=hf.conv_kernel,
                           intermediate_size=hf.mamba_num_heads * hf.mamba_head_dim, use_conv_bias=True, use_bias=False,
                           n_groups=hf.n_groups, num_heads=hf.mamba_num_heads, head_dim=hf.mamba_head_dim,
                           model_config=vc.model_config, cache_config=vc.cache_config,
                           prefix=f"model.layers.{next(_n)}.mixer")


def gdn_layer(vc):
    from unittest import mock

    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
    from vllm.platforms import current_platform
    # vLLM without a device platform (CPU, no vllm._C) has no current_device(); the layer asks
    # it where to put its norm weight
    with set_current_vllm_config(vc), mock.patch.object(current_platform, "current_device",
                                                         lambda: torch.device("cpu"), create=True):
        return QwenGatedDeltaNetAttention(vc.model_config.hf_config, vc, prefix=f"model.layers.{next(_n)}.linear_attn",
                                          gqa_interleaved_layout=True)


def model_class(arch):
    from vllm import ModelRegistry
    from vllm.model_executor.models.registry import _LazyRegisteredModel
    entry = ModelRegistry.models[arch]
    assert isinstance(entry, _LazyRegisteredModel) and entry.module_name == "replayssm.vllm.models"
    return entry.load_model_cls()


# ----------------------------------------------------------------------------- registration
def test_register_is_idempotent_and_routes_only_replay_layers(dist):
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.mamba import mamba_mixer2
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn
    from vllm.model_executor.layers.mamba.ops import ssu_dispatch
    from vllm.third_party.flash_linear_attention.ops import fused_sigmoid_gating_delta_rule_update
    from replayssm.vllm.layers import ReplayMambaMixer2, ReplayQwenGatedDeltaNetAttention
    plugin.register()
    plugin.register()
    assert op_registry_oot["MambaMixer2"] is ReplayMambaMixer2
    assert op_registry_oot["QwenGatedDeltaNetAttention"] is ReplayQwenGatedDeltaNetAttention
    assert mamba_mixer2.selective_state_update.replayssm_original is ssu_dispatch.selective_state_update
    assert qwen_gdn_linear_attn.fused_sigmoid_gating_delta_rule_update.replayssm_original is \
        fused_sigmoid_gating_delta_rule_update
    for arch in plugin.SUPPORTED_ARCHITECTURES:
        from vllm import ModelRegistry
        assert ModelRegistry.models[arch].module_name == "replayssm.vllm.models"


@pytest.mark.parametrize("name,arch,make", [("nemotron_h", "NemotronHForCausalLM", mamba2_layer),
                                             ("qwen3_next", "Qwen3NextForCausalLM", gdn_layer)])
def test_inactive_plugin_is_stock_vllm(dist, models, name, arch, make):
    vc = make_config(models[name], spec=3)
    cls = model_class(arch)
    base = cls.__mro__[2]                      # Replay<arch> -> _ReplayModel -> vLLM's class
    assert base.__name__ == arch
    assert cls.get_mamba_state_shape_from_config(vc) == base.get_mamba_state_shape_from_config(vc)
    assert cls.get_mamba_state_dtype_from_config(vc) == base.get_mamba_state_dtype_from_config(vc)
    layer = make(vc)
    assert layer.replay is None and layer.get_kv_cache_spec(vc).num_speculative_blocks == 3
    assert tuple(layer.get_state_shape()) == tuple(base.get_mamba_state_shape_from_config(vc))


# ----------------------------------------------------------------------------- shapes and pages
CASES = [(mode, spec) for mode in ("replay", "replay-dual") for spec in (0, 3)]


@pytest.mark.parametrize("name,arch,make", [("nemotron_h", "NemotronHForCausalLM", mamba2_layer),
                                             ("qwen3_next", "Qwen3NextForCausalLM", gdn_layer)])
@pytest.mark.parametrize("mode,spec", CASES)
def test_layer_model_and_planner_agree(dist, models, name, arch, make, mode, spec):
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    vc = make_config(models[name], {"mode": mode, "backend": "reference", "flush_period": 8}, spec=spec)
    cls = model_class(arch)
    stock = cls.__mro__[2]
    shapes, dtypes = cls.get_mamba_state_shape_from_config(vc), cls.get_mamba_state_dtype_from_config(vc)
    # vLLM's own tensors first and unchanged (its prefill, conv kernels and helpers index [0] / [1])
    assert tuple(shapes[:2]) == tuple(stock.get_mamba_state_shape_from_config(vc))
    assert tuple(dtypes[:2]) == tuple(stock.get_mamba_state_dtype_from_config(vc))
    with set_current_vllm_config(vc):
        assert len(cls.get_mamba_state_copy_func()) == len(shapes)    # one per tensor
    layer = make(vc)
    assert tuple(layer.get_state_shape()) == tuple(shapes) and tuple(layer.get_state_dtype()) == tuple(dtypes)
    assert layer.replay.buffer_len == 8 + (1 + spec if spec else 1)
    # vLLM's page planner sizes pages from the model class; the layer's spec must fit that page
    Platform._align_hybrid_block_size(vc, FlashAttentionBackend)
    spec_obj = layer.get_kv_cache_spec(vc)
    assert isinstance(spec_obj, MambaSpec) and spec_obj.num_speculative_blocks == 0   # no per-draft slots
    unpadded = MambaSpec(shapes=spec_obj.shapes, dtypes=spec_obj.dtypes, block_size=-1).page_size_bytes
    assert unpadded == page_bytes(shapes, dtypes)
    assert spec_obj.page_size_bytes >= unpadded        # vLLM asserts this when it allocates
    attn_page = vc.cache_config.block_size * 2 * vc.model_config.get_num_kv_heads(vc.parallel_config) * \
        vc.model_config.get_head_size() * 2
    assert attn_page >= unpadded
    # per request: one page (vLLM's own layout reserves 1 + num_spec under speculation)
    assert spec_obj.max_memory_usage_bytes(vc) == spec_obj.page_size_bytes


def test_stock_planner_page_cannot_hold_the_replay_layout(dist, models):
    """Why the model classes are overridden too: a page planned from vLLM's (conv, ssm) alone
    is smaller than the replay layout's."""
    vc = make_config(models["nemotron_h"], {"mode": "replay", "backend": "reference"})
    cls = model_class("NemotronHForCausalLM")
    stock = cls.__mro__[2]
    s0, d0 = stock.get_mamba_state_shape_from_config(vc), stock.get_mamba_state_dtype_from_config(vc)
    s1, d1 = cls.get_mamba_state_shape_from_config(vc), cls.get_mamba_state_dtype_from_config(vc)
    assert page_bytes(s1, d1) > page_bytes(s0, d0)


def test_qwen3_5_model_classes(dist, models):
    try:
        cls = model_class("Qwen3_5ForConditionalGeneration")
        model_class("Qwen3_5MoeForConditionalGeneration")
    except Exception as e:   # vLLM's Qwen3.5 module imports the vision stack (torchvision)
        pytest.skip(f"vLLM's qwen3_5 module not importable here ({type(e).__name__}: {e})")
    assert cls.__mro__[2].__name__ == "Qwen3_5ForConditionalGeneration" and cls.FAMILY == "gdn"


# ----------------------------------------------------------------------------- the routed decode call
def _bind(layer, num_blocks=6, pad=128):
    shapes, dtypes = layer.get_state_shape(), layer.get_state_dtype()
    page = page_bytes(shapes, dtypes) + pad
    layer.kv_cache = page_views(torch.zeros(num_blocks * page, dtype=torch.uint8), num_blocks, shapes, dtypes, page)
    return layer.replay_state()


def test_mamba2_layer_decode_through_vllms_call(dist, models):
    from vllm.model_executor.layers.mamba import mamba_mixer2 as m2
    from replayssm.vllm import layers
    vc = make_config(models["nemotron_h"], {"mode": "replay", "backend": "reference", "flush_period": 2})
    layer = mamba2_layer(vc)
    rs, pending = _bind(layer)
    H, P, N, G = layer.num_heads, layer.head_dim, layer.ssm_state_size, layer.n_groups
    blocks = torch.tensor([[3], [0], [1]], dtype=torch.int32)
    gen = torch.Generator().manual_seed(1)
    A = -torch.rand(H, generator=gen) - 0.5
    D, dt_bias = torch.rand(H, generator=gen), torch.rand(H, generator=gen) - 2
    S = torch.zeros(3, H, P, N)
    for _ in range(5):
        x = torch.randn(3, H, P, generator=gen).bfloat16()
        dt = torch.randn(3, H, generator=gen)
        B, C = (torch.randn(3, G, N, generator=gen).bfloat16() for _ in range(2))
        out = torch.zeros(3, H, P, dtype=torch.bfloat16)
        with layers.running(layer):   # the arguments as vLLM's conv_ssm_forward passes them
            m2.selective_state_update(rs.hi.data, x, dt[:, :, None].expand(-1, -1, P),
                                      A[:, None, None].expand(-1, P, N), B, C, D[:, None].expand(-1, P),
                                      dt_bias[:, None].expand(-1, P), dt_softplus=True, state_batch_indices=blocks,
                                      dst_state_batch_indices=blocks, out=out)
        y = mamba2.eager_step(S, x, dt, A, B, C, D, dt_bias, None, None, backend="reference")
        torch.testing.assert_close(out[[0, 2]].float(), y[[0, 2]].float(), rtol=2e-2, atol=2e-2)
    assert int(pending.sum()) == 0 and (rs.entries(torch.tensor([3, 1])) < 2).all()


def test_gdn_layer_decode_through_vllms_call(dist, models):
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as q
    from replayssm.vllm import decode, layers
    vc = make_config(models["qwen3_next"], {"mode": "replay-dual", "backend": "reference", "flush_period": 3}, spec=2)
    layer = gdn_layer(vc)
    rs, pending = _bind(layer)
    Hk, Hv, dk, dv, T = layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim, 3
    gen = torch.Generator().manual_seed(2)
    A_log, dt_bias = torch.rand(Hv, generator=gen), torch.rand(Hv, generator=gen)
    blocks = torch.tensor([[4, 4, 4], [2, 2, 2]], dtype=torch.int32)   # a one-column table broadcast
    S = torch.zeros(2, Hv, dv, dk)
    accepted = torch.ones(2, dtype=torch.int32)
    cu = torch.tensor([0, T, 2 * T], dtype=torch.int32)
    for _ in range(4):
        qq, kk = (torch.randn(1, 2 * T, Hk, dk, generator=gen).bfloat16() for _ in range(2))
        vv = torch.randn(1, 2 * T, Hv, dv, generator=gen).bfloat16()
        a, b = torch.randn(2 * T, Hv, generator=gen), torch.randn(2 * T, Hv, generator=gen)
        with layers.running(layer):
            o, _ = q.fused_sigmoid_gating_delta_rule_update(
                A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=qq, k=kk, v=vv, initial_state=rs.hi.data,
                inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=blocks, num_accepted_tokens=accepted,
                use_qk_l2norm_in_kernel=True)
        g, beta = decode.gdn_gates(A_log, a, b, dt_bias)
        W, states = S.clone(), []
        for t in range(T):
            rows = torch.tensor([t, T + t])
            y = gdn.eager_step(W, qq[0, rows], kk[0, rows], vv[0, rows], g[rows], beta[rows], None, backend="reference")
            torch.testing.assert_close(o[0, rows].float(), y.float(), rtol=5e-2, atol=5e-2)   # bf16 low copy
            states.append(W.clone())
        accepted = torch.randint(1, T + 1, (2,), generator=gen, dtype=torch.int32)
        S = torch.stack([states[int(m) - 1][i] for i, m in enumerate(accepted)])
    assert (pending[torch.tensor([4, 2])] == T).all()


# ----------------------------------------------------------------------------- refusals at engine start
def test_refuses_prefix_caching(dist, models):
    vc = make_config(models["nemotron_h"], {"mode": "replay", "backend": "reference"}, prefix_caching=True)
    with pytest.raises(ReplayConfigError, match="enable_prefix_caching"):
        model_class("NemotronHForCausalLM").get_mamba_state_shape_from_config(vc)


def test_refuses_a_buffer_without_room_for_the_draft_window(dist, models):
    vc = make_config(models["nemotron_h"], {"mode": "replay", "backend": "reference", "buffer_len": 8,
                                            "flush_period": 8}, spec=3)
    with pytest.raises(ReplayConfigError, match="buffer_len"):
        model_class("NemotronHForCausalLM").get_mamba_state_shape_from_config(vc)
    with pytest.raises(ReplayConfigError, match="buffer_len"):
        mamba2_layer(vc)


def test_refuses_dual_without_float32_checkpoint(dist, models):
    vc = make_config(models["qwen3_next"], {"mode": "replay-dual", "backend": "reference"}, ssm_dtype="bfloat16")
    with pytest.raises(ReplayConfigError, match="mamba_ssm_cache_dtype"):
        model_class("Qwen3NextForCausalLM").get_mamba_state_shape_from_config(vc)


def test_refuses_triton_until_kernels_take_page_strides(dist, models):
    assert engine.KERNELS_ACCEPT_PAGE_STRIDES is False
    vc = make_config(models["nemotron_h"], {"mode": "replay", "backend": "triton"})
    with pytest.raises(ReplayConfigError, match="backend='triton'"):
        model_class("NemotronHForCausalLM").get_mamba_state_shape_from_config(vc)


def test_refuses_unsupported_model(dist, models, tmp_path):
    """Mamba2ForCausalLM uses vLLM's MambaMixer2 (so gets the replay subclass) but is not a
    model the plugin declares pages for: its layers refuse at construction."""
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "torch_dtype": "bfloat16",
        "vocab_size": 1024, "hidden_size": 128, "num_hidden_layers": 2, "num_heads": 8, "head_dim": 32,
        "state_size": 16, "n_groups": 1, "conv_kernel": 4, "expand": 2}))
    vc = make_config(str(tmp_path), {"mode": "replay", "backend": "reference"})
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    with set_current_vllm_config(vc), pytest.raises(ReplayConfigError, match="Mamba2ForCausalLM.*not supported"):
        MambaMixer2(hidden_size=128, ssm_state_size=16, conv_kernel_size=4, intermediate_size=256, use_conv_bias=True,
                    use_bias=False, n_groups=1, num_heads=8, head_dim=32, model_config=vc.model_config,
                    cache_config=vc.cache_config, prefix=f"model.layers.{next(_n)}.mixer")
    with pytest.raises(ReplayConfigError, match="mode"):
        engine.engine_config(make_config(models["nemotron_h"], {"mode": "fast"}))


def test_one_column_block_table_is_widened_for_vllms_conv_call(dist, models):
    """One page per request: vLLM's eager path hands a (n, 1) block table where its conv kernel
    reads the window length from the column count; the layer widens it for its own call only."""
    import dataclasses as dc

    from replayssm.vllm import layers

    @dc.dataclass
    class MD:
        state_indices_tensor_d: torch.Tensor

    vc = make_config(models["nemotron_h"], {"mode": "replay", "backend": "reference"}, spec=3)
    layer = mamba2_layer(vc)
    md = MD(torch.tensor([[7], [0]], dtype=torch.int32))
    raw = {layer.prefix: md}
    seen = {}

    def forward():
        seen["t"] = raw[layer.prefix].state_indices_tensor_d
        seen["running"] = layers.running_layer()

    layer._run_vllm(raw, md, "state_indices_tensor_d", forward)
    assert seen["t"].shape == (2, 4) and seen["t"].tolist() == [[7] * 4, [0] * 4] and seen["running"] is layer
    assert raw[layer.prefix] is md and layers.running_layer() is None
