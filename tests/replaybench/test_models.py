import pytest

from replayssm.inputs import GDNShape, Mamba2Shape

from replaybench.models import MODELS, get_model, models_table, scaled_model

MiB = 1024 * 1024


@pytest.mark.parametrize("name,per_layer_mib,per_seq_mib", [
    ("nemotron-3-nano-4b", 3.75, 78.75),
    ("nemotron-3-super-120b-a12b", 4, 160),
    ("qwen3.5-4b", 2, 48),
    ("qwen3.5-122b-a10b", 4, 144),
    ("nemotron-3-ultra-550b-a55b", 8, 384),
    ("nemotron-3-nano-30b-a3b", 2, 46),
])
def test_state_bytes_match_models_md(name, per_layer_mib, per_seq_mib):
    m = get_model(name)
    assert m.state_bytes_per_layer(4) == per_layer_mib * MiB
    assert m.state_bytes_per_seq(4) == per_seq_mib * MiB
    assert m.state_bytes_per_seq(2) == per_seq_mib * MiB / 2


def test_study_model_facts():
    """The one check of the model table's SSM dims against MODELS.md (the published configs)."""
    nano = get_model("nemotron-3-nano-4b")
    assert nano.op == "mamba2" and isinstance(nano.ssm, Mamba2Shape)
    assert (nano.ssm.nheads, nano.ssm.head_dim, nano.ssm.d_state, nano.ssm.n_groups) == (96, 80, 128, 8)
    assert nano.pattern.count("M") == nano.n_ssm_layers == 21
    assert nano.pattern.count("*") == nano.n_attn_layers == 4
    assert len(nano.pattern) == nano.n_layers == 42
    sup = get_model("nemotron-3-super-120b-a12b")
    assert sup.pattern.count("M") == 40 and sup.pattern.count("*") == 8 and len(sup.pattern) == 88
    q = get_model("qwen3.5-122b-a10b")
    assert q.op == "gdn" and isinstance(q.ssm, GDNShape)
    assert (q.ssm.num_k_heads, q.ssm.num_v_heads, q.ssm.head_k_dim, q.ssm.head_v_dim) == (16, 64, 128, 128)
    assert q.n_ssm_layers + q.n_attn_layers == q.n_layers


def test_tiny_models():
    tm, tg = get_model("tiny-mamba2"), get_model("tiny-gdn")
    assert tm.tiny and tg.tiny
    assert not any(m.tiny for n, m in MODELS.items() if not n.startswith("tiny"))
    assert (tm.ssm.nheads, tm.ssm.head_dim, tm.ssm.d_state, tm.ssm.n_groups) == (4, 16, 16, 2)
    assert (tg.ssm.num_k_heads, tg.ssm.num_v_heads, tg.ssm.head_k_dim, tg.ssm.head_v_dim) == (2, 4, 16, 16)


def test_case_insensitive_and_unknown():
    assert get_model("Nemotron-3-Nano-4B") is MODELS["nemotron-3-nano-4b"]
    assert get_model("  QWEN3.5-4B ").name == "qwen3.5-4b"
    with pytest.raises(ValueError) as e:
        get_model("nemotron-5")
    assert "nemotron-5" in str(e.value) and "qwen3.5-4b" in str(e.value) and "tiny-gdn" in str(e.value)


def test_scaled_model_mamba2():
    m = scaled_model("nemotron-3-super-120b-a12b", depth=0.5, width=2)
    assert m.name == "nemotron-3-super-120b-a12b@d0.5w2"
    assert m.n_ssm_layers == 20 and m.n_attn_layers == 4
    assert m.ssm.nheads == 256 and m.ssm.head_dim == 64 and m.ssm.n_groups == 8
    assert m.state_bytes_per_seq(4) == 20 * 8 * MiB
    assert m.base == "nemotron-3-super-120b-a12b" and m.pattern is None
    assert get_model("nemotron-3-super-120b-a12b@d0.5w2") == m
    assert get_model("Nemotron-3-Super-120B-A12B@w2").name == "nemotron-3-super-120b-a12b@d1w2"


def test_scaled_model_gdn_keeps_ratio():
    m = get_model("qwen3.5-122b-a10b@d1w0.5")
    assert (m.ssm.num_k_heads, m.ssm.num_v_heads) == (8, 32)
    assert m.n_ssm_layers == 36
    m2 = scaled_model("qwen3.5-4b", width=3)
    assert (m2.ssm.num_k_heads, m2.ssm.num_v_heads) == (48, 96)


@pytest.mark.parametrize("bad", ["nemotron-3-nano-4b@", "nemotron-3-nano-4b@x2", "foo@d2",
                                 "nemotron-3-nano-4b@d0", "nemotron-3-nano-4b@d1w2@d1"])
def test_bad_scaled_names(bad):
    with pytest.raises(ValueError):
        get_model(bad)


def test_models_table():
    t = models_table()
    for n in MODELS:
        assert n in t
    assert "78.75 MiB" in t and "384.00 MiB" in t
    assert "@d0.5w1" in models_table(["nemotron-3-nano-4b@d0.5"])
