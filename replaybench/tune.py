"""`replaybench tune SCENARIO`: time the launch-table variants a tuning scenario lists, against
what ships, with the suite's own check, timing and store.

A tuning scenario is an ordinary scenario (its [[sweep]] tables give the cases) plus
[[variant]] tables. A variant names a family and sets that family's options: fields of its
options object (`replayssm.mamba2.options.Mamba2Options`, `replayssm.gdn.options.GDNOptions`)
under `options`, and params that replace the picked launch-table row's for an op under
`override.<op>` (the names each op accepts are the options class's TUNABLE; a misspelt one is
an error naming the allowed ones). The variant "default" (no settings) is always timed first.

    [[variant]]
    name = "r32w4"
    family = "mamba2"
    options = { small_batch_route = false }
    override.replay = { block_p = 32, warps = 4 }

Per case, every variant of the case's family is first checked against the reference (the
kernel runner's check: outputs over enough steps to cross a flush; a variant that fails is
an error row and is not timed), then the variants are timed in interleaved rounds (all
variants once, `--rounds` times), so a drift of the GPU's clocks hits them alike. Speculative cases (spec-replay methods) time
verify + commit rounds, where `override.verify` / `override.commit` apply. A row per
(case, variant) goes to results/<run-id>/ as the sweep's rows do (case_id + '/variant=NAME',
a `variant` column, `vs_default` = default's median / this one's); a rerun resumes.
"""
from __future__ import annotations

import dataclasses
import re
import statistics
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .methods import METHODS
from .scenario import Scenario, ScenarioError, parse_scenario

DEFAULT = "default"
_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\-\"]+)")


@dataclass(frozen=True)
class Variant:
    name: str
    family: str = ""                              # "" (default: every family) | mamba2 | gdn
    options: dict = field(default_factory=dict)   # fields of the family's options object
    override: dict = field(default_factory=dict)  # {op: {param: value}} over the table's row

    def build(self, family: str):
        """The family's options object for this variant (None for the default)."""
        if self.name == DEFAULT:
            return None
        cls = options_class(family)
        opts = cls(**self.options)
        for op, params in self.override.items():
            opts = opts.override(op, **params)
        return opts


def options_class(family: str):
    if family == "mamba2":
        from replayssm.mamba2.options import Mamba2Options
        return Mamba2Options
    from replayssm.gdn.options import GDNOptions
    return GDNOptions


def _split(text: str) -> str:
    """The scenario's text without its [[variant]] tables (blank lines in their place, so the
    scenario parser's line numbers stay those of the file)."""
    out, in_variant = [], False
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            in_variant = m.group(1).split(".")[0].strip('"') == "variant"
        out.append("" if in_variant else line)
    return "\n".join(out) + "\n"


def parse_variants(doc: dict, file: str) -> list[Variant]:
    """The [[variant]] tables, validated (each error names the file, the key and what is allowed)."""
    raw = doc.get("variant", [])
    if not isinstance(raw, list) or not all(isinstance(v, dict) for v in raw):
        raise ScenarioError(file, "variant", "must be [[variant]] tables")
    out = [Variant(DEFAULT)]
    for i, v in enumerate(raw):
        where = f"variant[{i}]"
        bad = set(v) - {"name", "family", "options", "override"}
        if bad:
            raise ScenarioError(file, where, f"unknown keys {sorted(bad)}; allowed: name, family, options, override")
        name = v.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", name):
            raise ScenarioError(file, f"{where}.name", f"invalid value {name!r}; allowed: letters, digits, '_.+-'")
        if any(o.name == name for o in out):
            raise ScenarioError(file, f"{where}.name", f"duplicate variant {name!r}")
        fam = v.get("family", "")
        if fam not in ("", "mamba2", "gdn"):
            raise ScenarioError(file, f"{where}.family", f"unknown value {fam!r}; allowed: mamba2, gdn")
        if not fam and (v.get("options") or v.get("override")):
            raise ScenarioError(file, f"{where}.family", "a variant that sets options or overrides names its "
                                "family (mamba2 or gdn)")
        var = Variant(name, fam, dict(v.get("options", {})), {k: dict(p) for k, p in v.get("override", {}).items()})
        try:
            var.build(fam)
        except (TypeError, ValueError) as e:
            raise ScenarioError(file, where, str(e)) from None
        out.append(var)
    return out


def load_tune(path: str | Path) -> tuple[Scenario, list[Variant]]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(p, "", f"cannot read scenario file: {e}") from None
    scenario = parse_scenario(_split(text), file=str(path))   # malformed TOML is reported here first
    return scenario, parse_variants(tomllib.loads(text), str(path))


def _tunable(case) -> bool:
    """Our replay-state kernels on the triton backend: decode steps (kernel runner) and
    speculative rounds of the replay state (spec runner; verify + commit)."""
    m = METHODS[case.method]
    return m.ours and case.backend == "triton" and (m.runner == "kernel" or (m.runner == "spec" and bool(m.mode)))


def _check_and_workload(case, model, dev, opts):
    """(check error, (sample, units per sample)) of a case with the family's options."""
    from .runners import kernel, spec
    if METHODS[case.method].spec:
        from .accept import DEFAULT, resolve_accept
        err = spec.check_spec(case, model, dev, options=opts)
        accept = resolve_accept(case.accept if case.accept not in (None, "", "none") else DEFAULT, case.spec_window)
        sample, rounds, nl, _, _ = spec.workload(case, model, dev, accept, options=opts)
        return err, (sample, rounds * nl)
    err = kernel.check_against_reference(case, model, dev, options=opts)
    sample, steps, nl = kernel.workload(case, model, dev, options=opts)
    return err, (sample, steps * nl)


def run_tune(path, device: str = "auto", results_dir: str = "results", rounds: int = 3,
             run_id: str | None = None, log=print) -> int:
    """Check and time every (case, variant); print a table; exit code 0, or 1 if a variant
    failed its check or a case errored."""
    import torch

    from .models import get_model
    from .runners import RunContext
    from .store import RunStore
    from .sweep import build_manifest, choose_run_id, make_row, setup_device_env
    from .timing import measure
    from .hardware import device_info

    scenario, variants = load_tune(path)
    dev = setup_device_env(device)
    if scenario.device == "gpu" and dev == "cpu" and device != "cpu":
        raise RuntimeError(f"{path} is a GPU scenario and no GPU is visible (--device cpu runs it on the "
                           f"CPU under the Triton interpreter anyway)")
    info = device_info(dev)
    rid = choose_run_id(scenario, info, run_id, False)
    cases = [dataclasses.replace(c, device=dev) for c in scenario.cases if _tunable(c)]
    if not cases:
        raise ScenarioError(path, "sweep", "no case the tuner can time (our replay-state kernels on the triton "
                            "backend: decode steps or speculative rounds)")
    store = RunStore.create_or_resume(results_dir, rid, build_manifest(scenario, info, rid, ["replaybench", "tune"],
                                                                       {}, len(cases) * len(variants)))
    log(f"tune {scenario.name}: {len(cases)} case(s) x {len(variants)} variant(s), {rounds} interleaved round(s) "
        f"-> {store.run_dir}")
    done = store.done_case_ids()
    ctx = RunContext(device=dev, timing=scenario.timing, device_name=info.get("name", ""))
    failures = 0
    table = []
    try:
        for case in cases:
            model = get_model(case.model)
            mine = [v for v in variants if v.family in ("", model.op)]
            todo = [v for v in mine if f"{case.case_id}/variant={v.name}" not in done]
            if not todo:
                continue
            works, rows = {}, {}
            for v in todo:     # check first: a wrong variant is never timed
                vcase = dataclasses.replace(case, case_id=f"{case.case_id}/variant={v.name}")
                t0 = time.perf_counter()
                try:
                    err, work = _check_and_workload(case, model, dev, v.build(model.op))
                    works[v.name] = (work, err)
                except Exception as e:  # noqa: BLE001 - a failing variant is a row, the tune goes on
                    failures += 1
                    rows[v.name] = make_row(vcase, None, run_id=rid, device_label=info.get("label", dev), ceilings={},
                                            status="error", error=f"{type(e).__name__}: {e}"[:500],
                                            wall_s=time.perf_counter() - t0)
            medians: dict[str, list[float]] = {n: [] for n in works}
            last = {}
            for _ in range(rounds):
                for name, ((sample, units), _) in works.items():
                    t = measure(sample, dev, ctx.timing, per=units)
                    medians[name].append(t.median_us)
                    last[name] = t
            base = statistics.median(medians[DEFAULT]) if medians.get(DEFAULT) else None
            for name, (_, err) in works.items():
                med = statistics.median(medians[name])
                metrics = {**last[name].columns(), "median_us": med, "check_rel_err": err,
                           "round_medians_us": medians[name], "variant": name,
                           "vs_default": (base / med) if base else None}
                vcase = dataclasses.replace(case, case_id=f"{case.case_id}/variant={name}")
                rows[name] = make_row(vcase, metrics, run_id=rid, device_label=info.get("label", dev), ceilings={})
            for name, row in rows.items():
                row["variant"] = name
                store.append(row)
                table.append(row)
            del works
            if dev.startswith("cuda"):
                torch.cuda.empty_cache()
    finally:
        store.materialise()
        store.unlock()
    log(format_table(table))
    return 1 if failures else 0


def format_table(rows: list[dict]) -> str:
    """Per case, each variant's median and its speed relative to the default (> 1: faster)."""
    lines = [f"{'case':<72} {'variant':<20} {'us':>10} {'vs default':>10}  check"]
    for r in rows:
        base = r["case_id"].rsplit("/variant=", 1)[0]
        if r["status"] != "ok":
            lines.append(f"{base:<72} {r['variant']:<20} {'-':>10} {'-':>10}  {r['error']}")
            continue
        vs = r.get("vs_default")
        lines.append(f"{base:<72} {r['variant']:<20} {r['median_us']:>10.2f} "
                     f"{(f'{vs:.3f}' if vs else '-'):>10}  {r.get('check_rel_err', 0):.2g}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:   # `python -m replaybench.tune` (the CLI wires the same)
    import argparse
    ap = argparse.ArgumentParser(prog="replaybench tune", description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--results-dir", default="results")
    ap.add_argument("--run-id")
    a = ap.parse_args(argv)
    try:
        return run_tune(a.scenario, a.device, a.results_dir, a.rounds, a.run_id)
    except ScenarioError as e:
        print(str(e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
