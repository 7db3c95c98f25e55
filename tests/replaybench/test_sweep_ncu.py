"""The --ncu hook: measured DRAM bytes join the row; profiler failures do not fail the case."""
import dataclasses

from replaybench import ncu, sweep
from replaybench.scenario import Case

CASE = Case(case_id="m/replay/triton/b4/L16/K16/T0/float32/none", runner="kernel", model="tiny-mamba2",
            op="mamba2", method="replay", backend="triton", batch=4, buffer_len=16, flush_period=16,
            spec_window=0, state_dtype="float32", lo_dtype="none", device="cuda")


def test_columns_added_with_ratio(monkeypatch):
    monkeypatch.setattr(ncu, "measure_dram", lambda case: {"dram_read_bytes": 900.0, "dram_write_bytes": 300.0,
                                                            "dram_bytes": 1200.0, "ncu_kernels_per_step": 2.0})
    cols = sweep._ncu_columns(CASE, {"bytes_model": 1000.0})
    assert cols["dram_vs_model"] == 1.2 and cols["dram_bytes"] == 1200.0


def test_profiler_failure_is_recorded(monkeypatch):
    def boom(case):
        raise RuntimeError("ncu not found")
    monkeypatch.setattr(ncu, "measure_dram", boom)
    assert sweep._ncu_columns(CASE, {"bytes_model": 1.0}) == {"ncu_error": "RuntimeError: ncu not found"}


def test_not_for_cpu_or_reference():
    assert sweep._ncu_columns(dataclasses.replace(CASE, device="cpu"), {}) == {}
    assert sweep._ncu_columns(dataclasses.replace(CASE, backend="reference"), {}) == {}
