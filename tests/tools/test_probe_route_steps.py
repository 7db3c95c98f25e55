"""tools/probe_route_steps.py --summarise on a hand-made Nsight Compute CSV (--csv --print-units base)."""
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "probe_route_steps.py"
HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def row(i, kernel, ns):
    return (f'"{i}","1","python3","127.0.0.1","{kernel}(int *, float *)","1","7","(32, 1, 1)","(32, 32, 1)","0",'
            f'"9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","{ns:,}"\n')


def test_median_per_step_of_each_kernel(tmp_path):
    # 2 layers x 3 steps of a deferred route (writing and appending steps alternate), 1 step of
    # another kernel; ncu's own lines ahead of the table are skipped
    durations = [4100, 4120, 3600, 3640, 4080, 4060]
    text = "==PROF== Connected to process 1\n" + HEAD
    text += "".join(row(i, "_gdn_route_defer_kernel", ns) for i, ns in enumerate(durations))
    text += row(6, "_other_kernel", 1500) + row(7, "_other_kernel", 1700)
    path = tmp_path / "ncu.csv"
    path.write_text(text)
    r = subprocess.run([sys.executable, str(TOOL), "--summarise", str(path), "--layers", "2", "--label", "q4b-b1"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2
    defer = next(ln for ln in lines if "_gdn_route_defer_kernel" in ln)
    assert defer.startswith("q4b-b1") and "launches    6" in defer
    assert defer.split("us per step:")[1].split() == ["4.11", "3.62", "4.07"]
    other = next(ln for ln in lines if "_other_kernel" in ln)
    assert other.split("us per step:")[1].split() == ["1.60"]


def test_needs_a_case_or_a_csv():
    r = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True)
    assert r.returncode == 2 and "MODEL METHOD BATCH" in r.stderr
