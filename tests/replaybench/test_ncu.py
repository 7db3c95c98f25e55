"""Parsing of Nsight Compute CSV output (the GPU run itself is exercised on the device)."""
import pytest

from replaybench.ncu import parse_ncu_csv

SAMPLE = '''==PROF== Connected to process 123
==PROF== Profiling "k1": 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","python3","127.0.0.1","replay_kernel","1","7","(128, 1, 1)","(256, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","1,048,576"
"0","123","python3","127.0.0.1","replay_kernel","1","7","(128, 1, 1)","(256, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","4096"
"1","123","python3","127.0.0.1","replay_kernel","1","7","(128, 1, 1)","(256, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Kbyte","2"
"1","123","python3","127.0.0.1","replay_kernel","1","7","(128, 1, 1)","(256, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","0"
'''


def test_sums_metrics_over_kernels_with_units():
    t = parse_ncu_csv(SAMPLE)
    assert t["dram__bytes_read.sum"] == 1048576 + 2000
    assert t["dram__bytes_write.sum"] == 4096
    assert t["kernels"] == 2


def test_no_table_is_an_error():
    with pytest.raises(RuntimeError, match="no metric table"):
        parse_ncu_csv("==PROF== nothing profiled\n")
