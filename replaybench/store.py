"""Results store: ``results/<run-id>/`` with manifest.json, rows.jsonl, rows.parquet, rows.csv.

``rows.jsonl`` is the durable log: one JSON object per finished case, appended,
flushed and fsync'ed before the next case starts.  A kill at any moment loses at
most the case in flight; a torn last line (killed mid-write) is ignored when
reading and cut off before the next append, so that case is simply redone.
``rows.parquet`` / ``rows.csv`` are materialised from it (atomically) during and
at the end of a sweep, and by ``replaybench report``.  If a case id appears more
than once (only possible with ``--retry-errors``) the last row wins.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import math
import os
import re
import subprocess
import warnings
from pathlib import Path
from typing import Any, Iterable

from .schema import CONTRACT_COLUMNS, FLOAT_CONTRACT, INT_CONTRACT

STATUSES = ("ok", "error", "skipped")

ROWS_JSONL = "rows.jsonl"
ROWS_PARQUET = "rows.parquet"
ROWS_CSV = "rows.csv"
MANIFEST = "manifest.json"
LOCK = ".lock"

_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]*$")


class StoreError(RuntimeError):
    """Problems with a run directory (scenario mismatch, missing run, run in use)."""


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------- run ids

def default_run_id(scenario_name: str, scenario_sha256: str, device_name: str,
                   device_slug: str) -> str:
    """``<scenario>-<device-slug>-<8 hex of sha256(scenario sha + device name)>``:
    the same command on the same machine resumes the same run."""
    h = hashlib.sha256((scenario_sha256 + "\n" + device_name).encode()).hexdigest()[:8]
    return f"{scenario_name}-{device_slug}-{h}"


def fresh_run_id(scenario_name: str, scenario_sha256: str, device_name: str,
                 device_slug: str) -> str:
    """A new run id with a UTC timestamp (``--new``)."""
    ts = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{default_run_id(scenario_name, scenario_sha256, device_name, device_slug)}-{ts}"


def validate_run_id(run_id: str) -> str:
    if not _RUN_ID_RE.match(run_id or ""):
        raise StoreError(f"invalid run id {run_id!r}; allowed: letters, digits, '_', '.', "
                         f"'@', '+', '-' (no '/')")
    return run_id


# ----------------------------------------------------------------------------- provenance

def git_info(path: str | Path | None = None) -> dict:
    """sha, dirty flag and branch of the git checkout holding ``path`` (the package by default)."""
    cwd = Path(path) if path else Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    if os.environ.get("REPLAYBENCH_GIT_SHA"):
        # a copy of the tree (the GPU machine: no .git, or a stale one left from an earlier
        # copy): the sha and dirty flag of the checkout it was copied from, written by
        # tools/git_sha.sh and exported by tools/device_env.sh. Set explicitly, so it wins.
        sha, _, flag = os.environ["REPLAYBENCH_GIT_SHA"].partition(" ")
        return {"sha": sha, "dirty": flag == "dirty", "branch": None, "source": "REPLAYBENCH_GIT_SHA"}
    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain")
    dirty = None
    if status is not None:
        # modified tracked files, or untracked files outside the results/reports folders
        changed = [ln[3:] for ln in status.splitlines() if ln.strip()]
        dirty = any(not p.strip('"').startswith(("results/", "reports/")) for p in changed)
    return {"sha": sha, "dirty": dirty, "branch": git("rev-parse", "--abbrev-ref", "HEAD")}


def _jsonable(v: Any) -> Any:
    """Plain JSON value for a metric (numpy/torch scalars, NaN -> None, containers -> JSON text)."""
    if v is None or isinstance(v, (bool, str, int)):
        return v
    if isinstance(v, float):
        return None if (math.isnan(v) or math.isinf(v)) else v
    item = getattr(v, "item", None)
    if callable(item):
        try:
            return _jsonable(item())
        except (ValueError, RuntimeError, TypeError):
            pass
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, default=str)
    return str(v)


# ----------------------------------------------------------------------------- store

class RunStore:
    """One run directory.  Create/resume with :meth:`create_or_resume`, read with :meth:`open`."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.run_id = self.run_dir.name
        self.bad_lines = 0
        self._lock_fd: int | None = None

    # paths
    @property
    def rows_path(self) -> Path:
        return self.run_dir / ROWS_JSONL

    @property
    def manifest_path(self) -> Path:
        return self.run_dir / MANIFEST

    @property
    def parquet_path(self) -> Path:
        return self.run_dir / ROWS_PARQUET

    @property
    def csv_path(self) -> Path:
        return self.run_dir / ROWS_CSV

    # opening
    @classmethod
    def create_or_resume(cls, results_dir: str | Path, run_id: str, manifest: dict) -> "RunStore":
        """Create ``results_dir/run_id`` or resume it.

        ``manifest`` is the fresh manifest of this invocation (see sweep.build_manifest);
        on resume the stored one must have the same scenario sha256, its
        'created' time and 'ceilings' are kept, and this invocation is appended
        to 'sessions'.
        """
        validate_run_id(run_id)
        store = cls(Path(results_dir) / run_id)
        if store.manifest_path.exists():
            old = store.manifest()
            old_sha = (old.get("scenario") or {}).get("sha256")
            new_sha = (manifest.get("scenario") or {}).get("sha256")
            if old_sha != new_sha:
                raise StoreError(
                    f"run {run_id!r} in {store.run_dir} was made from a different scenario "
                    f"(sha256 {str(old_sha)[:12]}... vs {str(new_sha)[:12]}...); "
                    f"use --new for a fresh run or --run-id to name another one")
            merged = dict(old)
            for k, v in manifest.items():
                if k in ("created", "sessions", "ceilings") and k in old:
                    continue
                merged[k] = v
            merged["sessions"] = list(old.get("sessions", [])) + list(manifest.get("sessions", []))
            merged["resumed"] = True
            store.lock()
            store.repair()
            store.write_manifest(merged)
        else:
            store.run_dir.mkdir(parents=True, exist_ok=True)
            store.lock()
            store.write_manifest(dict(manifest, run_id=run_id))
        return store

    @classmethod
    def open(cls, run: str | Path, results_dir: str | Path = "results") -> "RunStore":
        """An existing run by directory path or by id under ``results_dir``."""
        p = Path(run)
        candidates = [p, Path(results_dir) / str(run)]
        if p.name in (ROWS_JSONL, ROWS_PARQUET, ROWS_CSV, MANIFEST):
            candidates.insert(0, p.parent)
        for c in candidates:
            if c.is_dir() and any((c / f).exists() for f in (MANIFEST, ROWS_JSONL, ROWS_PARQUET, ROWS_CSV)):
                return cls(c)
        raise StoreError(f"no run {str(run)!r} (looked for {', '.join(str(c) for c in candidates)})")

    def lock(self) -> None:
        """Exclusive advisory lock: one sweep per run directory at a time."""
        if self._lock_fd is not None:
            return
        fd = os.open(self.run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreError(f"run {self.run_id!r} is being written by another sweep "
                             f"({self.run_dir / LOCK} is locked)") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def unlock(self) -> None:
        """Release the lock and remove its file (a finished sweep leaves no .lock behind)."""
        if self._lock_fd is not None:
            try:
                (self.run_dir / LOCK).unlink(missing_ok=True)
            except OSError:
                pass
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            finally:
                os.close(self._lock_fd)
                self._lock_fd = None

    # manifest
    def manifest(self) -> dict:
        try:
            return json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}

    def write_manifest(self, manifest: dict) -> None:
        manifest = dict(manifest, updated=now_iso())
        _atomic_write_text(self.manifest_path,
                           json.dumps(manifest, indent=2, sort_keys=False, default=str) + "\n")

    def update_manifest(self, **updates: Any) -> dict:
        m = self.manifest()
        m.update(updates)
        self.write_manifest(m)
        return m

    # rows
    def repair(self) -> int:
        """Cut a torn (newline-less) last line off rows.jsonl; returns bytes removed."""
        p = self.rows_path
        if not p.exists():
            return 0
        with open(p, "rb+") as f:
            data = f.read()
            if not data or data.endswith(b"\n"):
                return 0
            keep = data.rfind(b"\n") + 1
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
            return len(data) - keep

    def append(self, row: dict) -> None:
        """Durably append one row (must have case_id and status)."""
        if not row.get("case_id"):
            raise ValueError("row without case_id")
        if row.get("status") not in STATUSES:
            raise ValueError(f"row status {row.get('status')!r}; allowed: {', '.join(STATUSES)}")
        clean = {str(k): _jsonable(v) for k, v in row.items()}
        line = json.dumps(clean, allow_nan=False) + "\n"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.rows_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)

    def raw_rows(self) -> list[dict]:
        """All parseable rows of rows.jsonl in order (a torn last line is ignored)."""
        self.bad_lines = 0
        if not self.rows_path.exists():
            return []
        out = []
        data = self.rows_path.read_bytes()
        lines = data.split(b"\n")
        torn = lines.pop()  # b'' when the file ends with a newline
        if torn.strip():
            self.bad_lines += 1
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                self.bad_lines += 1
                warnings.warn(f"{self.rows_path}: line {i + 1} is not valid JSON; ignored")
                continue
            if isinstance(row, dict) and row.get("case_id"):
                out.append(row)
        return out

    def rows(self) -> list[dict]:
        """One row per case_id (the last written wins), in first-written order."""
        if not self.rows_path.exists():
            return self._rows_from_tables()
        by_id: dict[str, dict] = {}
        for r in self.raw_rows():
            by_id[r["case_id"]] = r
        return list(by_id.values())

    def _rows_from_tables(self) -> list[dict]:
        import pandas as pd
        if self.parquet_path.exists():
            df = pd.read_parquet(self.parquet_path)
        elif self.csv_path.exists():
            df = pd.read_csv(self.csv_path)
        else:
            return []
        df = df.astype(object).where(df.notna(), None)
        return df.to_dict(orient="records")

    def done_case_ids(self, statuses: Iterable[str] = STATUSES) -> set[str]:
        st = set(statuses)
        return {r["case_id"] for r in self.rows() if r.get("status") in st}

    def dataframe(self):
        """Rows as a DataFrame: contract columns first (missing ones null), then extras."""
        return rows_to_dataframe(self.rows())

    def materialise(self) -> None:
        """(Re)write rows.parquet and rows.csv from rows.jsonl, atomically."""
        if not self.rows_path.exists():
            return
        df = self.dataframe()
        _write_tables(df, self.parquet_path, self.csv_path)

    def tables_current(self) -> bool:
        """rows.parquet and rows.csv exist and hold the case_ids of rows.jsonl (a sweep that
        stopped before its last materialise leaves them behind)."""
        import pandas as pd
        if not (self.parquet_path.exists() and self.csv_path.exists()):
            return False
        try:
            ids = pd.read_parquet(self.parquet_path, columns=["case_id"])["case_id"].tolist()
        except Exception:  # noqa: BLE001 - unreadable: rewrite it
            return False
        return ids == [r["case_id"] for r in self.rows()]

    def counts(self) -> dict:
        rows = self.rows()
        c = {s: 0 for s in STATUSES}
        for r in rows:
            c[r.get("status")] = c.get(r.get("status"), 0) + 1
        c["rows"] = len(rows)
        return c


def rows_to_dataframe(rows: list[dict]):
    import pandas as pd
    extras: list[str] = []
    seen = set(CONTRACT_COLUMNS)
    for r in rows:
        for k in r:
            if k not in seen:
                seen.add(k)
                extras.append(k)
    cols = CONTRACT_COLUMNS + extras
    df = pd.DataFrame.from_records(rows, columns=cols) if rows else pd.DataFrame(columns=cols)
    for c in FLOAT_CONTRACT:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    for c in INT_CONTRACT:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    return df


def _write_tables(df, parquet_path: Path, csv_path: Path) -> None:
    import pyarrow as pa
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object:
            vals = [v for v in out[c] if v is not None and not (isinstance(v, float) and math.isnan(v))]
            kinds = {type(v) for v in vals}
            if len(kinds) > 1 and not kinds <= {int, float}:
                out[c] = [None if v is None else str(v) for v in out[c]]
    tmp = parquet_path.with_name(parquet_path.name + ".tmp")
    try:
        out.to_parquet(tmp, index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        out = out.astype({c: "string" for c in out.columns if out[c].dtype == object})
        out.to_parquet(tmp, index=False)
    os.replace(tmp, parquet_path)
    tmp = csv_path.with_name(csv_path.name + ".tmp")
    df.to_csv(tmp, index=False)
    os.replace(tmp, csv_path)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_run(run: str | Path, results_dir: str | Path = "results") -> tuple[dict, "object"]:
    """(manifest, rows DataFrame) of an existing run (id or path)."""
    store = RunStore.open(run, results_dir)
    return store.manifest(), store.dataframe()


__all__ = ["CONTRACT_COLUMNS", "STATUSES", "RunStore", "StoreError", "default_run_id",
           "fresh_run_id", "git_info", "read_run", "rows_to_dataframe", "now_iso",
           "validate_run_id"]
