
import pytest

from conftest import REPO, scenario_text
from replaybench.scenario import (METHODS, ScenarioError, TimingConfig, load_scenario,
                                  make_case_id, parse_scenario)

SMOKE = REPO / "scenarios" / "smoke.toml"


def load(write_scenario, body, **kw):
    return load_scenario(write_scenario(body, **kw))


# ----------------------------------------------------------------------------- smoke

def test_smoke_scenario_loads():
    sc = load_scenario(SMOKE)
    assert sc.name == "smoke" and sc.runner == "kernel"
    ids = [c.case_id for c in sc.cases]
    assert len(ids) == len(set(ids))
    # reference block, per model: eager x 2 batches + 3 replay methods x 2 batches x 5 valid (L,K)
    # pairs (K=16 > L=8 skipped); triton block, per model: 4 methods at one configuration
    assert len(sc.cases) == 2 * (2 + 3 * 2 * 5) + 2 * 4
    assert {c.model for c in sc.cases} == {"tiny-mamba2", "tiny-gdn"}
    assert {c.op for c in sc.cases if c.model == "tiny-gdn"} == {"gdn"}
    assert {c.op for c in sc.cases if c.model == "tiny-mamba2"} == {"mamba2"}
    assert {(c.buffer_len, c.flush_period) for c in sc.cases if c.method == "replay"} == \
        {(8, 4), (8, 8), (16, 4), (16, 8), (16, 16)}
    assert {c.backend for c in sc.cases} == {"reference", "triton"}
    assert all(c.device == "" for c in sc.cases)
    assert sc.timing.max_samples <= 10  # CPU smoke stays fast


def test_case_id_stable_and_readable():
    a, b = load_scenario(SMOKE), load_scenario(SMOKE)
    assert [c.case_id for c in a.cases] == [c.case_id for c in b.cases]
    assert "tiny-mamba2/replay/reference/b4/L16/K16/T0/float32/none" in {c.case_id for c in a.cases}
    assert make_case_id("m", "eager", "triton", 2, 0, 0, 0, "float32", "none") == \
        "m/eager/triton/b2/L0/K0/T0/float32/none"
    assert make_case_id("m", "eager", "triton", 2, 0, 0, 0, "float32", "none", seed=3).endswith("/s3")


def test_case_ids_do_not_depend_on_axis_order(write_scenario):
    s1 = load(write_scenario, """
        [[sweep]]
        model = ["tiny-gdn", "tiny-mamba2"]
        method = ["replay", "eager"]
        batch = [4, 1]
    """, fname="a.toml")
    s2 = load(write_scenario, """
        [[sweep]]
        batch = [1, 4]
        method = ["eager", "replay"]
        model = ["tiny-mamba2", "tiny-gdn"]
    """, fname="b.toml")
    assert {c.case_id for c in s1.cases} == {c.case_id for c in s2.cases}


# ----------------------------------------------------------------------------- collapse rules

def test_eager_collapses_buffer_lo_and_spec(write_scenario):
    sc = load(write_scenario, """
        [[sweep]]
        model = "tiny-mamba2"
        method = ["eager", "vllm-eager"]
        backend = ["reference", "triton"]
        buffer_len = [8, 16, 32]
        flush_period = [4, 8, "buffer_len"]
        lo_dtype = ["bfloat16", "float16"]
        spec_window = [0, 2]
    """)
    eager = [c for c in sc.cases if c.method == "eager"]
    assert len(eager) == 2  # one per backend; nothing else multiplies
    assert all((c.buffer_len, c.flush_period, c.lo_dtype, c.spec_window) == (0, 0, "none", 0)
               for c in sc.cases)
    vl = [c for c in sc.cases if c.method == "vllm-eager"]
    assert len(vl) == 1 and vl[0].backend == "vllm"


def test_replay_collapses_lo_and_spec(write_scenario):
    sc = load(write_scenario, """
        [[sweep]]
        model = "tiny-gdn"
        method = "replay"
        buffer_len = [8, 16]
        flush_period = [8, "buffer_len"]
        lo_dtype = ["bfloat16", "float16", "none"]
        spec_window = [0, 3]
    """)
    assert sorted((c.buffer_len, c.flush_period) for c in sc.cases) == [(8, 8), (16, 8), (16, 16)]
    assert all(c.lo_dtype == "none" and c.spec_window == 0 for c in sc.cases)


def test_dual_and_shared_low(write_scenario):
    sc = load(write_scenario, """
        [[sweep]]
        model = "tiny-mamba2"
        method = ["replay-dual", "replay-shared-low"]
        buffer_len = 16
        state_dtype = "float32"
        lo_dtype = ["bfloat16", "float16", "float8_e4m3"]
    """)
    dual = [c for c in sc.cases if c.method == "replay-dual"]
    shared = [c for c in sc.cases if c.method == "replay-shared-low"]
    assert {c.lo_dtype for c in dual} == {"bfloat16", "float16", "float8_e4m3"}
    assert all(c.state_dtype == "float32" for c in dual)
    assert all(c.state_dtype == c.lo_dtype for c in shared) and len(shared) == 3


def test_dual_speculative_replay(write_scenario):
    sc = load(write_scenario, """
        [[sweep]]
        model = "tiny-gdn"
        method = ["spec-replay", "spec-replay-dual"]
        buffer_len = 12
        flush_period = 8
        spec_window = [2, 4]
        state_dtype = "float32"
        lo_dtype = ["bfloat16", "float8_e4m3"]
    """)
    dual = [c for c in sc.cases if c.method == "spec-replay-dual"]
    plain = [c for c in sc.cases if c.method == "spec-replay"]
    assert sorted((c.spec_window, c.lo_dtype) for c in dual) == [(2, "bfloat16"), (2, "float8_e4m3"),
                                                                  (4, "bfloat16"), (4, "float8_e4m3")]
    assert len(plain) == 2 and all(c.lo_dtype == "none" for c in plain)
    with pytest.raises(ScenarioError, match="lo_dtype"):
        load(write_scenario, '[[sweep]]\nmodel="tiny-gdn"\nmethod="spec-replay-dual"\nspec_window=2\n'
                             'buffer_len=12\nflush_period=8\nlo_dtype="none"\n')
    with pytest.raises(ScenarioError, match="float32"):
        load(write_scenario, '[[sweep]]\nmodel="tiny-gdn"\nmethod="spec-replay-dual"\nspec_window=2\n'
                             'buffer_len=12\nflush_period=8\nstate_dtype="bfloat16"\nlo_dtype="bfloat16"\n')


def test_shared_low_collapses_state_axis(write_scenario):
    sc = load(write_scenario, """
        [[sweep]]
        model = "tiny-mamba2"
        method = "replay-shared-low"
        state_dtype = ["float32", "bfloat16", "float16"]
        lo_dtype = "float16"
    """)
    assert len(sc.cases) == 1 and sc.cases[0].state_dtype == "float16"


def test_spec_methods(write_scenario):
    sc = load(write_scenario, """
        [[sweep]]
        model = "tiny-gdn"
        method = ["spec-replay", "spec-perdraft", "vllm-spec", "replay"]
        backend = ["triton", "reference"]
        buffer_len = 16
        flush_period = 8
        spec_window = [2, 4]
    """)
    by = {}
    for c in sc.cases:
        by.setdefault(c.method, []).append(c)
    assert {c.spec_window for c in by["spec-replay"]} == {2, 4}
    assert len(by["spec-replay"]) == 4 and len(by["spec-perdraft"]) == 4
    assert {c.backend for c in by["vllm-spec"]} == {"vllm"} and len(by["vllm-spec"]) == 2
    assert all(c.buffer_len == 0 for c in by["vllm-spec"])
    assert all(c.spec_window == 0 for c in by["replay"]) and len(by["replay"]) == 2


def test_union_of_blocks_deduplicated(write_scenario):
    sc = load(write_scenario, """
        [[sweep]]
        model = "tiny-mamba2"
        method = ["eager", "replay"]
        batch = [1, 2]
        [[sweep]]
        model = "tiny-mamba2"
        method = ["eager"]
        batch = [2, 8]
    """)
    assert len(sc.cases) == 4 + 1
    assert len({c.case_id for c in sc.cases}) == 5


def test_defaults_and_timing(write_scenario):
    sc = load(write_scenario, """
        [[sweep]]
        model = "tiny-mamba2"
        method = "replay"
    """)
    (c,) = sc.cases
    assert (c.backend, c.batch, c.buffer_len, c.flush_period, c.state_dtype, c.seed) == \
        ("reference", 1, 16, 16, "float32", 0)
    assert sc.timing == TimingConfig()
    sc2 = load(write_scenario, """
        [[sweep]]
        model = "tiny-mamba2"
        method = "eager"
        seed = 7
    """, timing="[timing]\nwarmup = 0\nmin_samples = 2\nmax_samples = 2\nmax_time_s = 1\nrel_iqr = 0\n",
        fname="t2.toml")
    assert sc2.timing == TimingConfig(0, 2, 2, 1.0, 0.0)
    assert sc2.cases[0].seed == 7 and sc2.cases[0].case_id.endswith("/s7")


def test_scaled_model_names_are_canonical(write_scenario):
    sc = load(write_scenario, """
        [[sweep]]
        model = ["Nemotron-3-Nano-4B@d0.5", "qwen3.5-4b"]
        method = "eager"
    """)
    assert {c.model for c in sc.cases} == {"nemotron-3-nano-4b@d0.5w1", "qwen3.5-4b"}


def test_skip_invalid_combinations(write_scenario):
    sc = load(write_scenario, """
        [[sweep]]
        model = "tiny-mamba2"
        method = ["replay", "replay-dual"]
        buffer_len = [8, 16]
        flush_period = [4, 16]
        state_dtype = ["float32", "bfloat16"]
        invalid = "skip"
    """)
    # replay: 2 L x 2 K x 2 state minus K16>L8 (2) = 6; dual: only float32: 3
    assert len(sc.cases) == 6 + 3
    reasons = [s.reason for s in sc.skipped]
    keys = {s.key for s in sc.skipped}
    assert keys == {"sweep[0].flush_period", "sweep[0].state_dtype"}
    assert any("flush_period 16 > buffer_len 8" in r for r in reasons)
    assert any("float32" in r for r in reasons)
    assert len(sc.skipped) == len({s.combo for s in sc.skipped})
    plan = sc.plan_text()
    assert "skipped" in plan and "flush_period 16 > buffer_len 8" in plan


# ----------------------------------------------------------------------------- errors

ERRORS = [
    # (body, key, substrings that must appear in the message)
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="replai"\n', "sweep[0].method",
     ["'replai'", "allowed: eager, replay, replay-dual, replay-shared-low, spec-replay"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\nbackend="cuda"\n', "sweep[0].backend",
     ["'cuda'", "reference, triton, vllm"]),
    ('[[sweep]]\nmodel="llama"\nmethod="eager"\n', "sweep[0].model", ["'llama'", "tiny-mamba2", "qwen3.5-4b"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\nstate_dtype="fp32"\n', "sweep[0].state_dtype",
     ["'fp32'", "float32, bfloat16, float16"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="replay-dual"\nlo_dtype="int8"\n', "sweep[0].lo_dtype",
     ["'int8'", "bfloat16, float16, float8_e4m3"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\nbatch=[1, 0]\n', "sweep[0].batch", ["0", "integers >= 1"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\nbatch=true\n', "sweep[0].batch", ["True", "integers >= 1"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="replay"\nbuffer_len=-1\n', "sweep[0].buffer_len", ["-1", "integers >= 1"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="replay"\nflush_period="L"\n', "sweep[0].flush_period",
     ["'L'", '"buffer_len"']),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="spec-replay"\nspec_window=9\n', "sweep[0].spec_window", ["9", "0..8"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\nbatch=[]\n', "sweep[0].batch", ["empty"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\nbatchsize=4\n', "sweep[0].batchsize",
     ["unknown key", "allowed: model, method, backend, batch"]),
    ('[[sweep]]\nmethod="eager"\n', "sweep[0].model", ["required"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\ninvalid="ignore"\n', "sweep[0].invalid", ["'ignore'", "error, skip"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\nseed=-1\n', "sweep[0].seed", ["-1", "integer >= 0"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\n[[sweep]]\nmodel="tiny-gdn"\nmethod="eagr"\n',
     "sweep[1].method", ["'eagr'"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\n[extra]\nx=1\n', "extra", ["unknown key", "scenario, timing, sweep"]),
    ('[timing]\nwarmups=3\n[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\n', "timing.warmups",
     ["unknown key", "warmup, min_samples, max_samples, max_time_s, rel_iqr"]),
    ('[timing]\nwarmup=-1\n[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\n', "timing.warmup", ["-1", "integer >= 0"]),
    ('[timing]\nmin_samples=10\nmax_samples=5\n[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\n',
     "timing.max_samples", ["5", ">= min_samples"]),
    ('[timing]\nmax_time_s=0\n[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\n', "timing.max_time_s", ["number > 0"]),
    ('', "sweep", ["[[sweep]]"]),
    # invalid combinations with invalid = "error" (the default)
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="replay"\nbuffer_len=8\nflush_period=16\n', "sweep[0].flush_period",
     ["tiny-gdn/replay/reference/b1/L8/K16", "flush_period 16 > buffer_len 8", 'invalid = "skip"']),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="spec-replay"\nbuffer_len=16\nflush_period=16\nspec_window=4\n',
     "sweep[0].buffer_len", ["buffer_len 16 < flush_period 16 + spec_window 4"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="spec-replay"\nspec_window=0\n', "sweep[0].spec_window", ["1..8"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="replay-dual"\nstate_dtype="bfloat16"\n', "sweep[0].state_dtype",
     ["allowed: float32"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="replay-dual"\nlo_dtype="none"\n', "sweep[0].lo_dtype",
     ["bfloat16, float16, float8_e4m3"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="replay"\nbackend="triton"\nstate_dtype="float64"\n',
     "sweep[0].state_dtype", ["float64", "reference"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="replay"\nbackend="vllm"\n', "sweep[0].backend",
     ["vllm-* methods", "allowed: reference, triton"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="spec-replay"\nbuffer_len=20\naccept="poisson"\n', "sweep[0].accept",
     ["'poisson'", "fixed:T/2", "uniform", "geom:<p>"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="spec-replay"\nbuffer_len=20\naccept=["uniform", "geom:1.5"]\n',
     "sweep[0].accept", ["'geom:1.5'", "0 < p < 1"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="spec-replay"\nbuffer_len=20\naccept=-1\n', "sweep[0].accept", ["-1"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="spec-perdraft"\nspec_window=4\naccept=5\n', "sweep[0].accept",
     ["acc=fixed:5", "5 accepted tokens per round > spec_window 4"]),
]


@pytest.mark.parametrize("body,key,parts", ERRORS, ids=[e[1] + str(i) for i, e in enumerate(ERRORS)])
def test_validation_errors(write_scenario, body, key, parts):
    path = write_scenario(body)
    with pytest.raises(ScenarioError) as ei:
        load_scenario(path)
    e = ei.value
    msg = str(e)
    assert e.key == key
    assert msg.startswith(f"{path}: {key}: ")
    for p in parts:
        assert p in msg, (p, msg)


@pytest.mark.parametrize("head,key,parts", [
    ('[scenario]\nname="x"\nrunner="kernel"\nauthor="me"\n', "scenario.author", ["unknown key", "name, description, runner"]),
    ('[scenario]\nname="x"\nrunner="gpu"\n', "scenario.runner", ["'gpu'", "kernel, layer, e2e, drift"]),
    ('[scenario]\nname="a b"\n', "scenario.name", ["'a b'"]),
    ('', "scenario", ["[scenario]"]),
])
def test_scenario_table_errors(tmp_path, head, key, parts):
    p = tmp_path / "h.toml"
    p.write_text(head + '[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\n')
    with pytest.raises(ScenarioError) as ei:
        load_scenario(p)
    assert ei.value.key == key and str(p) in str(ei.value)
    for part in parts:
        assert part in str(ei.value)


def test_malformed_toml_names_file_and_line(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[scenario]\nname = "x"\n\n[[sweep]]\nmodel = ["tiny-gdn"\nmethod = "eager"\n')
    with pytest.raises(ScenarioError) as ei:
        load_scenario(p)
    msg = str(ei.value)
    assert str(p) in msg and "line" in ei.value.key and "malformed TOML" in msg
    assert ei.value.key in ("line 5", "line 6")


def test_missing_file(tmp_path):
    with pytest.raises(ScenarioError) as ei:
        load_scenario(tmp_path / "nope.toml")
    assert "nope.toml" in str(ei.value) and "not found" in str(ei.value)


def test_all_skipped_is_an_error(write_scenario):
    with pytest.raises(ScenarioError) as ei:
        load(write_scenario, """
            [[sweep]]
            model = "tiny-gdn"
            method = "replay"
            buffer_len = 4
            flush_period = 8
            invalid = "skip"
        """)
    assert "no valid case" in str(ei.value)


def test_entry_point_runner_accepted():
    sc = parse_scenario(scenario_text('[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\n',
                                      runner="pkg.mod:Thing"), file="x.toml")
    assert sc.runner == "pkg.mod:Thing" and sc.cases[0].runner == "pkg.mod:Thing"


def test_all_methods_known():
    assert set(METHODS) == {"eager", "replay", "replay-dual", "replay-shared-low", "spec-replay",
                            "spec-replay-dual", "spec-perdraft", "vllm-eager", "vllm-spec"}


# ----------------------------------------------------------------------------- speculative: accept axis

def test_accept_axis(write_scenario):
    sc = load(write_scenario, """
        [[sweep]]
        model = "tiny-mamba2"
        method = ["spec-replay", "spec-perdraft", "vllm-spec", "replay", "eager"]
        buffer_len = 20
        flush_period = 16
        spec_window = [2, 4]
        accept = ["fixed:T/2", 2, "uniform", "geom:0.70"]
    """)
    by = {}
    for c in sc.cases:
        by.setdefault(c.method, []).append(c)
    # T=2: fixed:1, fixed:2, uniform, geom:0.7; T=4: fixed:2 twice (deduplicated), uniform, geom:0.7
    assert sorted((c.spec_window, c.accept) for c in by["spec-replay"]) == [
        (2, "fixed:1"), (2, "fixed:2"), (2, "geom:0.7"), (2, "uniform"),
        (4, "fixed:2"), (4, "geom:0.7"), (4, "uniform")]
    assert len(by["spec-perdraft"]) == len(by["vllm-spec"]) == 7
    # the per-draft baseline has no buffer: L and K collapse
    assert all(c.buffer_len == 0 and c.flush_period == 0 for c in by["spec-perdraft"])
    assert "tiny-mamba2/spec-replay/reference/b1/L20/K16/T4/float32/none/acc=geom:0.7" in {c.case_id for c in sc.cases}
    # non-speculative methods: accept collapses to "none" and their case ids are unchanged
    assert [c.accept for c in by["replay"] + by["eager"]] == ["none", "none"]
    assert {c.case_id for c in by["replay"] + by["eager"]} == {
        "tiny-mamba2/replay/reference/b1/L20/K16/T0/float32/none", "tiny-mamba2/eager/reference/b1/L0/K0/T0/float32/none"}


def test_accept_default_is_half_the_window(write_scenario):
    sc = load(write_scenario, """
        [[sweep]]
        model = "tiny-gdn"
        method = "spec-perdraft"
        spec_window = [1, 3, 6]
    """)
    assert sorted((c.spec_window, c.accept) for c in sc.cases) == [(1, "fixed:0"), (3, "fixed:1"), (6, "fixed:3")]
    assert make_case_id("m", "spec-replay", "triton", 2, 20, 16, 4, "float32", "none", 3, "uniform") == \
        "m/spec-replay/triton/b2/L20/K16/T4/float32/none/acc=uniform/s3"


def test_spec_scenarios_load():
    smoke = load_scenario(REPO / "scenarios" / "spec-smoke.toml")
    assert {c.method for c in smoke.cases} == {"spec-replay", "spec-perdraft"}
    assert {c.model for c in smoke.cases} == {"tiny-mamba2", "tiny-gdn"}
    assert {c.backend for c in smoke.cases} == {"reference", "triton"} and len(smoke.cases) <= 24
    h200 = load_scenario(REPO / "scenarios" / "h200-spec.toml")
    assert len(h200.cases) <= 96
    assert {c.spec_window for c in h200.cases} == {2, 4, 6} and {c.batch for c in h200.cases} == {128, 256, 512}
    assert {c.method for c in h200.cases} == {"spec-replay", "spec-replay-dual", "spec-perdraft", "vllm-spec"}
    assert all(c.buffer_len == 16 + c.spec_window and c.flush_period == 16
               for c in h200.cases if c.method.startswith("spec-replay"))
    assert {(c.spec_window, c.lo_dtype) for c in h200.cases if c.method == "spec-replay-dual"} == {(4, "bfloat16")}
    assert all(c.state_dtype == "float32" and c.accept == f"fixed:{c.spec_window // 2}" for c in h200.cases)
    from replaybench.models import STUDY_MODELS
    assert {c.model for c in h200.cases} == set(STUDY_MODELS)


def test_h200_kernels_buffers_scenario():
    """Issue 5: buffer 32 with K = 32 and K = 16, buffer 16 with K = 8 (K < L), fp32 and dual
    (fp32 + bf16) state, batch 32 and 256, the study models, eager / vLLM baselines; <= 60 cases."""
    from replaybench.models import STUDY_MODELS
    sc = load_scenario(REPO / "scenarios" / "h200-kernels-buffers.toml")
    assert len(sc.cases) <= 60 and not sc.skipped
    assert {c.model for c in sc.cases} == set(STUDY_MODELS)
    assert {c.method for c in sc.cases} == {"eager", "vllm-eager", "replay", "replay-dual"}
    buf = [c for c in sc.cases if METHODS[c.method].buffer]
    for method, lo in (("replay", "none"), ("replay-dual", "bfloat16")):
        got = {(c.model, c.batch, c.buffer_len, c.flush_period) for c in buf if c.method == method}
        assert got == {(m, b, L, K) for m in STUDY_MODELS for b in (32, 256) for L, K in ((32, 32), (32, 16), (16, 8))}
        assert {(c.state_dtype, c.lo_dtype) for c in buf if c.method == method} == {("float32", lo)}
    # every replay case has its eager baseline (same model, batch, state dtype) in the same run
    eager = {(c.model, c.batch) for c in sc.cases if c.method == "eager" and c.state_dtype == "float32"}
    assert {(c.model, c.batch) for c in buf} <= eager
    assert {(c.model, c.batch) for c in sc.cases if c.method == "vllm-eager"} == {(m, 256) for m in STUDY_MODELS}
