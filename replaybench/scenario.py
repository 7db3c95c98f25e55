"""Scenario files (TOML) -> a validated list of :class:`Case`.

Format (see scenarios/smoke.toml)::

    [scenario]            name, description, runner
    [timing]              warmup, min_samples, max_samples, max_time_s, rel_iqr  (optional)
    [[sweep]]             cartesian blocks; their union, de-duplicated, is the case list
    [check]               threshold, alpha, strict, [check.cases] (optional: `replaybench check`)

Axes that do not apply to a method collapse instead of multiplying (see
replaybench.methods).  Every problem raises :class:`ScenarioError` naming the file,
the key and the allowed values.  This module imports neither torch nor triton.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .accept import ALLOWED as ACCEPT_ALLOWED, DEFAULT as ACCEPT_DEFAULT, parse_accept, resolve_accept
from .methods import METHODS, names
from .models import get_model, MODELS


REPO_ROOT = Path(__file__).resolve().parents[1]


def locate(path: str) -> Path:
    """A file path relative to CWD, falling back to the repository root; a bare
    name like 'smoke' also finds scenarios/smoke.toml."""
    cands = [Path(path)]
    if not Path(path).is_absolute():
        cands.append(REPO_ROOT / path)
        if not path.endswith(".toml") and "/" not in path:
            cands += [Path("scenarios") / f"{path}.toml", REPO_ROOT / "scenarios" / f"{path}.toml"]
    for c in cands:
        if c.is_file():
            return c
    return Path(path)


class ScenarioError(ValueError):
    """A scenario problem; ``str()`` is ``'<file>: <key>: <message>'``."""

    def __init__(self, file: str | Path, key: str, message: str):
        self.file = str(file)
        self.key = key
        self.message = message
        super().__init__(f"{self.file}: {key}: {message}" if key else f"{self.file}: {message}")


# ----------------------------------------------------------------------------- methods

# the methods and what each one is: replaybench.methods (METHODS re-exported from there)
#: methods whose rows are compared against eager in speedup figures
REPLAY_FAMILY = names(vs_eager=True)

BACKENDS = ("reference", "triton", "vllm")
STATE_DTYPES = ("float32", "bfloat16", "float16", "float64")   # float64: reference only
LO_DTYPES = ("bfloat16", "float16", "float8_e4m3")
RUNNERS = ("kernel", "layer", "e2e", "drift")
MAX_SPEC_WINDOW = 8

# sweep axes in case_id order, with their defaults when a [[sweep]] block omits them
AXES: dict[str, list[Any]] = {
    "model": None,              # required
    "method": None,             # required
    "backend": ["reference"],
    "batch": [1],
    "buffer_len": [16],
    "flush_period": ["buffer_len"],
    "state_dtype": ["float32"],
    "lo_dtype": ["bfloat16"],
    "spec_window": [4],
    "accept": [ACCEPT_DEFAULT],  # acceptance model of speculative methods (replaybench.accept)
    "steps": [0],               # decode steps of a drift case (0: the runner's default)
}
SWEEP_KEYS = tuple(AXES) + ("seed", "invalid")
TOP_KEYS = ("scenario", "timing", "sweep", "check")
SCENARIO_KEYS = ("name", "description", "runner", "device")
# what device a scenario is for: "gpu" is refused on a machine without one unless --device cpu
# is given explicitly; "cpu" / "any" run anywhere
SCENARIO_DEVICES = ("any", "cpu", "gpu")


# ----------------------------------------------------------------------------- timing

@dataclass(frozen=True)
class TimingConfig:
    """Stopping rule for one measurement (consumed by replaybench.timing)."""
    warmup: int = 3             # untimed iterations first
    min_samples: int = 10       # at least this many samples ...
    max_samples: int = 200      # ... at most this many
    max_time_s: float = 1.0     # stop after this much measuring time (once min_samples reached)
    rel_iqr: float = 0.005      # stop once IQR / median <= rel_iqr (after min_samples)

    def to_dict(self) -> dict:
        return asdict(self)


TIMING_KEYS = tuple(f.name for f in fields(TimingConfig))


# ----------------------------------------------------------------------------- cases

@dataclass(frozen=True)
class Case:
    case_id: str
    runner: str
    model: str                  # canonical model name (see replaybench.models.get_model)
    op: str                     # 'mamba2' | 'gdn' (derived from the model)
    method: str
    backend: str                # 'reference' | 'triton' | 'vllm'
    batch: int
    buffer_len: int             # 0 for methods without a buffer
    flush_period: int           # 0 for methods without a buffer
    spec_window: int            # 0 unless a speculative method
    state_dtype: str            # dtype of the (high) checkpoint / recurrent state
    lo_dtype: str               # low-precision copy dtype, or 'none'
    device: str = ""            # torch device ('cpu', 'cuda', 'cuda:1'); filled by the sweep
    seed: int = 0
    accept: str = "none"        # speculative methods: acceptance model ("fixed:2", "uniform", "geom:0.7")
    steps: int = 0              # drift runner: decode steps (0: the runner's default)

    def params(self) -> dict:
        """All fields as a plain dict."""
        return asdict(self)


def make_case_id(model: str, method: str, backend: str, batch: int, buffer_len: int,
                 flush_period: int, spec_window: int, state_dtype: str, lo_dtype: str,
                 seed: int = 0, accept: str = "none", steps: int = 0) -> str:
    """Readable, stable id from every case parameter (device and runner excluded,
    so that runs on different devices can be matched by ``replaybench check``).
    Speculative cases append their acceptance model ("/acc=fixed:2"), drift cases with a
    step count their steps ("/N8192")."""
    cid = (f"{model}/{method}/{backend}/b{batch}/L{buffer_len}/K{flush_period}/"
           f"T{spec_window}/{state_dtype}/{lo_dtype}")
    if accept != "none":
        cid += f"/acc={accept}"
    if steps:
        cid += f"/N{steps}"
    if seed:
        cid += f"/s{seed}"
    return cid


@dataclass(frozen=True)
class SkippedCombo:
    sweep_index: int
    key: str                    # e.g. 'sweep[0].flush_period'
    combo: str                  # the collapsed combination, case_id-like
    reason: str


@dataclass
class Scenario:
    name: str
    description: str
    runner: str
    path: str
    text: str
    sha256: str
    timing: TimingConfig
    cases: list[Case]
    skipped: list[SkippedCombo] = field(default_factory=list)
    device: str = "any"         # what the scenario is for: any | cpu | gpu

    def plan_text(self) -> str:
        """Human-readable plan (``replaybench sweep --dry-run``)."""
        out = [f"scenario {self.name!r} ({self.path}), runner {self.runner!r}"
               + (f", for {self.device.upper()}" if self.device != "any" else ""),
               f"  {self.description}" if self.description else "",
               f"  timing: {self.timing}",
               f"  {len(self.cases)} case(s), {len(self.skipped)} skipped combination(s)"]
        out = [o for o in out if o]
        for c in self.cases:
            out.append(f"    {c.case_id}")
        if self.skipped:
            out.append("  skipped:")
            for s in self.skipped:
                out.append(f"    {s.combo}  [{s.key}] {s.reason}")
        return "\n".join(out)


# ----------------------------------------------------------------------------- loading

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_LINE_RE = re.compile(r"line (\d+)(?:, column (\d+))?")


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file.  Raises ScenarioError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(p, "", "scenario file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(p, "", f"cannot read scenario file: {e}") from None
    return parse_scenario(text, file=str(path))


def parse_scenario(text: str, file: str = "<string>") -> Scenario:
    """Validate scenario TOML text.  Raises ScenarioError."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _LINE_RE.search(msg)
        line = getattr(e, "lineno", None) or (int(m.group(1)) if m else None)
        raise ScenarioError(file, f"line {line}" if line else "toml",
                            f"malformed TOML: {msg}") from None
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()

    _check_keys(file, "", doc, TOP_KEYS)
    # [scenario]
    sc = doc.get("scenario")
    if not isinstance(sc, dict):
        raise ScenarioError(file, "scenario", "missing [scenario] table (with name, runner)")
    _check_keys(file, "scenario", sc, SCENARIO_KEYS)
    name = sc.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ScenarioError(file, "scenario.name",
                            f"invalid value {name!r}; allowed: a non-empty name of "
                            f"letters, digits, '_', '.', '-'")
    desc = sc.get("description", "")
    if not isinstance(desc, str):
        raise ScenarioError(file, "scenario.description", f"invalid value {desc!r}; allowed: a string")
    runner = sc.get("runner", "kernel")
    if not isinstance(runner, str) or not (runner in RUNNERS or _is_entry_point(runner)
                                           or _is_registered(runner)):
        raise ScenarioError(file, "scenario.runner",
                            f"unknown value {runner!r}; allowed: {', '.join(RUNNERS)}, "
                            f"or 'package.module:Attr'")
    device = sc.get("device", "any")
    if device not in SCENARIO_DEVICES:
        raise ScenarioError(file, "scenario.device", f"unknown value {device!r}; allowed: "
                            f"{', '.join(SCENARIO_DEVICES)}")
    timing = _parse_timing(file, doc.get("timing", {}))
    from .stats import CheckTableError, parse_check_table   # [check]: the regression gate's thresholds
    try:
        parse_check_table(doc.get("check"))
    except CheckTableError as e:
        raise ScenarioError(file, e.key, e.message) from None

    sweeps = doc.get("sweep")
    if not isinstance(sweeps, list) or not sweeps or not all(isinstance(b, dict) for b in sweeps):
        raise ScenarioError(file, "sweep", "need one or more [[sweep]] tables")
    cases: dict[str, Case] = {}
    skipped: dict[str, SkippedCombo] = {}
    for i, block in enumerate(sweeps):
        _expand_block(file, i, block, runner, cases, skipped)
    if not cases:
        raise ScenarioError(file, "sweep", "no valid case left after removing invalid "
                            f"combinations ({len(skipped)} skipped)")
    return Scenario(name=name, description=desc, runner=runner, path=file, text=text,
                    sha256=sha, timing=timing, cases=list(cases.values()), device=device,
                    skipped=[s for s in skipped.values() if s.combo not in cases])


def _is_registered(name: str) -> bool:
    """A runner registered at run time (replaybench.runners.register), e.g. by tests."""
    from . import runners
    return name in runners.available()


def _is_entry_point(s: str) -> bool:
    return bool(re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", s))


def _check_keys(file: str, where: str, table: dict, allowed: tuple[str, ...]) -> None:
    for k in table:
        if k not in allowed:
            key = f"{where}.{k}" if where else k
            raise ScenarioError(file, key, f"unknown key; allowed: {', '.join(allowed)}")


def _parse_timing(file: str, t: Any) -> TimingConfig:
    if not isinstance(t, dict):
        raise ScenarioError(file, "timing", "must be a table")
    _check_keys(file, "timing", t, TIMING_KEYS)
    vals = {}
    for k, v in t.items():
        default = getattr(TimingConfig, k)
        if isinstance(default, int):
            ok = isinstance(v, int) and not isinstance(v, bool) and v >= (0 if k == "warmup" else 1)
            allowed = "an integer >= 0" if k == "warmup" else "an integer >= 1"
        else:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (
                v > 0 if k == "max_time_s" else v >= 0)
            allowed = "a number > 0" if k == "max_time_s" else "a number >= 0"
        if not ok:
            raise ScenarioError(file, f"timing.{k}", f"invalid value {v!r}; allowed: {allowed}")
        vals[k] = float(v) if isinstance(default, float) else v
    cfg = TimingConfig(**vals)
    if cfg.max_samples < cfg.min_samples:
        raise ScenarioError(file, "timing.max_samples",
                            f"invalid value {cfg.max_samples}; allowed: an integer >= "
                            f"min_samples ({cfg.min_samples})")
    return cfg


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _axis_values(file: str, key: str, raw: Any) -> list:
    vals = raw if isinstance(raw, list) else [raw]
    if not vals:
        raise ScenarioError(file, key, "empty list; give at least one value")
    return vals


def _validate_axis(file: str, i: int, axis: str, raw: Any) -> list:
    key = f"sweep[{i}].{axis}"
    vals = _axis_values(file, key, raw)
    out = []
    for v in vals:
        if axis == "model":
            try:
                out.append(get_model(v).name)
            except ValueError:
                raise ScenarioError(file, key, f"unknown value {v!r}; allowed: "
                                    f"{', '.join(MODELS)}, or '<model>@d<depth>w<width>'") from None
        elif axis in ("method", "backend", "state_dtype", "lo_dtype"):
            allowed = {"method": tuple(METHODS), "backend": BACKENDS,
                       "state_dtype": STATE_DTYPES, "lo_dtype": ("none",) + LO_DTYPES}[axis]
            if v not in allowed:
                raise ScenarioError(file, key, f"unknown value {v!r}; allowed: {', '.join(allowed)}")
            out.append(v)
        elif axis in ("batch", "buffer_len"):
            if not _is_int(v) or v < 1:
                raise ScenarioError(file, key, f"invalid value {v!r}; allowed: integers >= 1")
            out.append(v)
        elif axis == "flush_period":
            if not (v == "buffer_len" or (_is_int(v) and v >= 1)):
                raise ScenarioError(file, key, f"invalid value {v!r}; allowed: integers >= 1, "
                                    f"or \"buffer_len\" (K = L)")
            out.append(v)
        elif axis == "spec_window":
            if not _is_int(v) or not 0 <= v <= MAX_SPEC_WINDOW:
                raise ScenarioError(file, key, f"invalid value {v!r}; allowed: integers "
                                    f"0..{MAX_SPEC_WINDOW} (1..{MAX_SPEC_WINDOW} for spec methods)")
            out.append(v)
        elif axis == "steps":
            if not _is_int(v) or v < 0:
                raise ScenarioError(file, key, f"invalid value {v!r}; allowed: integers >= 0")
            out.append(v)
        elif axis == "accept":
            try:
                out.append(parse_accept(v))
            except ValueError:
                raise ScenarioError(file, key, f"invalid value {v!r}; allowed: {ACCEPT_ALLOWED}") from None
    # de-duplicate, keep order
    return list(dict.fromkeys(out))


class _Invalid(Exception):
    def __init__(self, axis: str, reason: str):
        self.axis, self.reason = axis, reason


def _resolve(combo: dict) -> dict:
    """Apply the collapse rules to one raw combination; raise _Invalid."""
    spec = METHODS[combo["method"]]
    c = dict(combo)
    # backend
    if spec.vllm:
        c["backend"] = "vllm"
    elif c["backend"] == "vllm":
        raise _Invalid("backend", f"backend 'vllm' is only for vllm-* methods, not {c['method']!r}; "
                       f"allowed: reference, triton")
    # buffer
    if spec.buffer:
        L = c["buffer_len"]
        K = L if c["flush_period"] == "buffer_len" else c["flush_period"]
        c["flush_period"] = K
    else:
        c["buffer_len"] = c["flush_period"] = 0
    # speculative window
    if spec.spec:
        if c["spec_window"] < 1:
            raise _Invalid("spec_window", f"{c['method']} needs spec_window in 1..{MAX_SPEC_WINDOW}, got 0")
        try:
            c["accept"] = resolve_accept(c["accept"], c["spec_window"])
        except ValueError as e:
            raise _Invalid("accept", str(e)) from None
    else:
        c["spec_window"] = 0
        c["accept"] = "none"
    # precisions
    if spec.lo:
        if c["lo_dtype"] == "none":
            raise _Invalid("lo_dtype", f"{c['method']} needs lo_dtype; allowed: {', '.join(LO_DTYPES)}")
        if spec.shared_low:
            c["state_dtype"] = c["lo_dtype"]
        if spec.needs_fp32_state and c["state_dtype"] != "float32":
            raise _Invalid("state_dtype", f"{c['method']} keeps its high checkpoint in float32; "
                           f"got state_dtype {c['state_dtype']!r}; allowed: float32")
    else:
        c["lo_dtype"] = "none"
    if c["state_dtype"] == "float64" and c["backend"] != "reference":
        raise _Invalid("state_dtype", f"float64 state only with backend 'reference', "
                       f"not {c['backend']!r}; allowed: float32, bfloat16, float16")
    if spec.buffer:
        if c["flush_period"] > c["buffer_len"]:
            raise _Invalid("flush_period", f"flush_period {c['flush_period']} > buffer_len "
                           f"{c['buffer_len']}; allowed: flush_period <= buffer_len")
        if spec.spec and c["buffer_len"] < c["flush_period"] + c["spec_window"]:
            raise _Invalid("buffer_len", f"buffer_len {c['buffer_len']} < flush_period "
                           f"{c['flush_period']} + spec_window {c['spec_window']}; a full draft "
                           f"window must fit")
    return c


def _combo_id(c: dict, seed: int) -> str:
    K = c["flush_period"]
    return make_case_id(c["model"], c["method"], c["backend"], c["batch"], c["buffer_len"],
                        K, c["spec_window"], c["state_dtype"], c["lo_dtype"], seed, c["accept"], c["steps"])


def _expand_block(file: str, i: int, block: dict, runner: str,
                  cases: dict[str, Case], skipped: dict[str, SkippedCombo]) -> None:
    _check_keys(file, f"sweep[{i}]", block, SWEEP_KEYS)
    axes: dict[str, list] = {}
    for axis, default in AXES.items():
        if axis not in block:
            if default is None:
                raise ScenarioError(file, f"sweep[{i}].{axis}", "required key is missing")
            axes[axis] = list(default)
        else:
            axes[axis] = _validate_axis(file, i, axis, block[axis])
    seed = block.get("seed", 0)
    if not _is_int(seed) or seed < 0:
        raise ScenarioError(file, f"sweep[{i}].seed", f"invalid value {seed!r}; allowed: an integer >= 0")
    invalid = block.get("invalid", "error")
    if invalid not in ("error", "skip"):
        raise ScenarioError(file, f"sweep[{i}].invalid", f"unknown value {invalid!r}; allowed: error, skip")

    keys = list(axes)
    for values in itertools.product(*(axes[n] for n in keys)):
        raw = dict(zip(keys, values))
        try:
            c = _resolve(raw)
        except _Invalid as e:
            key = f"sweep[{i}].{e.axis}"
            desc = _raw_desc(raw, seed)
            if invalid == "error":
                raise ScenarioError(file, key, f"invalid combination {desc}: {e.reason} "
                                    f"(set invalid = \"skip\" in sweep[{i}] to drop such "
                                    f"combinations)") from None
            skipped.setdefault(desc, SkippedCombo(i, key, desc, e.reason))
            continue
        cid = _combo_id(c, seed)
        if cid in cases:
            continue
        cases[cid] = Case(case_id=cid, runner=runner, model=c["model"],
                          op=get_model(c["model"]).op, method=c["method"],
                          backend=c["backend"], batch=c["batch"], buffer_len=c["buffer_len"],
                          flush_period=c["flush_period"], spec_window=c["spec_window"],
                          state_dtype=c["state_dtype"], lo_dtype=c["lo_dtype"], seed=seed,
                          accept=c["accept"], steps=c["steps"])


def _raw_desc(raw: dict, seed: int) -> str:
    """Describe a raw (pre-collapse-failure) combination, case_id style."""
    spec = METHODS[raw["method"]]
    backend = "vllm" if spec.vllm else raw["backend"]
    if spec.buffer:
        L = raw["buffer_len"]
        K = L if raw["flush_period"] == "buffer_len" else raw["flush_period"]
    else:
        L = K = 0
    T = raw["spec_window"] if spec.spec else 0
    lo = raw["lo_dtype"] if spec.lo else "none"
    state = lo if spec.shared_low and lo != "none" else raw["state_dtype"]
    acc = raw["accept"] if spec.spec else "none"
    return make_case_id(raw["model"], raw["method"], backend, raw["batch"], L, K, T, state, lo, seed, acc,
                        raw["steps"])
