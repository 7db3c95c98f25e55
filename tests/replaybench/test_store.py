import json

import pandas as pd
import pytest

from replaybench.store import (CONTRACT_COLUMNS, RunStore, StoreError, default_run_id,
                               fresh_run_id, validate_run_id)


def manifest(sha="abc"):
    return {"scenario": {"name": "t", "sha256": sha}, "created": "then", "ceilings": {"copy_gbps": 1.0},
            "sessions": [{"pid": 1}]}


def row(cid, status="ok", **kw):
    r = {"case_id": cid, "status": status, "median_us": 1.5, "method": "eager"}
    r.update(kw)
    return r


def test_append_read_and_materialise(tmp_path):
    st = RunStore.create_or_resume(tmp_path, "run1", manifest())
    st.append(row("a", extra_metric=3))
    st.append(row("b", status="error", median_us=None, error="RuntimeError: boom"))
    st.append(row("c", status="skipped", error="n/a"))
    lines = st.rows_path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["case_id"] == "a"
    assert st.done_case_ids() == {"a", "b", "c"}
    assert st.done_case_ids(("ok",)) == {"a"}
    st.materialise()
    pq = pd.read_parquet(st.parquet_path)
    csv = pd.read_csv(st.csv_path)
    assert list(pq.columns[: len(CONTRACT_COLUMNS)]) == CONTRACT_COLUMNS
    assert "extra_metric" in pq.columns and list(pq["case_id"]) == ["a", "b", "c"]
    assert pq["extra_metric"].isna().tolist() == [False, True, True]   # missing -> null
    assert pq["run_id"].isna().all()                                   # contract column absent -> null
    assert list(csv.columns) == list(pq.columns)
    assert st.counts() == {"ok": 1, "error": 1, "skipped": 1, "rows": 3}
    st.unlock()


def test_append_validates(tmp_path):
    st = RunStore(tmp_path / "r")
    with pytest.raises(ValueError):
        st.append({"status": "ok"})
    with pytest.raises(ValueError):
        st.append({"case_id": "x", "status": "fine"})


def test_values_are_made_json_safe(tmp_path):
    import numpy as np
    import torch
    st = RunStore(tmp_path / "r")
    st.append(row("a", np_val=np.float32(2.5), t_val=torch.tensor(3.0), nan=float("nan"),
                  lst=[1, 2], obj=object))
    (r,) = st.rows()
    assert r["np_val"] == 2.5 and r["t_val"] == 3.0 and r["nan"] is None and r["lst"] == "[1, 2]"
    assert isinstance(r["obj"], str)


def test_mixed_type_extra_column_still_writes_parquet(tmp_path):
    st = RunStore(tmp_path / "r")
    st.append(row("a", note=1.5))
    st.append(row("b", note="text"))
    st.materialise()
    assert pd.read_parquet(st.parquet_path)["note"].tolist() == ["1.5", "text"]


def test_torn_last_line_ignored_and_repaired(tmp_path):
    st = RunStore.create_or_resume(tmp_path, "run1", manifest())
    st.append(row("a"))
    st.append(row("b"))
    st.unlock()
    with open(st.rows_path, "ab") as f:          # killed mid-write
        f.write(b'{"case_id": "c", "status": "o')
    st2 = RunStore(st.run_dir)
    assert [r["case_id"] for r in st2.rows()] == ["a", "b"]
    assert st2.done_case_ids() == {"a", "b"} and st2.bad_lines == 1
    # resuming cuts the torn line before appending, so the next row is intact
    st3 = RunStore.create_or_resume(tmp_path, "run1", manifest())
    st3.append(row("c"))
    assert [r["case_id"] for r in st3.rows()] == ["a", "b", "c"]
    assert st3.rows_path.read_bytes().count(b"\n") == 3
    st3.unlock()


def test_duplicate_case_last_row_wins(tmp_path):
    st = RunStore(tmp_path / "r")
    st.append(row("a", status="error", error="x"))
    st.append(row("b"))
    st.append(row("a", median_us=9.0))
    rows = st.rows()
    assert [r["case_id"] for r in rows] == ["a", "b"]
    assert rows[0]["status"] == "ok" and rows[0]["median_us"] == 9.0
    assert len(st.dataframe()) == 2


def test_resume_keeps_created_and_ceilings_and_checks_sha(tmp_path):
    st = RunStore.create_or_resume(tmp_path, "run1", manifest())
    st.unlock()
    m2 = dict(manifest(), created="now", ceilings={"copy_gbps": 99.0}, sessions=[{"pid": 2}])
    st2 = RunStore.create_or_resume(tmp_path, "run1", m2)
    m = st2.manifest()
    assert m["created"] == "then" and m["ceilings"] == {"copy_gbps": 1.0}
    assert [s["pid"] for s in m["sessions"]] == [1, 2] and m["resumed"] is True
    st2.unlock()
    with pytest.raises(StoreError) as e:
        RunStore.create_or_resume(tmp_path, "run1", manifest(sha="other"))
    assert "--new" in str(e.value)


def test_lock_prevents_two_writers(tmp_path):
    st = RunStore.create_or_resume(tmp_path, "run1", manifest())
    with pytest.raises(StoreError) as e:
        RunStore.create_or_resume(tmp_path, "run1", manifest())
    assert "another sweep" in str(e.value)
    st.unlock()
    RunStore.create_or_resume(tmp_path, "run1", manifest()).unlock()


def test_open_by_id_path_or_file(tmp_path):
    st = RunStore.create_or_resume(tmp_path / "results", "run1", manifest())
    st.append(row("a"))
    st.unlock()
    assert RunStore.open("run1", tmp_path / "results").run_dir == st.run_dir
    assert RunStore.open(st.run_dir).run_dir == st.run_dir
    assert RunStore.open(st.rows_path).run_dir == st.run_dir
    with pytest.raises(StoreError):
        RunStore.open("nope", tmp_path / "results")


def test_rows_from_parquet_when_no_jsonl(tmp_path):
    st = RunStore(tmp_path / "r")
    st.append(row("a"))
    st.materialise()
    st.rows_path.unlink()
    assert [r["case_id"] for r in RunStore(st.run_dir).rows()] == ["a"]


def test_run_ids():
    a = default_run_id("smoke", "sha1", "NVIDIA H200", "nvidia-h200")
    assert a == default_run_id("smoke", "sha1", "NVIDIA H200", "nvidia-h200")
    assert a.startswith("smoke-nvidia-h200-") and len(a.split("-")[-1]) == 8
    assert a != default_run_id("smoke", "sha2", "NVIDIA H200", "nvidia-h200")
    assert a != default_run_id("smoke", "sha1", "NVIDIA H100", "nvidia-h200")
    f = fresh_run_id("smoke", "sha1", "NVIDIA H200", "nvidia-h200")
    assert f.startswith(a + "-") and f != a
    assert validate_run_id("ok.id-1") == "ok.id-1"
    for bad in ("../x", "a/b", "", ".hidden"):
        with pytest.raises(StoreError):
            validate_run_id(bad)


def test_git_sha_from_environment_wins_over_a_stale_checkout(tmp_path, monkeypatch):
    # the GPU machine's copy of the tree may carry an old .git: the sha written by
    # tools/git_sha.sh on the real checkout must be what the manifest records
    from replaybench.store import git_info
    monkeypatch.setenv("REPLAYBENCH_GIT_SHA", "abc123 dirty")
    assert git_info() == {"sha": "abc123", "dirty": True, "branch": None, "source": "REPLAYBENCH_GIT_SHA"}
    monkeypatch.setenv("REPLAYBENCH_GIT_SHA", "def456 clean")
    assert git_info()["dirty"] is False
    monkeypatch.delenv("REPLAYBENCH_GIT_SHA")
    assert git_info().get("source") is None


def test_tables_current_tracks_the_jsonl(tmp_path):
    # report regeneration rewrites the tables only when they lag rows.jsonl
    s = RunStore.create_or_resume(tmp_path, "r", manifest())
    s.append(row("a"))
    assert not s.tables_current()
    s.materialise()
    assert s.tables_current()
    s.append(row("b"))
    assert not s.tables_current()
    s.materialise()
    assert s.tables_current()
    s.unlock()
