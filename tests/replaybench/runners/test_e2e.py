"""The e2e runner on a CPU machine: it refuses with the reason; its model configs, arms,
engine settings and equivalence rule are checked without vLLM or a GPU."""
import pytest

from replaybench.models import get_model
from replaybench.runners import SkipCase, e2e
from replaybench.scenario import load_scenario

STUDY = ("nemotron-3-nano-4b", "nemotron-3-super-120b-a12b@d0.25", "qwen3.5-4b", "qwen3.5-122b-a10b@d0.25")


@pytest.fixture(scope="module")
def scenario():
    return load_scenario("scenarios/h200-e2e.toml")


def test_scenario_covers_every_arm_model_and_batch(scenario):
    cases = scenario.cases
    assert scenario.runner == "e2e" and len(cases) == 4 * 5 * 4
    assert {c.method for c in cases} == set(e2e.ARMS)
    assert {c.batch for c in cases} == {64, 128, 256, 512}
    assert {get_model(c.model).name for c in cases} == {get_model(m).name for m in STUDY}
    for c in cases:        # each model's stock arm comes first (the equivalence reference)
        first = next(x for x in cases if x.model == c.model)
        assert first.method == e2e.STOCK
    spec = [c for c in cases if c.spec_window]
    assert {c.spec_window for c in spec} == {4} and all(c.buffer_len >= c.flush_period + 4 for c in spec
                                                        if c.method == "spec-replay")


def test_check_scenario_runs_the_plugin_arms_after_stock():
    cases = load_scenario("scenarios/h200-e2e-check.toml").cases
    assert [c.method for c in cases[:4]] == ["vllm-eager", "replay", "replay-dual", "spec-replay"]
    assert {c.backend for c in cases if c.method != "vllm-eager"} == {"reference"}


def test_refused_on_a_cpu_machine(scenario):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(SkipCase, match="CUDA"):
        e2e.run(scenario.cases[0], None)


@pytest.mark.parametrize("name", STUDY)
def test_model_configs_keep_dims_and_layer_ratio(name):
    m, base = get_model(name), get_model(name.split("@")[0])
    cfg = e2e.model_config(name)
    assert cfg["num_hidden_layers"] == m.n_layers and cfg["hidden_size"] == base.hidden
    d = dict(m.dims)
    if m.op == "mamba2":
        pat = cfg["hybrid_override_pattern"]
        assert len(pat) == m.n_layers and cfg["mamba_num_heads"] == d["nheads"]
        assert pat.count("M") == m.n_ssm_layers and pat.count("*") == m.n_attn_layers
        assert set(pat) == set(base.pattern)      # MoE / MLP layers kept in the mix
    else:
        types = cfg["layer_types"]
        assert len(types) == m.n_layers and types.count("full_attention") == m.n_layers // 4
        assert cfg["linear_num_value_heads"] == d["num_v_heads"] and cfg["architectures"] == ["Qwen3NextForCausalLM"]
    assert e2e.model_config(name, qwen_arch="qwen3_5")["architectures"][0].startswith(
        "Qwen3_5" if m.op == "gdn" else "NemotronH")


def test_arms_and_engine_settings(scenario):
    st = e2e.settings({})
    by = {c.method: c for c in scenario.cases if c.batch == 256 and c.model == scenario.cases[0].model}
    stock = e2e.engine_kwargs(by["vllm-eager"], st, "/m")
    assert "additional_config" not in stock and not stock["enforce_eager"] and not stock["enable_prefix_caching"]
    assert stock["max_model_len"] == 256 + 512 + 16 and stock["load_format"] == "dummy"
    dual = e2e.engine_kwargs(by["replay-dual"], st, "/m")["additional_config"]["replayssm"]
    assert dual == {"mode": "replay-dual", "backend": "triton", "buffer_len": 16, "flush_period": 16,
                    "lo_dtype": "bfloat16"}
    spec = e2e.engine_kwargs(by["spec-replay"], st, "/m")
    assert spec["speculative_config"]["num_speculative_tokens"] == 3          # T = 4
    assert spec["speculative_config"] == e2e.engine_kwargs(by["vllm-spec"], st, "/m")["speculative_config"]
    assert spec["additional_config"]["replayssm"]["buffer_len"] == 20


def test_equivalence_rule():
    ref = [[1, 2, 3], [4, 5, 6]]
    lp = [[-0.1, -0.2, -0.3], [-0.1, -0.1, -0.1]]
    ok = e2e.equivalence(ref, lp, ref, [[-0.1, -0.25, -0.3], [-0.1, -0.1, -0.1]])
    assert ok["equiv_ok"] and ok["equiv_top1"] == 1.0 and abs(ok["equiv_max_dlogprob"] - 0.05) < 1e-9
    bad = e2e.equivalence(ref, lp, [[1, 2, 3], [4, 9, 9]], lp)
    assert not bad["equiv_ok"] and bad["equiv_top1"] == pytest.approx(4 / 6)


def test_replay_layer_count_finds_layers_with_the_replay_layout():
    import torch

    class Layer(torch.nn.Module):
        def __init__(self, replay):
            super().__init__()
            self.replay = replay

    model = torch.nn.Sequential(Layer(None), Layer({"mode": "replay"}), torch.nn.Linear(2, 2), Layer({"mode": "x"}))
    assert e2e.replay_layer_count(model) == 2


def _vllm_or_skip():
    try:
        import vllm
        if getattr(vllm, "__file__", None) is None or vllm.__version__ != "0.26.0":
            raise ImportError("no vLLM 0.26.0")
    except Exception as e:
        pytest.skip(f"vLLM 0.26.0 not importable ({type(e).__name__}: {e})")


# Nano-4B's pattern has '-' (dense MLP), which the CPU test install's transformers 5.5.3 rejects
@pytest.mark.parametrize("name", ["nemotron-3-super-120b-a12b@d0.25", "qwen3.5-4b", "qwen3.5-122b-a10b@d0.25"])
def test_vllm_parses_the_model_configs_and_plans_replay_pages(name, tmp_path):
    """vLLM's own config classes take the generated config.json, and the plugin's model class
    declares its layout on it (run where vLLM 0.26.0 imports)."""
    _vllm_or_skip()
    import replayssm.vllm as plugin
    from replayssm.vllm.layout import page_bytes
    from vllm import ModelRegistry
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig
    plugin.register()
    d = e2e.write_model_dir(str(tmp_path), name, e2e.model_config(name))
    mc = ModelConfig(model=d, skip_tokenizer_init=True, dtype="bfloat16")
    vc = VllmConfig(model_config=mc, device_config=DeviceConfig(device="cpu"),
                    cache_config=CacheConfig(mamba_ssm_cache_dtype="float32", enable_prefix_caching=False),
                    additional_config={"replayssm": {"mode": "replay", "backend": "reference"}})
    cls = ModelRegistry.models[mc.architecture].load_model_cls()
    shapes, dtypes = cls.get_mamba_state_shape_from_config(vc), cls.get_mamba_state_dtype_from_config(vc)
    ssm = dict(get_model(name).dims)
    assert shapes[1] == ((ssm["nheads"], ssm["head_dim"], ssm["d_state"]) if "nheads" in ssm else
                         (ssm["num_v_heads"], ssm["head_v_dim"], ssm["head_k_dim"]))
    assert dtypes[1] == __import__("torch").float32 and len(shapes) > 2
    assert page_bytes(shapes, dtypes) > page_bytes(shapes[:2], dtypes[:2])


def test_mean_accepted_length_between_counter_readings():
    assert e2e.mean_accepted((10.0, 5.0), (30.0, 35.0)) == 2.5        # 20 drafts, 30 accepted tokens
    assert e2e.mean_accepted((1.0, 1.0), (1.0, 1.0)) != e2e.mean_accepted((1.0, 1.0), (1.0, 1.0))   # nan
