"""The regression gate's statistics on synthetic samples of known answer."""
import numpy as np
import pytest

from replaybench import stats as S


def samples(rng, n=40, median=100.0, rel_sd=0.003, shift=1.0, outliers=0):
    """GPU-like samples: normal noise of rel_sd around median*shift, plus a few slow outliers."""
    x = median * shift * (1.0 + rng.normal(0.0, rel_sd, n))
    if outliers:
        x[rng.choice(n, outliers, replace=False)] *= 1.0 + rng.uniform(0.02, 0.1, outliers)
    return list(x)


def test_aa_is_same_at_realistic_noise():
    rng = np.random.default_rng(0)
    verdicts = [S.compare_samples(samples(rng, outliers=2), samples(rng, outliers=2), threshold=0.015).verdict
                for _ in range(300)]
    assert verdicts.count(S.SAME) == 300


def test_three_percent_slowdown_is_slower_every_time():
    rng = np.random.default_rng(1)
    for _ in range(200):
        c = S.compare_samples(samples(rng, n=30, rel_sd=0.005), samples(rng, n=30, rel_sd=0.005, shift=1.03),
                              threshold=0.015)
        assert c.verdict == S.SLOWER, c
        assert c.lo > 1.0 and c.lo < 1.03 < c.hi and c.p < 0.01


def test_speedup_is_faster_and_small_change_is_same():
    rng = np.random.default_rng(2)
    c = S.compare_samples(samples(rng), samples(rng, shift=0.95), threshold=0.02)
    assert c.verdict == S.FASTER and c.hi < 1.0
    c = S.compare_samples(samples(rng), samples(rng, shift=1.008), threshold=0.02)
    assert c.verdict == S.SAME and c.p < 0.01          # significant, but within the threshold


def test_wide_overlap_is_ambiguous():
    rng = np.random.default_rng(3)
    c = S.compare_samples(samples(rng, n=10, rel_sd=0.05), samples(rng, n=10, rel_sd=0.05, shift=1.03),
                          threshold=0.015)
    assert c.verdict == S.AMBIGUOUS and c.lo < 1.0 < 1.015 < c.hi


def test_verdict_rule():
    v = S.verdict_of
    assert v(1.03, 1.02, 1.04, 0.01) == S.SLOWER
    assert v(1.03, 0.99, 1.06, 0.01) == S.AMBIGUOUS       # holds 1 and reaches past 1.01
    assert v(1.005, 0.999, 1.009, 0.01) == S.SAME         # holds 1 but stays in the band
    assert v(1.008, 1.004, 1.02, 0.01) == S.SAME          # significant, point inside the band
    assert v(0.95, 0.94, 0.96, 0.01) == S.FASTER
    assert v(float("nan"), 0, 2, 0.01) == S.AMBIGUOUS


def test_mann_whitney_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(4)
    x, y = samples(rng, n=25), samples(rng, n=31, shift=1.002)
    y[:3] = x[:3]                                          # ties
    u, p = S.mann_whitney(x, y)
    ref = scipy_stats.mannwhitneyu(y, x, alternative="two-sided", method="asymptotic")
    assert u == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)


def test_shift_interval_holds_the_shift():
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, 50)
    est, lo, hi = S.shift_interval(x, x + 0.7, 0.05)
    assert est == pytest.approx(0.7) and lo <= 0.7 <= hi
    est, lo, hi = S.shift_interval([1.0, 2.0], [1.5], 0.01)  # too few samples: the whole range
    assert (lo, hi) == (-0.5, 0.5)


def test_quartile_fallback():
    c = S.compare_quartiles(100.0, 0.4, 40, 103.0, 0.4, 40, threshold=0.015)
    assert c.verdict == S.SLOWER and c.test == "quartiles" and c.lo > 1.0
    c = S.compare_quartiles(100.0, 10.0, 10, 103.0, 10.0, 10, threshold=0.015)
    assert c.verdict == S.AMBIGUOUS


def test_parse_samples():
    assert S.parse_samples("[1.0, 2.5]") == [1.0, 2.5]
    assert S.parse_samples([3, 4]) == [3.0, 4.0]
    assert S.parse_samples(None) is None and S.parse_samples(float("nan")) is None and S.parse_samples("") is None


def test_clock_state_and_flag():
    assert S.clock_state(True, "sw_power_cap") == "capped"
    assert S.clock_state(False, "hw_thermal") == "throttled"
    assert S.clock_state(False, "") == "" and S.clock_state(None, None) == ""
    assert S.clock_flag("", "capped") == "capped: new"
    assert S.clock_flag("capped", "capped") == "capped: both"
    assert S.clock_flag("", "") == ""


def test_check_table():
    cfg = S.parse_check_table({"threshold": 0.02, "alpha": 0.05, "strict": True,
                               "cases": {"*/b1/*": 0.04, "m/eager/*/b1/*": 0.1}})
    assert cfg.threshold == 0.02 and cfg.alpha == 0.05 and cfg.strict is True
    assert cfg.threshold_for("m/eager/triton/b1/L0", 0.03) == 0.1            # the last match wins
    assert cfg.threshold_for("m/replay/triton/b1/L16", 0.03) == 0.04
    assert cfg.threshold_for("m/replay/triton/b8/L16", 0.03) == 0.03
    for bad, key in [({"threshold": 2}, "check.threshold"), ({"alpha": 0.7}, "check.alpha"),
                     ({"strict": "yes"}, "check.strict"), ({"nope": 1}, "check.nope"),
                     ({"cases": {"*": "x"}}, "check.cases")]:
        with pytest.raises(S.CheckTableError) as e:
            S.parse_check_table(bad)
        assert e.value.key.startswith(key)


def test_exact_small_samples_and_interval_inverts_the_test():
    rng = np.random.default_rng(6)
    scipy_stats = None
    try:
        import scipy.stats as scipy_stats
    except ImportError:
        pass
    for n, m in [(3, 3), (5, 7), (10, 10)]:
        x, y = rng.normal(0, 1, n), rng.normal(0.8, 1, m)
        u, p = S.mann_whitney(x, y)
        if scipy_stats is not None:
            assert p == pytest.approx(scipy_stats.mannwhitneyu(y, x, alternative="two-sided", method="exact").pvalue)
    assert S.mann_whitney([1, 2, 3], [4, 5, 6])[1] == pytest.approx(0.1)     # 2 / C(6, 3)
    for _ in range(300):           # the interval excludes no-shift exactly when the test rejects
        x, y = rng.normal(0, 1, 10), rng.normal(0.9, 1, 12)
        _, lo, hi = S.shift_interval(x, y, 0.05)
        assert (lo > 0 or hi < 0) == (S.mann_whitney(x, y)[1] < 0.05)
