"""The sweep loop: cases -> runner -> rows -> store (-> report).

For every case of the scenario that has no row yet in the run directory, call
``runner.run(case, ctx)``, add identity columns, gbps and pct_copy_bw, and
append the row durably.  Exceptions become status='error' rows (full traceback
in ``errors.log``) and the sweep goes on; :class:`~replaybench.runners.SkipCase`
becomes a status='skipped' row.  Rerunning the same command resumes.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .scenario import Case, Scenario
from .hardware import achieved_gbps, pct_of_copy
from .schema import CONTRACT_COLUMNS, IDENTITY_COLUMNS   # IDENTITY: the sweep's; a runner cannot override them
from .store import RunStore, StoreError, default_run_id, fresh_run_id, git_info, now_iso, validate_run_id

MATERIALISE_EVERY_S = 15.0
MAX_ERROR_CHARS = 300


@dataclass
class SweepResult:
    run_id: str
    run_dir: Path
    counts: dict                       # ok / error / skipped / rows over the whole run
    ran: int                           # cases run by this invocation
    already_done: int                  # cases found done on entry (resume)
    report_dir: Path | None = None
    report_error: str | None = None
    interrupted: bool = False


def setup_device_env(device: str) -> str:
    """Resolve 'auto' and, on CPU, set TRITON_INTERPRET=1 (before any Triton kernel import)."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        return "cpu"
    from .hardware import resolve_device
    dev = resolve_device(device)
    if dev == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    return dev


def check_writable(path: str | Path, what: str) -> None:
    """Raise StoreError (one line) unless directory `path` exists writable or can be created: checked
    before anything is written, so an unwritable results or reports directory leaves nothing behind."""
    p = Path(path).absolute()
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        why = "is not a directory" if probe.exists() and not probe.is_dir() else "is not writable"
        raise StoreError(f"cannot write the {what} directory {path}: {probe} {why} (choose another with "
                         f"--{what}-dir)")


def choose_run_id(scenario: Scenario, dev_info: dict, run_id: str | None = None,
                  new: bool = False) -> str:
    if run_id:
        return validate_run_id(run_id)
    args = (scenario.name, scenario.sha256, dev_info["name"], dev_info["slug"])
    return fresh_run_id(*args) if new else default_run_id(*args)


def build_manifest(scenario: Scenario, dev_info: dict, run_id: str, argv: list[str] | None,
                   ceilings: dict, ncases: int) -> dict:
    from .hardware import versions
    git = git_info()
    started = now_iso()
    return {
        "run_id": run_id,
        "created": started,
        "updated": started,
        "git": git,
        "argv": list(argv) if argv is not None else list(sys.argv),
        "cwd": os.getcwd(),
        "scenario": {
            "name": scenario.name, "path": scenario.path, "description": scenario.description,
            "runner": scenario.runner, "sha256": scenario.sha256, "text": scenario.text,
            "n_cases": ncases, "n_skipped_combos": len(scenario.skipped),
            "skipped_combos": [dataclasses.asdict(s) for s in scenario.skipped],
        },
        "timing": scenario.timing.to_dict(),
        "hostname": platform.node(),
        "device": dev_info,
        "device_name": dev_info.get("name"),
        "versions": versions(),
        "env": {k: os.environ.get(k) for k in
                ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")},
        "ceilings": ceilings,
        "sessions": [{"started": started, "argv": list(argv) if argv is not None else list(sys.argv),
                      "git_sha": git.get("sha"), "git_dirty": git.get("dirty"),
                      "gpu_uuid": dev_info.get("uuid"), "pid": os.getpid()}],
    }


def _short_error(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    first = msg[0] if msg else ""
    s = f"{type(e).__name__}: {first}" if first else type(e).__name__
    return s if len(s) <= MAX_ERROR_CHARS else s[: MAX_ERROR_CHARS - 3] + "..."


def make_row(case: Case, metrics: dict | None, *, run_id: str, device_label: str,
             ceilings: dict, status: str = "ok", error: str | None = None,
             wall_s: float | None = None, session: int | None = None) -> dict:
    """One result row: identity columns + runner metrics + gbps / pct_copy_bw; `session`: index
    of this sweep invocation in the manifest's 'sessions' (a resumed run has several)."""
    row: dict[str, Any] = {c: None for c in CONTRACT_COLUMNS}
    for k, v in (metrics or {}).items():
        if k not in IDENTITY_COLUMNS:
            row[k] = v
    row.update(run_id=run_id, case_id=case.case_id, runner=case.runner, model=case.model,
               op=case.op, method=case.method, backend=case.backend, batch=case.batch,
               buffer_len=case.buffer_len, flush_period=case.flush_period,
               spec_window=case.spec_window, state_dtype=case.state_dtype,
               lo_dtype=case.lo_dtype, device=device_label, torch_device=case.device,
               seed=case.seed, accept=getattr(case, "accept", "none"), status=status, error=error)
    ok = status == "ok"
    row["gbps"] = achieved_gbps(row.get("bytes_model"), row.get("median_us")) if ok else None
    row["pct_copy_bw"] = pct_of_copy(row["gbps"], ceilings) if row["gbps"] is not None else None
    row["wall_s"] = wall_s
    row["session"] = session
    row["finished"] = now_iso()
    return row


def _ncu_columns(case: Case, metrics: dict) -> dict:
    """Measured DRAM bytes per step (Nsight Compute) beside the modelled bytes; a failure of
    the profiler is recorded in ncu_error and does not fail the case."""
    if case.runner != "kernel" or case.backend == "reference" or not str(case.device).startswith("cuda"):
        return {}
    from .ncu import measure_dram
    try:
        cols = measure_dram(case)
    except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
        return {"ncu_error": f"{type(e).__name__}: {str(e)[:300]}"}
    model = metrics.get("bytes_model")
    if model:
        cols["dram_vs_model"] = cols["dram_bytes"] / model
    return cols


def run_sweep(scenario: Scenario, *, device: str = "auto", results_dir: str | Path = "results",
              reports_dir: str | Path = "reports", run_id: str | None = None, new: bool = False,
              argv: list[str] | None = None, report: bool = True, progress: bool = True,
              measure_ceilings: bool = True, retry_errors: bool = False, ncu: bool = False,
              log=None) -> SweepResult:
    """Run (or resume) a scenario.  Raises RunnerError/StoreError before writing anything
    when the runner cannot be imported, the run id belongs to another scenario, or the results
    (or, with report, the reports) directory cannot be written. `log(line)`: told where the
    results and report go before the first case."""
    from . import runners
    from .hardware import device_info

    dev = setup_device_env(device)
    runner = runners.get(scenario.runner)           # fail before anything is written
    info = device_info(dev)
    rid = choose_run_id(scenario, info, run_id, new)
    run_dir = Path(results_dir) / rid
    check_writable(results_dir, "results")
    if report:
        check_writable(reports_dir, "reports")

    # reuse the ceilings of a resumed run so pct_copy_bw is consistent within the run
    old = RunStore(run_dir).manifest()
    if old:
        old_sha = (old.get("scenario") or {}).get("sha256")
        if old_sha != scenario.sha256:
            raise StoreError(f"run {rid!r} in {run_dir} was made from a different scenario "
                             f"(sha256 {str(old_sha)[:12]}... vs {scenario.sha256[:12]}...); "
                             f"use --new for a fresh run or --run-id to name another one")
    ceilings = old.get("ceilings") if old.get("ceilings") else None
    if ceilings is None:
        if measure_ceilings:
            from .hardware import measure_ceilings as _measure
            ceilings = _measure(dev)
        else:
            ceilings = {}
    cases = [dataclasses.replace(c, device=dev) for c in scenario.cases]
    manifest = build_manifest(scenario, info, rid, argv, ceilings, len(cases))
    try:
        store = RunStore.create_or_resume(results_dir, rid, manifest)
    except OSError as e:
        raise StoreError(f"cannot write the run directory {run_dir}: {e.strerror or e}") from None
    if log is not None:
        log(f"results: {store.run_dir.absolute()}"
            + (f"; report: {(Path(reports_dir) / rid).absolute()}" if report else ""))
    session = len(store.manifest().get("sessions") or [None]) - 1

    statuses = ("ok", "skipped") if retry_errors else ("ok", "error", "skipped")
    done = store.done_case_ids(statuses)
    todo = [c for c in cases if c.case_id not in done]
    already = len(cases) - len(todo)
    ctx = runners.RunContext(device=dev, timing=scenario.timing, ceilings=ceilings,
                             device_name=info.get("name", ""))
    label = info.get("label", dev)

    bar = None
    if progress:
        from tqdm import tqdm
        tty = sys.stderr.isatty()
        bar = tqdm(total=len(cases), initial=already, unit="case", dynamic_ncols=True,
                   desc=scenario.name, file=sys.stderr, mininterval=0.5 if tty else 10.0)
    ran = 0
    interrupted = False
    last_mat = time.monotonic()
    try:
        for case in todo:
            if bar is not None:
                bar.set_postfix_str(case.case_id, refresh=False)
            t0 = time.perf_counter()
            try:
                metrics = runner.run(case, ctx)
                if not isinstance(metrics, dict):
                    raise TypeError(f"runner returned {type(metrics).__name__}, expected dict")
                if ncu:
                    metrics.update(_ncu_columns(case, metrics))
                row = make_row(case, metrics, run_id=rid, device_label=label, ceilings=ceilings,
                               wall_s=time.perf_counter() - t0, session=session)
            except runners.SkipCase as e:
                row = make_row(case, None, run_id=rid, device_label=label, ceilings=ceilings,
                               status="skipped", error=str(e) or "skipped",
                               wall_s=time.perf_counter() - t0, session=session)
            except Exception as e:  # noqa: BLE001 - a crashed case is a row
                row = make_row(case, None, run_id=rid, device_label=label, ceilings=ceilings,
                               status="error", error=_short_error(e),
                               wall_s=time.perf_counter() - t0, session=session)
                _log_error(store, case, e)
                _recover_device(dev)
            store.append(row)
            ran += 1
            if bar is not None:
                bar.update(1)
            if time.monotonic() - last_mat > MATERIALISE_EVERY_S:
                store.materialise()
                last_mat = time.monotonic()
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        if bar is not None:
            bar.close()
        counts = store.counts()
        try:
            store.materialise()
            store.update_manifest(counts=dict(counts, cases=len(cases)),
                                  complete=(not interrupted and counts["rows"] >= len(cases)))
        finally:
            store.unlock()

    result = SweepResult(run_id=rid, run_dir=store.run_dir, counts=counts, ran=ran,
                         already_done=already, interrupted=interrupted)
    if report:
        try:
            from .report import write_report
            result.report_dir = write_report(store.run_dir, reports_dir=reports_dir)
        except Exception as e:  # the results are safe; say what went wrong
            result.report_error = _short_error(e)
            _log_error(store, None, e)
    return result


def _log_error(store: RunStore, case: Case | None, e: BaseException) -> None:
    try:
        with open(store.run_dir / "errors.log", "a", encoding="utf-8") as f:
            f.write(f"=== {now_iso()} {case.case_id if case else 'report'}\n")
            f.write("".join(traceback.format_exception(e)))
    except OSError:
        pass


def _recover_device(dev: str) -> None:
    if dev.startswith("cuda"):
        try:
            import torch
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:
            pass
