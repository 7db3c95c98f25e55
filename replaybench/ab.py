"""A/B of two kernel revisions on one machine: ``replaybench check --revs BASE_REV NEW_REV SCENARIO``.

How a pull request is judged: each revision's kernels (``kernels/`` of a git revision, exported
with ``git archive`` into a temporary directory; or a directory holding ``replayssm/``; or
``WORKTREE``, this checkout) are imported by a worker process of their own (PYTHONPATH puts
them first; the suite itself is this checkout's). Case by case, every worker builds the
kernel runner's workload (runners.kernel.workload: the same layers, steps and state sizes as a
sweep), warms it up and captures it in a CUDA graph; then the coordinator asks the workers for
a few samples each in turn, rotating the order every round (AB, BA, AB, ... with two sides), on
the same GPU, until every side meets the scenario's stopping rule (its max_time_s scaled by
the number of sides). Every sample is bracketed by CUDA events; after each batch the NVML
throttle reasons are read and throttled batches are handled as replaybench.timing handles
them. The rows go to ``results/<prefix>-base`` and ``-new`` (samples included), so
``replaybench check <prefix>-base <prefix>-new`` can re-judge them, and the gate's verdicts
(replaybench.check) are printed and written as Markdown.

Validation of the gate (``--inject F``): further sides run NEW_REV's kernels (``--inject 0``:
a plain replica, for more A/A comparisons) with an extra read of F x the case's modelled bytes
per sample (an fp32 buffer summed inside the same CUDA graph,
one launch per sample), i.e. a workload that honestly moves F more bytes; the summary tells how
many of those the gate calls SLOWER. The measured time ratio is what it is: a read at the
copy bandwidth adds F x (the case's achieved / copy bandwidth) of time.

Only kernel-runner cases of our kernels are measured (eager / replay / replay-dual /
replay-shared-low, backends triton and reference); other cases are reported as not measured.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import gc
import io
import json
import math
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from .methods import names

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKTREE = "WORKTREE"
AB_METHODS = names(layer=True)     # the methods of ours a one-step decode layer builds
AB_BACKENDS = ("triton", "reference")
BATCH_CUDA = 5                  # samples a side takes per round on a GPU
BATCH_CPU = 2


class ABError(RuntimeError):
    """Bad input to the A/B command (unknown revision, unusable scenario)."""


# ----------------------------------------------------------------------------- revisions

def _git(*args: str, binary: bool = False):
    r = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, timeout=120)
    if r.returncode != 0:
        raise ABError(f"git {' '.join(args)}: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout if binary else r.stdout.decode().strip()


def export_kernels(rev: str, dest: Path) -> tuple[Path, dict]:
    """(directory holding replayssm/, provenance) of a revision: WORKTREE, a directory, or a
    git revision whose kernels/ is extracted under dest."""
    if rev == WORKTREE:
        from .store import git_info
        return REPO_ROOT / "kernels", {"rev": rev, **git_info(REPO_ROOT)}
    p = Path(rev)
    if p.is_dir():
        for cand in (p, p / "kernels"):
            if (cand / "replayssm" / "__init__.py").is_file():
                return cand.resolve(), {"rev": rev, "dir": str(cand.resolve())}
        raise ABError(f"revision {rev!r} is a directory without replayssm/ (or kernels/replayssm/)")
    try:
        sha = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except ABError:
        raise ABError(f"unknown revision {rev!r}: not a git revision of {REPO_ROOT}, a directory, "
                      f"or {WORKTREE}") from None
    data = _git("archive", "--format=tar", sha, "kernels", binary=True)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        tf.extractall(dest, filter="data")
    kdir = dest / "kernels"
    if not (kdir / "replayssm" / "__init__.py").is_file():
        raise ABError(f"revision {rev!r} ({sha[:10]}) has no kernels/replayssm/")
    return kdir, {"rev": rev, "sha": sha, "dirty": False}


# ----------------------------------------------------------------------------- worker side

def _foreign_modules(kernels: Path) -> list[str]:
    """replayssm modules loaded from outside `kernels` (an editable install's finder would
    otherwise supply a module the revision lacks from this checkout)."""
    out = []
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if name.split(".")[0] == "replayssm" and f and kernels not in Path(f).resolve().parents:
            out.append(f"{name} ({f})")
    return out


def _worker(device: str, kernels: str) -> int:
    """The worker loop: JSON commands on stdin, one JSON reply a line on stdout."""
    kdir = Path(kernels).resolve()
    # only this revision's kernels: no meta-path finder of an editable install may fill in a
    # replayssm module the revision does not have
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in str(getattr(f, "__module__", "")).lower()]
    # the protocol gets its own copy of fd 1; fd 1 itself (Python and C-level prints, e.g. a
    # compiler's) now goes to stderr, so nothing else can land between two replies
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import replayssm
    from . import timing
    from .models import get_model
    from .runners.kernel import workload
    from .scenario import Case, TimingConfig
    from .traffic import step_traffic

    st: dict = {}

    def reply(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    def setup(msg):
        st.clear()
        case = Case(**msg["case"])
        cfg = TimingConfig(**msg["timing"])
        model = get_model(case.model)
        sample, steps, nl = workload(case, model, device)
        per = steps * nl
        step_bytes = float(step_traffic(case, model).total_bytes)
        inject = float(msg.get("inject") or 0.0)
        extra = None
        if inject > 0:
            n = max(1, math.ceil(inject * step_bytes * per / 4))
            extra = torch.ones(n, dtype=torch.float32, device=device)
            acc = torch.zeros((), dtype=torch.float32, device=device)

            def fn():
                sample()
                torch.sum(extra, dim=0, out=acc)     # the extra read: every byte of `extra` once
        else:
            fn = sample
        if device.startswith("cuda"):
            timing.warm_up(fn, cfg.warmup)
            graph = timing.capture(fn)
            run = graph.replay
            for _ in range(2):
                run()
            torch.cuda.synchronize()
            st.update(graph=graph, nvml=timing.NvmlProbe(torch.cuda.current_device()))
        else:
            for _ in range(cfg.warmup):
                fn()
            run = fn
        st.update(run=run, fn=fn, extra=extra)
        foreign = _foreign_modules(kdir)
        if foreign:
            raise ImportError(f"kernel modules from outside {kdir}: {', '.join(foreign)}")
        inj_bytes = 0 if extra is None else extra.numel() * 4
        return {"ok": True, "per": per, "bytes_model": step_bytes, "layers": nl, "steps": steps,
                "inject_bytes_per_sample": inj_bytes,
                "inject_fraction": inj_bytes / (step_bytes * per) if step_bytes else None}

    def measure(msg):
        n = int(msg["n"])
        run = st["run"]
        if device.startswith("cuda"):
            return {"ok": True, "samples": timing.event_batch(run, n), "state": st["nvml"].read()}
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            run()
            out.append((time.perf_counter() - t0) * 1e6)
        return {"ok": True, "samples": out, "state": {}}

    def release(msg):
        st.clear()
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        return {"ok": True}

    handlers = {"setup": setup, "measure": measure, "release": release}
    foreign = _foreign_modules(kdir)
    if foreign:
        raise SystemExit(f"replaybench.ab worker: kernel modules from outside {kdir}: {', '.join(foreign)}")
    reply({"ok": True, "replayssm": str(Path(replayssm.__file__).resolve()), "pid": os.getpid(),
           "torch": torch.__version__})
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if msg.get("cmd") == "quit":
            break
        try:
            reply(handlers[msg["cmd"]](msg))
        except Exception as e:  # noqa: BLE001 - reported to the coordinator as this case's error
            st.clear()
            reply({"ok": False, "error": f"{type(e).__name__}: {e}"})
    return 0


# ----------------------------------------------------------------------------- coordinator side

class WorkerDied(RuntimeError):
    pass


class Worker:
    """One side's worker process (its revision's kernels first on PYTHONPATH)."""

    def __init__(self, name: str, kernels: Path, device: str, wait: bool = True):
        self.name, self.kernels, self.device = name, kernels, device
        self.proc = None
        self.start(wait)

    def start(self, wait: bool = True) -> None:
        env = dict(os.environ)
        paths = [str(self.kernels), str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        self.proc = subprocess.Popen([sys.executable, "-m", "replaybench.ab", "--worker", self.device,
                                      str(self.kernels)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=str(REPO_ROOT))
        if wait:
            self.ready()

    def ready(self) -> None:
        """Wait for the worker's hello and check which kernels it imported."""
        hello = self.read()
        got = Path(hello.get("replayssm", "")).resolve()
        if self.kernels.resolve() not in got.parents:
            self.close()
            raise ABError(f"side {self.name}: imported replayssm from {got}, not from {self.kernels} "
                          f"(something shadows PYTHONPATH)")

    def read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise WorkerDied(f"side {self.name}: worker exited (code {self.proc.poll()})")
            try:
                return json.loads(line)
            except json.JSONDecodeError:        # not a reply: pass it on
                print(line, end="", file=sys.stderr)

    def send(self, **msg) -> None:
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied(f"side {self.name}: worker is gone") from None

    def call(self, **msg) -> dict:
        self.send(**msg)
        return self.read()

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


@dataclasses.dataclass
class Side:
    name: str                   # 'base', 'new', 'new+inject0.03'
    rev: str
    kernels: Path
    provenance: dict
    inject: float = 0.0
    worker: Worker | None = None


def _stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")


def measure_case(case, sides: list[Side], cfg, device: str) -> dict:
    """Interleaved measurement of one case on every side: {side name: (Timing | None, info, error)}."""
    from .timing import SampleBatches, stop_rule
    out: dict = {}
    live = []
    cdict = dataclasses.asdict(case)
    replies = _all(sides, cmd="setup", case=cdict, timing=cfg.to_dict())   # set-ups run side by side
    for s in sides:
        r = replies[s.name]
        if r.get("ok"):
            live.append(s)
            out[s.name] = [None, r, None]
        else:
            out[s.name] = [None, {}, r.get("error")]
    accs = {s.name: SampleBatches() for s in live}
    scaled = dataclasses.replace(cfg, max_time_s=cfg.max_time_s * max(len(live), 1))
    batch = BATCH_CUDA if device.startswith("cuda") else BATCH_CPU
    started = time.perf_counter()
    rnd = 0
    while live:
        k = rnd % len(live)
        for s in live[k:] + live[:k]:
            try:
                r = s.worker.call(cmd="measure", n=batch)
            except WorkerDied as e:
                s.worker.start()
                r = {"ok": False, "error": str(e)}
            if not r.get("ok"):
                out[s.name][2] = r.get("error")
                continue
            accs[s.name].add(r["samples"], r.get("state") or {})
        live = [s for s in live if out[s.name][2] is None]
        rnd += 1
        if rnd >= 2 and all(stop_rule(accs[s.name].samples, scaled, started) for s in live):
            break
    for s in sides:
        t, info, e = out[s.name]
        if e is None and s.name in accs:
            try:
                out[s.name][0] = accs[s.name].summary(info["per"])
            except RuntimeError as ex:          # every batch throttled
                out[s.name][2] = str(ex)
    _all(sides, cmd="release")
    return {k: tuple(v) for k, v in out.items()}


def _all(sides: list[Side], **msg) -> dict:
    """Send `msg` to every side's worker at once (each with its own inject), then collect the
    replies; a worker that died is restarted and its reply is an error."""
    sent, replies = [], {}
    for s in sides:
        try:
            s.worker.send(**msg, inject=s.inject)
            sent.append(s)
        except WorkerDied as e:
            replies[s.name] = {"ok": False, "error": str(e)}
    for s in sent:
        try:
            replies[s.name] = s.worker.read()
        except WorkerDied as e:
            replies[s.name] = {"ok": False, "error": str(e)}
    for s in sides:
        if s.worker.proc.poll() is not None:
            s.worker.start()
    return replies


def _row(case, side: Side, t, info: dict, err: str | None, run_id: str) -> dict:
    row = {"run_id": run_id, **dataclasses.asdict(case), "runner": "ab", "rev": side.rev,
           "inject": side.inject}
    if err is not None or t is None:
        row.update(status="error", error=err or "no timing")
        return row
    b = info.get("bytes_model")
    row.update(t.columns())
    row.update(status="ok", error=None, bytes_model=b, gbps=(b / t.median_us / 1e3) if b and t.median_us else None,
               layers=info.get("layers"), steps_per_sample=info.get("steps"),
               inject_fraction=info.get("inject_fraction"), inject_bytes_per_sample=info.get("inject_bytes_per_sample"))
    return row


def run_ab(base_rev: str, new_rev: str, scenario_path: str, *, device: str = "auto",
           threshold: float | None = None, alpha: float | None = None, strict: bool | None = None,
           markdown: str | None = None, results_dir: str = "results", inject=(), run_id: str | None = None,
           time_budget: float | None = None, out=None) -> int:
    """The A/B command; its exit code (0 pass, 1 NEW_REV regresses, 2 bad input)."""
    from . import stats as S
    from .check import compare, format_markdown, format_text, gate
    from .hardware import device_info
    from .scenario import ScenarioError, load_scenario, locate
    from .store import RunStore, StoreError, now_iso
    from .sweep import setup_device_env
    out = out or sys.stdout

    def bad(msg: str) -> int:
        print(f"replaybench check --revs: {msg}", file=sys.stderr)
        return 2

    t_start = time.perf_counter()      # the budget covers the workers' start and compiles too
    if time_budget is not None and time_budget <= 0:
        return bad(f"--time-budget must be > 0, got {time_budget}")
    for f in inject:
        if not 0 <= f < 1:
            return bad(f"--inject must be in [0, 1) (0: one more plain NEW side, an A/A replica), got {f}")
    try:
        scen = load_scenario(locate(scenario_path))
        cfg_check = S.check_config_from_text(scen.text)
    except (ScenarioError, S.CheckTableError) as e:
        return bad(str(e))
    if scen.runner != "kernel":
        return bad(f"scenario {scen.name!r} uses runner {scen.runner!r}; the A/B command measures kernel-runner "
                   f"scenarios")
    try:
        dev = setup_device_env(device)
    except RuntimeError as e:
        return bad(str(e))
    thr = threshold if threshold is not None else (cfg_check.threshold if cfg_check.threshold is not None
                                                   else S.DEFAULT_THRESHOLD)
    a = alpha if alpha is not None else (cfg_check.alpha if cfg_check.alpha is not None else S.DEFAULT_ALPHA)
    st = bool(strict) if strict is not None else bool(cfg_check.strict)
    info = device_info(dev)
    prefix = run_id or f"ab-{scen.name}-{_stamp()}"
    cases = [dataclasses.replace(c, device=dev) for c in scen.cases]
    measured = [c for c in cases if c.method in AB_METHODS and c.backend in AB_BACKENDS]
    skipped = [c for c in cases if c not in measured]
    if not measured:
        return bad(f"scenario {scen.name!r} has no case the A/B command measures (methods "
                   f"{', '.join(AB_METHODS)}; backends {', '.join(AB_BACKENDS)})")

    with tempfile.TemporaryDirectory(prefix="replaybench-ab-") as tmp:
        try:
            kb, pb = export_kernels(base_rev, Path(tmp) / "base")
            kn, pn = export_kernels(new_rev, Path(tmp) / "new")
        except ABError as e:
            return bad(str(e))
        sides = [Side("base", base_rev, kb, pb), Side("new", new_rev, kn, pn)]
        for f in inject:
            name = f"new+inject{f:g}" if f else "new-replica"
            k, base_name = 2, name
            while any(x.name == name for x in sides):
                name, k = f"{base_name}{k}", k + 1
            sides.append(Side(name, new_rev, kn, pn, inject=f))
        stores = {}
        try:
            for s in sides:             # start them all, then wait: the imports overlap
                s.worker = Worker(s.name, s.kernels, dev, wait=False)
            for s in sides:
                s.worker.ready()
            for s in sides:
                man = {"run_id": f"{prefix}-{s.name}", "created": now_iso(), "git": s.provenance,
                       "argv": sys.argv, "scenario": {"name": scen.name, "path": scen.path, "sha256": scen.sha256,
                                                      "text": scen.text, "runner": scen.runner,
                                                      "n_cases": len(measured)},
                       "timing": scen.timing.to_dict(), "device": info,
                       "ab": {"prefix": prefix, "side": s.name, "sides": [x.name for x in sides],
                              "revs": {"base": base_rev, "new": new_rev}, "inject": s.inject,
                              "interleave": "rotating rounds", "batch": BATCH_CUDA if dev.startswith("cuda")
                              else BATCH_CPU}}
                stores[s.name] = RunStore.create_or_resume(results_dir, f"{prefix}-{s.name}", man)
            t0 = time.perf_counter()
            # a re-run with the same --run-id resumes: cases stored on every side are not re-measured
            done = set.intersection(*(stores[s.name].done_case_ids() for s in sides))
            per_case: list[float] = []
            for i, case in enumerate(measured):
                if case.case_id in done:
                    continue
                # stop before a case that would overrun: the budget is a promise to the caller
                need = max(per_case) if per_case else 0.0
                if time_budget is not None and time.perf_counter() - t_start + need > time_budget:
                    rest = [c for c in measured[i:] if c.case_id not in done]
                    print(f"time budget of {time_budget:g} s spent: {len(rest)} case(s) not measured; the same "
                          f"command with --run-id {prefix} resumes", file=sys.stderr)
                    skipped += rest
                    measured = [c for c in measured if c not in rest]
                    break
                tc = time.perf_counter()
                res = measure_case(case, sides, scen.timing, dev)
                per_case.append(time.perf_counter() - tc)
                for s in sides:
                    t, inf, err = res[s.name]
                    stores[s.name].append(_row(case, s, t, inf, err, f"{prefix}-{s.name}"))
                med = {k: (f"{v[0].median_us:.3f}" if v[0] else "error") for k, v in res.items()}
                print(f"[{i + 1}/{len(measured)}] {case.case_id}: "
                      + "  ".join(f"{k} {m}" for k, m in med.items()), file=sys.stderr, flush=True)
            wall = time.perf_counter() - t0
        except (WorkerDied, ABError, StoreError) as e:
            return bad(str(e))
        finally:
            for s in sides:
                if s.worker:
                    s.worker.close()
            for stt in stores.values():
                stt.unlock()
        for stt in stores.values():
            stt.materialise()

    dfs = {k: v.dataframe() for k, v in stores.items()}
    same_rev = _same(pb, pn)
    header = (f"A/B on {info.get('name')} ({dev}): BASE {base_rev} {_short(pb)} vs NEW {new_rev} {_short(pn)}"
              f"{' (the same kernels: an A/A run)' if same_rev else ''}; scenario {scen.name} ({len(measured)} "
              f"case(s), {wall:.0f} s); threshold {thr:.1%}, alpha {a:g}{', strict' if st else ''}")
    table = compare(dfs["base"], dfs["new"], thr, a, cfg_check, st)
    res = gate(table, dfs["base"], dfs["new"])
    format_text(res, header, out)
    base_err = dfs["base"][dfs["base"]["status"] == "error"]
    for _, r in base_err.iterrows():
        print(f"BASE ERROR  {r['case_id']}: {r['error']}", file=out)
    if res.compared == 0:            # nothing measured on both sides: no verdict to give
        print("replaybench check --revs: no case was measured on both sides (see the errors above)",
              file=sys.stderr)
        if markdown:
            Path(markdown).write_text(format_markdown(res, "replaybench A/B", ["no case was measured on both sides"]),
                                      encoding="utf-8")
        return 2
    notes = [f"BASE `{base_rev}` {_short(pb)}, NEW `{new_rev}` {_short(pn)}"
             + (" — the same kernels (A/A)" if same_rev else ""),
             f"{info.get('name')}, scenario `{scen.name}`: {len(measured)} case(s) measured interleaved "
             f"(rotating rounds) in {wall:.0f} s"
             + (f"; {len(skipped)} case(s) not measured (not A/B-measurable, or past --time-budget)"
                if skipped else ""),
             f"threshold {thr:.1%}, alpha {a:g}{', strict' if st else ''}; rows: `{results_dir}/{prefix}-base`, "
             f"`{results_dir}/{prefix}-new`"]
    md = [format_markdown(res, "replaybench A/B", notes)]
    summary = []                     # (side, kind, result): the validation table
    if same_rev:
        summary.append(("new", "A/A", res))
    for s in sides[2:]:
        t2 = compare(dfs["base"], dfs[s.name], thr, a, cfg_check, st)
        r2 = gate(t2, dfs["base"], dfs[s.name])
        ok = t2[t2["verdict"] == S.SLOWER]
        fr = list(dfs[s.name]["inject_fraction"].dropna().astype(float)) if "inject_fraction" in dfs[s.name] else []
        what = (f"NEW + extra read of {s.inject:.0%} of the modelled bytes (actual "
                f"{min(fr):.4f}-{max(fr):.4f})" if s.inject and fr else "a replica of NEW (A/A)")
        line = (f"validation {s.name}: {what}: SLOWER in {len(ok)}/{len(t2)} case(s); median time ratio "
                f"{t2['ratio'].median():.4f} (min {t2['ratio'].min():.4f}, max {t2['ratio'].max():.4f}); "
                f"verdicts {r2.counts}" if len(t2) else f"validation {s.name}: nothing compared")
        print(line, file=out)
        md.append(format_markdown(r2, f"validation: {s.name} vs base", [line]))
        if s.inject or same_rev:
            summary.append((s.name, f"+{s.inject:.0%} bytes" if s.inject else "A/A", r2))
    plain = (["base", "new"] if same_rev else []) + [s.name for s in sides[2:] if not s.inject]
    for i, x in enumerate(plain[1:], 1):     # the other pairs of plain sides: more A/A comparisons
        for y in plain[1:i]:
            t3 = compare(dfs[y], dfs[x], thr, a, cfg_check, st)
            summary.append((f"{x} vs {y}", "A/A", gate(t3, dfs[y], dfs[x])))
    if same_rev:
        print(f"A/A: {res.counts.get(S.SLOWER, 0) + res.counts.get(S.FASTER, 0)} of {res.compared} case(s) "
              f"called SLOWER/FASTER (false alarms), {res.counts.get(S.AMBIGUOUS, 0)} AMBIGUOUS", file=out)
    if summary:
        table = validation_table(summary)
        print(table, file=out)
        md.insert(0, "### Validation of the gate\n\n" + table + "\n")
    if markdown:
        Path(markdown).write_text("\n\n".join(md), encoding="utf-8")
    return res.exit_code


def binom_upper(k: int, n: int, conf: float = 0.95) -> float:
    """Exact (Clopper-Pearson) one-sided upper confidence bound of a rate seen k times in n."""
    if n <= 0:
        return 1.0
    if k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(60):              # P(X <= k | p) = 1 - conf, by bisection on p
        p = (lo + hi) / 2
        cdf = sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))
        lo, hi = (p, hi) if cdf > 1 - conf else (lo, p)
    return hi


def validation_table(summary) -> str:
    """Markdown table of a validation run: per extra side the verdict counts and the rate
    (false alarms = SLOWER or FASTER for A/A sides, detections = SLOWER for injected ones)
    with its exact 95 % bound; A/A sides pooled in a last row."""
    from . import stats as S
    lines = ["| side | kind | compared | SLOWER | FASTER | AMBIGUOUS | SAME | median ratio | min / max ratio | rate |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    pool_k = pool_n = 0
    for name, kind, r in summary:
        c, t, n = r.counts, r.table, r.compared
        if kind == "A/A":
            k = c.get(S.SLOWER, 0) + c.get(S.FASTER, 0)
            pool_k, pool_n = pool_k + k, pool_n + n
            rate = f"false alarms {k}/{n} (95 % upper {binom_upper(k, n):.1%})"
        else:
            k = c.get(S.SLOWER, 0)
            rate = f"caught {k}/{n} (95 % lower {1 - binom_upper(n - k, n):.1%})"
        rr = t["ratio"].astype(float) if n else None
        lines.append(f"| {name} | {kind} | {n} | {c.get(S.SLOWER, 0)} | {c.get(S.FASTER, 0)} | "
                     f"{c.get(S.AMBIGUOUS, 0)} | {c.get(S.SAME, 0)} | "
                     + (f"{rr.median():.4f} | {rr.min():.4f} / {rr.max():.4f}" if n else "n/a | n/a") + f" | {rate} |")
    if pool_n:
        lines.append(f"| all A/A | A/A | {pool_n} | | | | | | | false alarms {pool_k}/{pool_n} "
                     f"(95 % upper {binom_upper(pool_k, pool_n):.1%}) |")
    return "\n".join(lines)


def _same(a: dict, b: dict) -> bool:
    if a.get("sha") and a.get("sha") == b.get("sha") and not a.get("dirty") and not b.get("dirty"):
        return True
    return a.get("rev") == b.get("rev") == WORKTREE or (a.get("dir") is not None and a.get("dir") == b.get("dir"))


def _short(p: dict) -> str:
    if p.get("sha"):
        return f"({str(p['sha'])[:10]}{'+dirty' if p.get('dirty') else ''})"
    return f"({p.get('dir') or p.get('rev')})"


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--worker":
        sys.exit(_worker(sys.argv[2], sys.argv[3]))
    print("usage: replaybench check --revs BASE_REV NEW_REV SCENARIO", file=sys.stderr)
    sys.exit(2)
