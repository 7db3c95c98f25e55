"""Synthetic runs for the report tests: a manifest and rows stored as a sweep stores them."""
from __future__ import annotations

from replaybench.store import RunStore


def syn_manifest(run_id: str, device: dict, created: str = "2026-11-30T00:00:00+00:00") -> dict:
    """The manifest of a synthetic kernel-runner run of scenario 'syn' on `device`."""
    return {"run_id": run_id, "created": created,
            "scenario": {"name": "syn", "path": "syn.toml", "sha256": "f" * 64, "runner": "kernel"},
            "device": device, "versions": {}, "git": {"sha": "deadbeef", "dirty": False}}


def store_run(tmp_path, run_id: str, manifest: dict, rows) -> RunStore:
    """results/<run_id> under tmp_path holding `rows` (appended in order), unlocked."""
    st = RunStore.create_or_resume(tmp_path / "results", run_id, manifest)
    for r in rows:
        st.append(r)
    st.unlock()
    return st
