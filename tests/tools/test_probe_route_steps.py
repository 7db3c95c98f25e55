"""tools/probe_route_steps.py --summarise on a hand-made Nsight Compute CSV (--csv --print-units base)."""
import os
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "probe_route_steps.py"
HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def row(i, kernel, ns, metric="gpu__time_duration.sum", unit="nsecond"):
    return (f'"{i}","1","python3","127.0.0.1","{kernel}(int *, float *)","1","7","(32, 1, 1)","(32, 32, 1)","0",'
            f'"9.0","Command line profiler metrics","{metric}","{unit}","{ns:,}"\n')


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


def test_dram_bytes_per_step_in_mb(tmp_path):
    # the DRAM metrics (session 32) summarised per step beside the durations: 2 layers x 2 steps,
    # the first step writing 4 MB a launch, the second none (its write-backs land elsewhere)
    text = HEAD
    for i, (ns, rd, wr) in enumerate([(4100, 4194304, 4194304), (4120, 4194304, 4194304),
                                      (3600, 4194304, 0), (3640, 4194304, 0)]):
        text += row(i, "_replay_defer_kernel", ns)
        text += row(i, "_replay_defer_kernel", rd, "dram__bytes_read.sum", "byte")
        text += row(i, "_replay_defer_kernel", wr, "dram__bytes_write.sum", "byte")
    text += row(9, "_replay_defer_kernel", 5, "sm__cycles_elapsed.avg", "cycle")     # other metrics: left out
    path = tmp_path / "ncu.csv"
    path.write_text(text)
    r = subprocess.run([sys.executable, str(TOOL), "--summarise", str(path), "--layers", "2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert [ln.split("launches")[1].split(":")[0].split(None, 1)[1] for ln in lines] == \
        ["us per step", "MB read per step", "MB written per step"]
    assert lines[0].split(":")[1].split() == ["4.11", "3.62"]
    assert lines[1].split(":")[1].split() == ["4.19", "4.19"]
    assert lines[2].split(":")[1].split() == ["4.19", "0.00"]


def test_needs_a_case_or_a_csv():
    r = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True)
    assert r.returncode == 2 and "MODEL METHOD BATCH" in r.stderr


def test_script_names_its_lists(tmp_path):
    # the shell wrapper: an unknown list is refused before anything is profiled, naming the lists
    r = subprocess.run(["bash", str(TOOL.with_suffix(".sh")), "m2nostor"], capture_output=True, text=True,
                       env={**os.environ, "OUT": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert "unknown list 'm2nostor'" in r.stderr and "gdn, mamba2, m2nostore" in r.stderr
    assert list((tmp_path / "ncu_steps").iterdir()) == []
