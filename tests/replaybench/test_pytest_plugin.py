"""The gpu_benchmark fixture on a machine without CUDA: a clean skip with the reason."""
import subprocess
import sys

import pytest

from conftest import REPO, subprocess_env
from replaybench import pytest_plugin

TEST = '''
def test_kernel(gpu_benchmark):
    raise AssertionError("the body of a GPU benchmark must not run without CUDA")
'''


@pytest.mark.skipif(pytest_plugin._cuda_available(), reason="this test is about machines without CUDA")
def test_skips_without_cuda_and_registers_once(tmp_path):
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "bench" / "conftest.py").read_text())
    (tmp_path / "test_k.py").write_text(TEST)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
                       cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 skipped" in r.stdout and pytest_plugin.SKIP_REASON in r.stdout
    assert "Benchmark fixture was not used" not in r.stdout


def test_machine_info_without_gpu_adds_nothing():
    if pytest_plugin._cuda_available():
        pytest.skip("a GPU is present")
    info = {"node": "x"}
    pytest_plugin.pytest_benchmark_update_machine_info(None, info)
    assert info == {"node": "x"} and pytest_plugin.gpu_facts() == {}
