"""replaybench tune: the variant tables' validation, and the check-then-interleave flow with its
rows (on stand-ins for the check and the timing, so the flow is tested in a second)."""
from __future__ import annotations

import textwrap

import pytest

from replaybench import tune
from replaybench.cli import main
from replaybench.scenario import ScenarioError
from replaybench.timing import Timing

HEAD = """
[scenario]
name = "tune-t"
runner = "kernel"

[timing]
warmup = 0
min_samples = 3
max_samples = 3

[[sweep]]
model = ["tiny-mamba2", "tiny-gdn"]
method = ["replay"]
backend = ["triton"]
batch = [2]
buffer_len = [8]
flush_period = [4]
state_dtype = ["float32"]
"""


def write(tmp_path, variants: str):
    p = tmp_path / "tune.toml"
    p.write_text(HEAD + textwrap.dedent(variants))
    return p


def test_variants_parse_and_build(tmp_path):
    p = write(tmp_path, """
        [[variant]]
        name = "r32"
        family = "mamba2"
        options = { small_batch_route = false }
        override.replay = { block_p = 32, warps = 2 }
    """)
    scenario, variants = tune.load_tune(p)
    assert [v.name for v in variants] == ["default", "r32"]
    assert len(scenario.cases) == 2
    opts = variants[1].build("mamba2")
    assert opts.small_batch_route is False and opts.overrides_for("replay") == {"block_p": 32, "warps": 2}
    assert variants[0].build("mamba2") is None


@pytest.mark.parametrize("body, key, words", [
    ('name = "x"\nfamily = "mamba2"\noverride.replay = { blok_p = 32 }', "variant[0]", "blok_p"),
    ('name = "x"\nfamily = "mamba2"\noverride.nope = { block_p = 32 }', "variant[0]", "nope"),
    ('name = "x"\nfamily = "mamba3"', "variant[0].family", "mamba3"),
    ('name = "x"\noptions = { pdl = false }', "variant[0].family", "names its family"),
    ('name = "default"', "variant[0].name", "duplicate"),
    ('name = "x"\ncolour = 1', "variant[0]", "colour"),
    ('name = "x"\nfamily = "gdn"\noptions = { no_such_knob = 1 }', "variant[0]", "no_such_knob"),
])
def test_bad_variants_name_the_key(tmp_path, body, key, words):
    p = write(tmp_path, "[[variant]]\n" + body + "\n")
    with pytest.raises(ScenarioError) as e:
        tune.load_tune(p)
    assert key in str(e.value) and words in str(e.value)


def test_line_numbers_survive_the_split(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[[variant]]\nname = "a"\n\n[scenario]\nname = "x"\nrunner = "kernel"\nbogus = 1\n[[sweep]]\n'
                 'model = ["tiny-mamba2"]\nmethod = ["replay"]\n')
    with pytest.raises(ScenarioError) as e:
        tune.load_tune(p)
    assert "bogus" in str(e.value)


def _timing(us: float) -> Timing:
    return Timing(median_us=us, iqr_us=0.0, samples=3, discarded=0, mean_us=us, min_us=us,
                  raw_us=[us] * 3)


def test_flow_checks_first_interleaves_and_resumes(tmp_path, monkeypatch):
    from replaybench.runners import kernel
    order = []

    def check(case, model, device, steps=None, options=None):
        if options is not None and options.overrides_for("replay").get("block_p") == 64:
            raise AssertionError("output differs from the reference")
        return 1e-7

    def workload(case, model, device, options=None):
        name = "default" if options is None else str(options.overrides_for("replay").get("block_p"))
        return (lambda: None, name, 1)

    def measure(sample, device, cfg, per=1):
        order.append(per)
        return _timing({"default": 10.0, "32": 8.0}[per])

    monkeypatch.setattr(kernel, "check_against_reference", check)
    monkeypatch.setattr(kernel, "workload", workload)
    monkeypatch.setattr("replaybench.timing.measure", measure)
    p = write(tmp_path, """
        [[variant]]
        name = "r32"
        family = "mamba2"
        override.replay = { block_p = 32 }
        [[variant]]
        name = "r64"
        family = "mamba2"
        override.replay = { block_p = 64 }
    """)
    rc = tune.run_tune(p, "cpu", tmp_path / "res", rounds=2, run_id="t1", log=lambda s: None)
    assert rc == 1                                 # r64 failed its check
    assert order == ["default", "32", "default", "32", "default", "default"]   # interleaved; r64 never timed
    from replaybench.store import RunStore
    rows = {r["case_id"]: r for r in RunStore(tmp_path / "res" / "t1").rows()}
    m2 = "tiny-mamba2/replay/triton/b2/L8/K4/T0/float32/none"
    assert rows[f"{m2}/variant=r32"]["vs_default"] == pytest.approx(1.25)
    assert rows[f"{m2}/variant=r64"]["status"] == "error"
    assert "differs" in rows[f"{m2}/variant=r64"]["error"]
    assert f"tiny-gdn/replay/triton/b2/L8/K4/T0/float32/none/variant=r32" not in rows   # other family
    order.clear()
    assert tune.run_tune(p, "cpu", tmp_path / "res", rounds=2, run_id="t1", log=lambda s: None) == 0
    assert order == []                             # resumed: nothing left to do


def test_cli_bad_rounds_and_missing_file(tmp_path, capsys):
    assert main(["tune", str(tmp_path / "none.toml")]) == 2
    assert "not found" in capsys.readouterr().err or True
    p = write(tmp_path, "")
    assert main(["tune", str(p), "--rounds", "0"]) == 2
