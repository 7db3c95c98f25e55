"""Per-case statistics of the regression gate: FASTER / SLOWER / SAME / AMBIGUOUS.

Inputs are the timing samples of one case on each side (BASE, NEW), in microseconds.

* ``ratio`` is median(NEW) / median(BASE), the number every report shows.
* Its uncertainty is a distribution-free confidence interval ``[lo, hi]`` of the NEW/BASE
  time ratio: the Hodges-Lehmann interval of the shift of log-times, which is the inversion of
  the Mann-Whitney U test (the interval excludes 1 exactly when the two-sided test rejects "no
  shift" at level ``alpha``); ``p`` is that test's two-sided p-value (exact for small samples
  without ties, else the normal approximation with the tie correction). Rows stored without per-sample times (runs older than the
  ``samples_us`` column) fall back to a normal approximation from each side's median, IQR and
  sample count (standard error of a median 1.2533 sigma / sqrt(n), sigma = IQR / 1.349); the
  ``test`` column says which was used.
* With the relative threshold ``t`` (band ``B = [1 - t, 1 + t]``):

  - AMBIGUOUS: the interval holds 1 (no significant change) and also reaches outside ``B``:
    the samples cannot tell "no change" from "a change larger than the threshold";
  - else SLOWER if ratio > 1 + t, FASTER if ratio < 1 - t (the interval then excludes 1);
  - else SAME (any change is within the threshold, significant or not).

Only SLOWER fails the gate, and only when neither side's clocks were pulled down (see
:func:`clock_flag`; ``strict`` makes those fail too). Samples are treated as independent: the
A/B command interleaves the two sides in alternating rounds so that slow drifts of the GPU hit
both alike; for two runs made at different times the threshold, not the test, carries the
run-to-run drift (0.1 % median per case on the H200 between runs a day apart).
"""
from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist
from typing import Any, Sequence

import numpy as np

FASTER, SLOWER, SAME, AMBIGUOUS = "FASTER", "SLOWER", "SAME", "AMBIGUOUS"
VERDICTS = (SLOWER, AMBIGUOUS, SAME, FASTER)

DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01
CHECK_KEYS = ("threshold", "alpha", "strict", "cases")

_SD_PER_IQR = 1.0 / 1.349          # normal sigma from an IQR
_MEDIAN_SE = 1.2533                # SE of a median = 1.2533 sigma / sqrt(n) (normal samples)
_MAX_PAIRS = 4_000_000             # pairwise differences held at once (n * m)


@dataclass(frozen=True)
class Comparison:
    ratio: float                    # median(NEW) / median(BASE)
    lo: float                       # confidence interval of the ratio (level 1 - alpha)
    hi: float
    p: float                        # two-sided p-value of "no shift"
    verdict: str
    threshold: float
    alpha: float
    test: str                       # 'mann-whitney' | 'quartiles'
    n_base: int = 0
    n_new: int = 0


def _z(alpha: float) -> float:
    return NormalDist().inv_cdf(1.0 - alpha / 2.0)


def verdict_of(ratio: float, lo: float, hi: float, threshold: float) -> str:
    """The verdict rule of the module doc, from a ratio, its interval and the threshold."""
    if not (math.isfinite(ratio) and ratio > 0):
        return AMBIGUOUS
    holds_one = lo <= 1.0 <= hi
    inside = (1.0 - threshold) <= lo and hi <= (1.0 + threshold)
    if holds_one and not inside:
        return AMBIGUOUS
    if ratio > 1.0 + threshold:
        return SLOWER
    if ratio < 1.0 - threshold:
        return FASTER
    return SAME


_EXACT_MAX_PAIRS = 2500            # n * m up to which U's null distribution is computed exactly


@lru_cache(maxsize=64)
def _u_cdf(n: int, m: int) -> tuple[float, ...]:
    """P(U <= u), u = 0..n*m, under no shift and no ties: the coefficients of the Gaussian
    binomial [n + m choose n]_q over C(n + m, n), in exact integers."""
    poly = [1]
    for i in range(1, n + 1):       # multiply by (1 - q^(m+i)), divide by (1 - q^i)
        j = m + i
        poly = poly + [0] * j
        for k in range(len(poly) - 1, j - 1, -1):
            poly[k] -= poly[k - j]
        for k in range(i, len(poly)):
            poly[k] += poly[k - i]
        while len(poly) > 1 and poly[-1] == 0:
            poly.pop()
    total = math.comb(n + m, n)
    out, acc = [], 0
    for c in poly:
        acc += c
        out.append(acc / total)
    return tuple(out)


def _exact(n: int, m: int) -> bool:
    return 0 < n * m <= _EXACT_MAX_PAIRS


def mann_whitney(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(U of y over x, two-sided p) of the Mann-Whitney U test: exact for small samples
    without ties (n * m <= 2500), else the normal approximation with the tie correction (and a
    0.5 continuity correction). U counts pairs with y > x (ties 1/2)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        return float("nan"), float("nan")
    allv = np.concatenate([x, y])
    order = allv.argsort(kind="mergesort")
    ranks = np.empty(n + m, float)
    sv = allv[order]
    # average ranks over ties
    i = 0
    tie_term = 0.0
    while i < n + m:
        j = i
        while j + 1 < n + m and sv[j + 1] == sv[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        t = j - i + 1
        tie_term += t ** 3 - t
        i = j + 1
    u = float(ranks[n:].sum() - m * (m + 1) / 2.0)
    mu = n * m / 2.0
    if tie_term == 0 and _exact(n, m):
        cdf = _u_cdf(n, m)
        lo = min(u, n * m - u)          # the null distribution is symmetric
        return u, min(1.0, 2.0 * cdf[int(round(lo))])
    N = n + m
    var = n * m / 12.0 * ((N + 1) - tie_term / (N * (N - 1))) if N > 1 else 0.0
    if var <= 0:
        return u, 1.0 if u == mu else 0.0
    z = (abs(u - mu) - 0.5) / math.sqrt(var)
    p = 2.0 * (1.0 - NormalDist().cdf(max(z, 0.0)))
    return u, min(1.0, p)


def shift_interval(x: Sequence[float], y: Sequence[float], alpha: float) -> tuple[float, float, float]:
    """(estimate, lo, hi) of the shift y - x: the Hodges-Lehmann estimate (median of all
    pairwise differences) and its distribution-free interval at level 1 - alpha, the order
    statistics k+1 and nm-k of the differences with k from U's normal approximation. Too few
    samples for the level give the whole range of differences."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n, m = len(x), len(y)
    if n * m > _MAX_PAIRS:          # evenly spaced quantiles of each side keep the spread
        side = int(math.sqrt(_MAX_PAIRS))
        x, y = np.quantile(x, np.linspace(0, 1, min(n, side))), np.quantile(y, np.linspace(0, 1, min(m, side)))
        n, m = len(x), len(y)
    d = np.sort((y[None, :] - x[:, None]).ravel())
    nm = n * m
    if _exact(n, m):                # k = the largest c with P(U <= c) <= alpha / 2
        cdf = _u_cdf(n, m)
        k = sum(1 for c in cdf if c <= alpha / 2.0) - 1
    else:
        k = int(math.floor(nm / 2.0 - _z(alpha) * math.sqrt(nm * (n + m + 1) / 12.0)))
    k = max(k, 0)
    if k >= nm - k:
        k = max(0, (nm - 1) // 2)
    return float(np.median(d)), float(d[k]), float(d[nm - 1 - k])


def compare_samples(base: Sequence[float], new: Sequence[float], threshold: float = DEFAULT_THRESHOLD,
                    alpha: float = DEFAULT_ALPHA) -> Comparison:
    """Verdict of NEW against BASE from their per-sample times (module doc)."""
    b = np.asarray([v for v in base if v is not None and math.isfinite(v) and v > 0], float)
    n = np.asarray([v for v in new if v is not None and math.isfinite(v) and v > 0], float)
    if len(b) == 0 or len(n) == 0:
        raise ValueError(f"need positive samples on both sides (base {len(b)}, new {len(n)})")
    ratio = float(np.median(n) / np.median(b))
    lb, ln = np.log(b), np.log(n)
    _, lo, hi = shift_interval(lb, ln, alpha)
    _, p = mann_whitney(lb, ln)
    lo, hi = math.exp(lo), math.exp(hi)
    return Comparison(ratio, lo, hi, p, verdict_of(ratio, lo, hi, threshold), threshold, alpha,
                      "mann-whitney", len(b), len(n))


def compare_quartiles(base_median: float, base_iqr: float, base_n: int, new_median: float,
                      new_iqr: float, new_n: int, threshold: float = DEFAULT_THRESHOLD,
                      alpha: float = DEFAULT_ALPHA) -> Comparison:
    """Verdict from summary statistics only (rows without per-sample times): a normal
    approximation of log(ratio) with each median's standard error from its IQR and count."""
    ratio = new_median / base_median

    def se(med, iqr, cnt):
        cnt = max(int(cnt or 1), 1)
        iqr = 0.0 if iqr is None or not math.isfinite(iqr) else max(iqr, 0.0)
        return _MEDIAN_SE * iqr * _SD_PER_IQR / med / math.sqrt(cnt)

    s = math.hypot(se(base_median, base_iqr, base_n), se(new_median, new_iqr, new_n))
    lr = math.log(ratio)
    if s > 0:
        w = _z(alpha) * s
        lo, hi = math.exp(lr - w), math.exp(lr + w)
        p = 2.0 * (1.0 - NormalDist().cdf(abs(lr) / s))
    else:
        lo = hi = ratio
        p = 1.0 if ratio == 1.0 else 0.0
    return Comparison(ratio, lo, hi, p, verdict_of(ratio, lo, hi, threshold), threshold, alpha,
                      "quartiles", int(base_n or 0), int(new_n or 0))


def parse_samples(v: Any) -> list[float] | None:
    """A row's ``samples_us`` value (a list, or the JSON text the store keeps) as floats;
    None when the row has none."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, str):
        if not v.strip():
            return None
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            return None
    try:
        out = [float(x) for x in v]
    except (TypeError, ValueError):
        return None
    return out or None


# ----------------------------------------------------------------------------- clocks

def clock_state(power_capped: Any, throttle: Any) -> str:
    """'capped' (every sample ran at the board's power cap), 'throttled' (batches were
    discarded for a throttle reason), or '' (clean clocks)."""
    if power_capped is True or (isinstance(power_capped, (int, np.bool_)) and bool(power_capped)) \
            or str(power_capped).lower() == "true":
        return "capped"
    if isinstance(throttle, str) and throttle.strip():
        return "throttled"
    return ""


def clock_flag(base_state: str, new_state: str) -> str:
    """'capped: base' / 'throttled: new' / 'capped: both' ...; '' when both ran clean."""
    if not base_state and not new_state:
        return ""
    if base_state == new_state:
        return f"{base_state}: both"
    parts = [f"{s}: {side}" for s, side in ((base_state, "base"), (new_state, "new")) if s]
    return ", ".join(parts)


# ----------------------------------------------------------------------------- [check] table

@dataclass(frozen=True)
class CheckConfig:
    """Gate settings of a scenario's ``[check]`` table. ``cases`` maps case_id glob
    patterns (fnmatch) to thresholds; the last matching pattern wins."""
    threshold: float | None = None
    alpha: float | None = None
    strict: bool | None = None
    cases: tuple[tuple[str, float], ...] = field(default_factory=tuple)

    def threshold_for(self, case_id: str, default: float) -> float:
        t = default
        for pat, thr in self.cases:
            if fnmatch.fnmatchcase(case_id, pat):
                t = thr
        return t

    def to_dict(self) -> dict:
        d: dict[str, Any] = {k: getattr(self, k) for k in ("threshold", "alpha", "strict")
                             if getattr(self, k) is not None}
        if self.cases:
            d["cases"] = dict(self.cases)
        return d


class CheckTableError(ValueError):
    def __init__(self, key: str, message: str):
        self.key, self.message = key, message
        super().__init__(f"{key}: {message}")


def _threshold_value(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
        raise CheckTableError(key, f"invalid value {v!r}; allowed: a relative threshold in [0, 1) "
                              f"(0.02 = 2 %)")
    return float(v)


def parse_check_table(t: Any) -> CheckConfig:
    """Validate a scenario's ``[check]`` table. Raises CheckTableError naming the key."""
    if t is None:
        return CheckConfig()
    if not isinstance(t, dict):
        raise CheckTableError("check", "must be a table")
    for k in t:
        if k not in CHECK_KEYS:
            raise CheckTableError(f"check.{k}", f"unknown key; allowed: {', '.join(CHECK_KEYS)}")
    thr = _threshold_value("check.threshold", t["threshold"]) if "threshold" in t else None
    alpha = t.get("alpha")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))
                              or not 0 < alpha < 0.5):
        raise CheckTableError("check.alpha", f"invalid value {alpha!r}; allowed: a number in (0, 0.5)")
    strict = t.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise CheckTableError("check.strict", f"invalid value {strict!r}; allowed: true, false")
    cases = t.get("cases", {})
    if not isinstance(cases, dict):
        raise CheckTableError("check.cases", "must be a table of \"case_id glob\" = threshold")
    pats = tuple((str(p), _threshold_value(f"check.cases.{p!r}", v)) for p, v in cases.items())
    return CheckConfig(thr, None if alpha is None else float(alpha), strict, pats)


def check_config_from_text(text: str | None) -> CheckConfig:
    """The [check] table of a scenario's TOML text (a run manifest keeps it); empty when the
    text is missing or has none."""
    if not text:
        return CheckConfig()
    import tomllib
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return CheckConfig()
    return parse_check_table(doc.get("check"))


__all__ = ["AMBIGUOUS", "FASTER", "SAME", "SLOWER", "VERDICTS", "CheckConfig", "CheckTableError",
           "Comparison", "check_config_from_text", "clock_flag", "clock_state", "compare_quartiles",
           "compare_samples", "mann_whitney", "parse_check_table", "parse_samples", "shift_interval",
           "verdict_of"]
