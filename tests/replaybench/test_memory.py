"""SSM-state memory per request / max concurrency (replaybench.memory) and the `memory` CLI
subcommand."""
import pytest

from replaybench import memory as MEM
from replaybench.cli import main
from replaybench.models import get_model
from replayssm.state import GDNReplayState, Mamba2ReplayState

MiB = 1 << 20


def test_nano4b_by_hand():
    nano = get_model("nemotron-3-nano-4b")          # 21 Mamba-2 layers, 96 heads x 80 x 128
    assert MEM.bytes_per_request(nano, "eager") == 78.75 * MiB                    # 3.75 MiB x 21
    assert MEM.bytes_per_request(nano, "spec-perdraft", spec_window=4) == 5 * 78.75 * MiB
    row = 96 * 80 * 2 + 8 * 128 * 2 + 96 * 4                                      # x + B (bf16) + dt (fp32)
    assert row == 17792
    replay = 21 * (3.75 * MiB + 20 * row)                                          # 85.88 MiB
    assert MEM.bytes_per_request(nano, "spec-replay", buffer_len=20) == replay
    dual = 21 * (3.75 * MiB + 1.875 * MiB + 20 * row)                              # fp32 + bf16 copies
    assert MEM.bytes_per_request(nano, "spec-replay-dual", buffer_len=20) == dual
    rows = {r.method: r for r in MEM.memory_table(["nemotron-3-nano-4b"], 80, 4, 20, 16)}
    assert rows["eager"].max_batch == int(80e9 // (78.75 * MiB)) == 968
    assert rows["spec-perdraft"].max_batch == 193
    assert rows["spec-replay"].max_batch == int(80e9 // replay) == 888
    assert rows["spec-replay"].vs_perdraft == pytest.approx(5 * 78.75 * MiB / replay)   # ~4.6x
    assert rows["spec-perdraft"].vs_perdraft == 1.0


def test_qwen122b_gdn_by_hand():
    q = get_model("qwen3.5-122b-a10b")              # 36 GDN layers, 16 k / 64 v heads, 128 x 128
    row = 64 * 128 * 4 + 16 * 128 * 2 + 64 * 4                                     # u fp32 + k bf16 + g
    assert MEM.bytes_per_request(q, "eager") == 144 * MiB
    assert MEM.bytes_per_request(q, "spec-replay", buffer_len=22) == 36 * (4 * MiB + 22 * row)
    dual_row = row + 64 * 128 * 2 + 64 * 4                                         # + raw v, beta
    assert MEM.bytes_per_request(q, "spec-replay-dual", buffer_len=20, lo_dtype="float8_e4m3") == \
        36 * (4 * MiB + 1 * MiB + 64 * 128 * 4 + 20 * dual_row)                    # fp8 copy + row scales


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("mode", ["replay", "dual"])
def test_matches_allocated_state(family, mode):
    """The table counts what ReplaySSM state really allocates per slot (checkpoints + buffer)."""
    L, K = 9, 6
    if family == "mamba2":
        model = get_model("tiny-mamba2")
        d = model.ssm
        rs = Mamba2ReplayState.allocate(1, d.nheads, d.head_dim, d.d_state, d.n_groups, L, K, mode,
                                        lo_dtype="bfloat16" if mode == "dual" else None, device="meta")
    else:
        model = get_model("tiny-gdn")
        d = model.ssm
        rs = GDNReplayState.allocate(1, d.num_k_heads, d.num_v_heads, d.head_k_dim, d.head_v_dim, L, K, mode,
                                     lo_dtype="bfloat16" if mode == "dual" else None, device="meta")
    method = "spec-replay" if mode == "replay" else "spec-replay-dual"
    st, buf, _ = MEM.layer_memory(model, method, 3, L)
    assert st == rs.state_bytes_per_slot() and buf == rs.buffer_bytes_per_slot()
    pd, _, _ = MEM.layer_memory(model, "spec-perdraft", 3, L)
    assert pd == 4 * rs.hi.data[0].numel() * 4


def test_validation():
    with pytest.raises(ValueError, match="L >= K \\+ T"):
        MEM.memory_table(budget_gb=80, spec_window=4, buffer_len=18, flush_period=16)
    with pytest.raises(ValueError, match="budget"):
        MEM.memory_table(budget_gb=0)
    with pytest.raises(ValueError, match="unknown method"):
        MEM.layer_memory(get_model("tiny-gdn"), "eagerly")


def test_cli_memory(capsys):
    assert main(["memory", "--budget-gb", "40", "--spec-window", "2", "--buffer-len", "18",
                 "--flush-period", "16"]) == 0
    out = capsys.readouterr().out
    assert "budget 40 GB" in out and "excluded" in out and "KV cache" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("nemotron-3-nano-4b") and " eager " in ln)
    assert "78.75" in line and str(int(40e9 // (78.75 * MiB))) in line
    assert all(m in out for m in ("qwen3.5-4b", "qwen3.5-122b-a10b", "nemotron-3-super-120b-a12b"))
    assert main(["memory", "qwen3.5-4b"]) == 0
    assert "nemotron" not in capsys.readouterr().out
    assert main(["memory", "--buffer-len", "10"]) == 2
    assert "L >= K + T" in capsys.readouterr().err
    assert main(["memory", "no-such-model"]) == 2
