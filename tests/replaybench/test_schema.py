"""The row schema (replaybench.schema) is the one source of the columns."""
from pathlib import Path

from replaybench import report, schema, store, sweep
from replaybench.schema import CONTRACT_COLUMNS, COLUMNS, main

ROOT = Path(__file__).resolve().parents[2]


def test_contracts_doc_holds_the_generated_column_table():
    doc = ROOT / "docs" / "CONTRACTS.md"
    assert schema.render(doc.read_text(encoding="utf-8")) == doc.read_text(encoding="utf-8"), (
        "docs/CONTRACTS.md's column table is stale: python -m replaybench.schema --write docs/CONTRACTS.md")


def test_store_sweep_and_report_take_their_columns_from_the_schema():
    assert store.CONTRACT_COLUMNS is schema.CONTRACT_COLUMNS
    assert sweep.IDENTITY_COLUMNS is schema.IDENTITY_COLUMNS
    assert report.TABLE_COLUMNS is schema.TABLE_COLUMNS
    assert CONTRACT_COLUMNS[:2] == ["run_id", "case_id"] and CONTRACT_COLUMNS[-2:] == ["status", "error"]


def test_columns_are_unique_typed_and_described():
    names = [c.name for c in COLUMNS]
    assert len(names) == len(set(names))
    for c in COLUMNS:
        assert c.dtype in schema.DTYPES and c.owner in schema.OWNERS and c.meaning


def test_a_row_has_every_contract_column_and_its_extras_are_in_the_schema():
    from replaybench.scenario import Case
    case = Case(case_id="m/eager/triton/b1", runner="kernel", model="tiny-mamba2", op="mamba2", method="eager",
                backend="triton", batch=1, buffer_len=0, flush_period=0, spec_window=0, state_dtype="float32",
                lo_dtype="none", device="cpu")
    row = sweep.make_row(case, {"median_us": 2.0, "bytes_model": 4000.0}, run_id="r", device_label="cpu",
                         ceilings={"copy_gbps": 4.0}, wall_s=0.1, session=0)
    assert set(CONTRACT_COLUMNS) <= set(row)
    assert set(row) <= set(schema.BY_NAME)
    assert row["gbps"] == 2.0 and row["pct_copy_bw"] == 50.0


def test_check_mode_reports_a_stale_file(tmp_path, capsys):
    f = tmp_path / "doc.md"
    f.write_text(f"x\n{schema.START}\nold\n{schema.END}\ny\n", encoding="utf-8")
    assert main(["--check", str(f)]) == 1
    assert main(["--write", str(f)]) == 0 and main(["--check", str(f)]) == 0
    assert f.read_text(encoding="utf-8").startswith("x\n") and f.read_text(encoding="utf-8").endswith("y\n")
    (tmp_path / "none.md").write_text("no markers", encoding="utf-8")
    assert main(["--check", str(tmp_path / "none.md")]) == 2
    assert "no generated-block markers" in capsys.readouterr().err


def test_every_timing_column_is_in_the_schema():
    from replaybench.timing import Timing
    t = Timing(median_us=1.0, iqr_us=0.1, samples=3, discarded=0, mean_us=1.0, min_us=0.9, raw_us=[1.0, 0.9, 1.1])
    assert set(t.columns()) <= set(schema.BY_NAME)


def test_the_copy_ceiling_percentage_has_one_definition():
    from replaybench.hardware import achieved_gbps, pct_of_copy
    assert achieved_gbps(4000.0, 2.0) == 2.0 and achieved_gbps(1.0, 0) is None and achieved_gbps(None, 1) is None
    assert pct_of_copy(2.0, {"copy_gbps": 4.0}) == 50.0
    assert pct_of_copy(2.0, {}) is None and pct_of_copy(None, {"copy_gbps": 4.0}) is None


def test_readme_names_the_contract_columns_in_order():
    import re
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    spans = [s for s in re.findall(r"`([a-z_]+(?:,\s*[a-z_]+)+)`", text, flags=re.S)
             if s.startswith(("run_id,", "median_us,"))]
    if len(spans) != 2:
        import pytest
        pytest.skip("README.md does not list the row columns as two `run_id, ...` / `median_us, ...` spans")
    listed = [c.strip() for s in spans for c in s.split(",")]
    assert listed == CONTRACT_COLUMNS, "README.md's column list differs from replaybench.schema.CONTRACT_COLUMNS"
