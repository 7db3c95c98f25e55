"""tools/graph_profile.py's bookkeeping on hand-made kernel intervals (the profiling itself needs a GPU)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import graph_profile as gp  # noqa: E402


def test_busy_union_counts_overlap_once():
    # a programmatic dependent launch starts before the kernel ahead ends: 0-10 and 8-12 overlap
    iv = [("verify", 0.0, 10.0), ("cursor", 8.0, 12.0), ("fold", 15.0, 20.0)]
    assert gp.busy_union(iv) == pytest.approx(17.0)
    assert gp.busy_union([]) == 0.0


def test_summarize_per_unit():
    iv = [("a", 0.0, 4.0), ("b", 5.0, 6.0), ("a", 10.0, 12.0), ("b", 12.5, 13.0)]
    s = gp.summarize(iv, units=2)
    assert s["kernels"]["a"] == {"per_unit": 1.0, "mean_us": 3.0, "median_us": 3.0, "us_per_unit": 3.0}
    assert s["kernels"]["b"]["us_per_unit"] == pytest.approx(0.75)
    assert s["span_us"] == pytest.approx(6.5)       # 0 .. 13 over 2 units
    assert s["sum_us"] == pytest.approx(3.75)
    assert s["busy_us"] == pytest.approx(3.75)
