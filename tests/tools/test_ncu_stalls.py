"""tools/ncu_stalls.py on a hand-made Nsight Compute source page (two kernels, one gzip'd copy)."""
import gzip
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "ncu_stalls.py"
PAGE = '''"Kernel Name","_a_kernel",
"Address","Source","Warp Stall Sampling (All Samples)","stall_long_sb","stall_barrier","stall_long_sb (Not Issued)"
"0","  LDG.E R1, [R2]","10","2","8","2"
"1","  FMUL R3, R1, R1","30","30","0","30"
"Kernel Name","_b_kernel",
"Address","Source","Warp Stall Sampling (All Samples)","stall_long_sb","stall_barrier","stall_long_sb (Not Issued)"
"0","  BAR.SYNC 0","5","0","5","0"
'''


def run(path, *extra):
    return subprocess.run([sys.executable, str(TOOL), str(path), *extra], capture_output=True, text=True)


@pytest.mark.parametrize("gz", [False, True], ids=["csv", "csv.gz"])
def test_shares_by_reason_and_hottest_instruction(tmp_path, gz):
    path = tmp_path / ("page.csv.gz" if gz else "page.csv")
    (gzip.open(path, "wt") if gz else open(path, "w")).write(PAGE)
    r = run(path, "--top", "1")
    assert r.returncode == 0, r.stderr
    a, b = r.stdout.split("# _b_kernel")
    assert "_a_kernel: 2 SASS instructions, 40 stall samples" in a
    assert "stall_long_sb           80.0 %" in a and "stall_barrier           20.0 %" in a
    assert "75.0  FMUL R3, R1, R1" in a and "LDG" not in a       # top 1 only; Not Issued column ignored
    assert "stall_barrier          100.0 %" in b


def test_a_page_without_stall_samples_is_refused(tmp_path):
    path = tmp_path / "details.csv"
    path.write_text('"Kernel Name","_a_kernel",\n"Address","Source"\n"0","NOP"\n')
    r = run(path)
    assert r.returncode != 0 and "SourceCounters" in r.stderr
    r = run(tmp_path / "missing.csv")
    assert r.returncode != 0 and "missing.csv" in r.stderr
