"""The replaybench command line: sweep, report, check, explain, tune, models, memory, env (see DESCRIPTION)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .scenario import REPO_ROOT, locate  # noqa: F401  (locate: also the CLI's public helper)
DEFAULT_CPU_SCENARIO = "scenarios/smoke.toml"
DEFAULT_GPU_SCENARIO = "scenarios/h200-default.toml"

DESCRIPTION = """\
replaybench: a benchmark and roofline suite for ReplaySSM decode kernels (Mamba-2 and Gated
DeltaNet). A scenario file lists the cases; `sweep` runs them (checking every kernel against the
reference first), stores one row per case under results/<run-id>/ and writes a report under
reports/<run-id>/; `check` compares two runs as a regression gate."""

EPILOG = """\
examples:
  replaybench sweep                              # the CPU smoke scenario (h200-default on a GPU)
  replaybench sweep scenarios/h200-kernels-fp32.toml --dry-run   # the plan; writes nothing
  replaybench report h200-kernels-fp32-20261203-nvidia-h200      # regenerate a report from stored rows
  replaybench check BASE_RUN NEW_RUN --threshold 0.02             # regression gate
  replaybench explain scenarios/h200-kernels-fp32.toml --case CASE_ID   # the kernels a case launches
  replaybench tune scenarios/tune-mamba2.toml                     # time launch-table variants (GPU)
  replaybench models; replaybench memory; replaybench env --ceilings

exit codes:
  0    ok
  1    a regression (check), error rows in a sweep (unless --keep-going-ok), or a failed report
  2    bad input: scenario or argument errors, unknown run, unwritable directory, a GPU scenario
       without a GPU; nothing is written then
  130  interrupted (rerun the same command to resume)"""


def _err(msg: str) -> None:
    print(f"replaybench: {msg}", file=sys.stderr)


def default_scenario() -> Path:
    gpu = locate(DEFAULT_GPU_SCENARIO)
    if gpu.is_file():
        try:
            import torch
            if torch.cuda.is_available():
                return gpu
        except Exception:
            pass
    return locate(DEFAULT_CPU_SCENARIO)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="replaybench", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    dirs = dict(results=("--results-dir", "results", "where runs are stored (default: results)"),
                reports=("--reports-dir", "reports", "where reports are written (default: reports)"))

    def add_dir(parser, which):
        flag, default, text = dirs[which]
        parser.add_argument(flag, default=default, help=text)

    s = sub.add_parser("sweep", help="run (or resume) a scenario: check, time, store rows, write the report",
                       description="Run the cases of a scenario that have no row yet (rerunning the same "
                                   "command resumes), then write the report. Exits 1 if any row is an error "
                                   "(unless --keep-going-ok).")
    s.add_argument("scenario", nargs="?", help="scenario TOML, or a name under scenarios/ (default: "
                   "scenarios/smoke.toml without a GPU, scenarios/h200-default.toml with one)")
    s.add_argument("--dry-run", action="store_true", help="print the plan; write nothing")
    s.add_argument("--run-id", help="run id (default: derived from scenario + device; same "
                   "command resumes the same run)")
    s.add_argument("--new", action="store_true", help="start a fresh run (timestamped id)")
    add_dir(s, "results")
    add_dir(s, "reports")
    s.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where to run (default auto: the GPU if there is one); an explicit cpu also runs "
                        "a scenario made for a GPU")
    s.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    s.add_argument("--no-ceilings", action="store_true",
                   help="skip measuring copy/read/matmul ceilings (pct_copy_bw stays empty)")
    s.add_argument("--retry-errors", action="store_true", help="redo cases whose row is an error")
    s.add_argument("--ncu", action="store_true",
                   help="also measure DRAM bytes per step with Nsight Compute (GPU, kernel runner)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.add_argument("--keep-going-ok", action="store_true",
                   help="exit 0 even if some rows are errors (default: exit 1 and say how many)")
    s.add_argument("--fail-on-error", action="store_true", help=argparse.SUPPRESS)   # the default now

    r = sub.add_parser("report", help="regenerate reports/<run-id>/ from stored rows (runs no kernel)",
                       description="Regenerate a run's report (report.md, report.html, figures) from its "
                                   "stored rows.")
    r.add_argument("run", help="run id (under --results-dir) or run directory")
    r.add_argument("--compare", metavar="OTHER_RUN",
                   help="a repeat of RUN on the same device: add its run-to-run spread (per-case "
                        "|OTHER/RUN - 1| of the medians, matched as `check` matches) as spread.png/.svg/.csv "
                        "and a report section")
    add_dir(r, "results")
    add_dir(r, "reports")

    c = sub.add_parser("check", help="regression gate: compare NEW against BASE (two runs, or two "
                       "git revisions measured interleaved with --revs)")
    from .check import add_arguments as add_check_arguments
    add_check_arguments(c)

    m = sub.add_parser("models", help="print the model table (SSM dims, state bytes per layer and sequence)")
    m.add_argument("names", nargs="*", help="models to show (scaled names like "
                   "'nemotron-3-nano-4b@d0.5w2' allowed); default all")

    mm = sub.add_parser("memory", help="SSM-state bytes per request and max batch within a budget, per "
                        "model and method (eager, per-draft slots, ReplaySSM, dual)")
    mm.add_argument("names", nargs="*", help="models (default: the four study models)")
    mm.add_argument("--budget-gb", type=float, default=80.0, help="SSM-state budget in GB (1e9 bytes; default 80)")
    mm.add_argument("--spec-window", type=int, default=4, help="draft tokens per round T (default 4)")
    mm.add_argument("--buffer-len", type=int, default=20, help="ReplaySSM buffer capacity L >= K + T (default 20)")
    mm.add_argument("--flush-period", type=int, default=16, help="ReplaySSM flush period K (default 16)")

    x = sub.add_parser("explain", help="the kernels a scenario's case launches, their grids and the launch-table "
                       "row that chose each (no GPU needed)",
                       description="Plan each case (or the one --case names) on PyTorch's meta device and print "
                                   "its launches: kernel, grid, tile options, the table row and its reason.")
    x.add_argument("scenario", help="scenario TOML, or a name under scenarios/")
    x.add_argument("--case", metavar="ID", help="one case id (as `sweep --dry-run` lists them); default: every case")
    x.add_argument("--compile", action="store_true",
                   help="also compile each launch for sm_90 offline and print its registers and spills")

    t = sub.add_parser("tune", help="check and time the launch-table variants a tuning scenario lists, "
                       "interleaved, against what ships",
                       description="Time the [[variant]] tables of a tuning scenario (replaybench.tune) on every "
                                   "case of its sweeps, after checking each against the reference; rows go to "
                                   "results/<run-id>/ (a rerun resumes). Exits 1 if a variant failed its check.")
    t.add_argument("scenario", help="tuning scenario TOML (scenarios/tune-*.toml), or a name under scenarios/")
    t.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where to run (default auto: the GPU if there is one)")
    t.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per case (default 3)")
    t.add_argument("--run-id", help="run id (default: derived from scenario + device; same command resumes)")
    add_dir(t, "results")

    e = sub.add_parser("env", help="device info and versions (and the measured ceilings)")
    e.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="the device to describe (default auto: the GPU if there is one)")
    e.add_argument("--ceilings", action="store_true",
                   help="also measure the copy / read bandwidth and matmul ceilings (a few seconds)")
    e.add_argument("--json", action="store_true", help="print JSON instead of text")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    # CPU: the Triton interpreter must be on before any Triton kernel is imported
    if getattr(args, "device", None) == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        return {"sweep": cmd_sweep, "report": cmd_report, "check": cmd_check,
                "explain": cmd_explain, "tune": cmd_tune,
                "models": cmd_models, "memory": cmd_memory, "env": cmd_env}[args.cmd](args, argv)
    except KeyboardInterrupt:
        _err("interrupted; rerun the same command to resume")
        return 130
    except BrokenPipeError:     # output piped into `head` and the like: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def cmd_sweep(args, argv) -> int:
    from .scenario import ScenarioError, load_scenario
    path = locate(args.scenario) if args.scenario else default_scenario()
    try:
        scenario = load_scenario(path)
    except ScenarioError as e:
        print(str(e), file=sys.stderr)
        return 2
    from .runners import RunnerError
    from .store import StoreError
    from .sweep import choose_run_id, run_sweep, setup_device_env
    try:
        dev = setup_device_env(args.device)
    except RuntimeError as e:
        _err(str(e))
        return 2
    if scenario.device == "gpu" and dev == "cpu" and args.device != "cpu":
        _err(f"scenario {scenario.name!r} is for a GPU and none is visible here; --device cpu runs it on "
             f"the CPU anyway (slow: the Triton interpreter)")
        return 2
    if args.dry_run:
        from .hardware import device_info
        from .store import RunStore
        info = device_info(dev)
        try:
            rid = choose_run_id(scenario, info, args.run_id, args.new)
        except StoreError as e:
            _err(str(e))
            return 2
        store = RunStore(Path(args.results_dir) / rid)
        done = store.done_case_ids() if store.rows_path.exists() else set()
        print(scenario.plan_text())
        print(f"device: {dev} ({info.get('name')})")
        print(f"run id: {rid} -> {store.run_dir}"
              + (f" (exists: {len(done & {c.case_id for c in scenario.cases})} case(s) done)"
                 if store.manifest_path.exists() else " (new)"))
        return 0
    try:
        res = run_sweep(scenario, device=dev, results_dir=args.results_dir,
                        reports_dir=args.reports_dir, run_id=args.run_id, new=args.new,
                        argv=["replaybench"] + argv, report=not args.no_report,
                        progress=not args.no_progress, measure_ceilings=not args.no_ceilings,
                        retry_errors=args.retry_errors, ncu=args.ncu,
                        log=lambda line: print(f"replaybench: {line}", file=sys.stderr))
    except (RunnerError, StoreError) as e:
        _err(str(e))
        return 2
    c = res.counts
    print(f"run {res.run_id}: {c.get('ok', 0)} ok, {c.get('error', 0)} error, "
          f"{c.get('skipped', 0)} skipped ({res.ran} run now, {res.already_done} already done)"
          f" -> {res.run_dir}")
    if res.report_dir:
        print(f"report: {res.report_dir / 'report.md'} and report.html")
    if res.report_error:
        _err(f"report failed: {res.report_error} (rows are safe; see {res.run_dir / 'errors.log'})")
        return 1
    if c.get("error", 0) and not args.keep_going_ok:
        _err(f"{c['error']} case(s) ended in an error (first lines in the rows, tracebacks in "
             f"{res.run_dir / 'errors.log'}); exit 1 (--keep-going-ok: exit 0)")
        return 1
    return 0


def cmd_report(args, argv) -> int:
    from .report import write_report
    from .store import StoreError
    try:
        out = write_report(args.run, reports_dir=args.reports_dir, results_dir=args.results_dir,
                           compare=args.compare)
    except StoreError as e:
        _err(str(e))
        return 2
    print(f"report: {out / 'report.md'} and {out / 'report.html'}")
    return 0


def cmd_check(args, argv) -> int:
    """`replaybench check`: two stored runs (replaybench.check), or --revs: two revisions measured
    interleaved (replaybench.ab, which uses the check's gate: so the check never imports it)."""
    from .check import run_check
    def usage(msg: str) -> int:
        print(f"replaybench check: {msg}", file=sys.stderr)
        return 2
    if args.threshold is not None and not 0 <= args.threshold < 1:
        return usage(f"--threshold must be in [0, 1), got {args.threshold}")
    if args.alpha is not None and not 0 < args.alpha < 0.5:
        return usage(f"--alpha must be in (0, 0.5), got {args.alpha}")
    if args.revs:
        if args.base or args.new:
            return usage("give either BASE NEW (two stored runs) or --revs BASE_REV NEW_REV SCENARIO, not both")
        from .ab import run_ab
        return run_ab(*args.revs, device=args.device, threshold=args.threshold, alpha=args.alpha,
                      strict=args.strict, markdown=args.markdown, results_dir=args.results_dir,
                      inject=args.inject, run_id=args.run_id, time_budget=args.time_budget)
    if args.inject:
        return usage("--inject needs --revs")
    if not (args.base and args.new):
        return usage("need BASE and NEW runs (or --revs BASE_REV NEW_REV SCENARIO)")
    return run_check(args.base, args.new, threshold=args.threshold, alpha=args.alpha, strict=args.strict,
                     allow_device_mismatch=args.allow_device_mismatch, results_dir=args.results_dir,
                     markdown=args.markdown, scenario=args.scenario).exit_code


def cmd_models(args, argv) -> int:
    from .models import models_table
    try:
        print(models_table(args.names or None))
    except ValueError as e:
        _err(str(e))
        return 2
    return 0


def cmd_memory(args, argv) -> int:
    from .memory import format_table, memory_table
    try:
        rows = memory_table(args.names or None, args.budget_gb, args.spec_window, args.buffer_len, args.flush_period)
    except ValueError as e:
        _err(str(e))
        return 2
    print(format_table(rows, args.budget_gb, args.spec_window, args.buffer_len, args.flush_period))
    return 0


def cmd_explain(args, argv) -> int:
    from .explain import explain
    from .scenario import ScenarioError, load_scenario
    try:
        scenario = load_scenario(locate(args.scenario))
        print(explain(scenario.cases, args.case, compile=args.compile))
    except ScenarioError as e:
        print(str(e), file=sys.stderr)
        return 2
    except KeyError as e:
        _err(e.args[0])
        return 2
    return 0


def cmd_tune(args, argv) -> int:
    from .scenario import ScenarioError
    from .store import StoreError
    from .tune import run_tune
    if args.rounds < 1:
        _err(f"--rounds {args.rounds}: must be >= 1")
        return 2
    try:
        return run_tune(locate(args.scenario), args.device, args.results_dir, args.rounds, args.run_id)
    except ScenarioError as e:
        print(str(e), file=sys.stderr)
        return 2
    except (StoreError, RuntimeError) as e:
        _err(str(e))
        return 2


def cmd_env(args, argv) -> int:
    from .hardware import device_info, measure_ceilings, versions
    try:
        info = {"device": device_info(args.device), "versions": versions(),
                "env": {k: os.environ.get(k) for k in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES")}}
        if args.ceilings:
            info["ceilings"] = measure_ceilings(info["device"]["torch_device"])
    except RuntimeError as e:
        _err(str(e))
        return 2
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        for section, d in info.items():
            print(f"[{section}]")
            for k, v in d.items():
                print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
