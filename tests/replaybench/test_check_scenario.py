"""A scenario's [check] table: validated with the scenario, read by `replaybench check`."""
import pytest

from replaybench import stats as S
from replaybench.scenario import ScenarioError, parse_scenario

SCEN = """
[scenario]
name = "t"
runner = "kernel"

[[sweep]]
model = "tiny-mamba2"
method = "eager"
"""


def test_scenario_accepts_and_validates_a_check_table():
    s = parse_scenario(SCEN + '\n[check]\nthreshold = 0.02\n[check.cases]\n"*/b1/*" = 0.05\n')
    cfg = S.check_config_from_text(s.text)
    assert cfg.threshold == 0.02 and cfg.cases == (("*/b1/*", 0.05),)
    with pytest.raises(ScenarioError, match=r"check\.threshold.*allowed"):
        parse_scenario(SCEN + "\n[check]\nthreshold = -1\n")
