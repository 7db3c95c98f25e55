"""replaybench.runners.kernel: the output check against the reference."""
import pytest

from replaybench.models import get_model
from replaybench.runners.kernel import check_against_reference
from replaybench.scenario import Case


@pytest.mark.parametrize("model,method,lo", [("tiny-mamba2", "replay", "none"), ("tiny-gdn", "replay", "none"),
                                             ("tiny-gdn", "replay-dual", "bfloat16")])
@pytest.mark.parametrize("batch", [1, 5])
def test_check_passes_on_every_route(model, method, lo, batch):
    # the check runs min(batch, 8) rows; 5 (one padded) take the routes 8 take (GDN: every 2nd
    # step, dual every step; Mamba-2 buffered) at 5/8 of the interpreter time. The kernel's
    # routes flush while the reference buffers; the outputs agree as long as the layer's
    # parameters stay fixed across steps (a Mamba-2 buffer decays its entries with the A it is
    # given) and, in GDN's dual mode, the random buffered u agree with the v, beta a flush
    # recomputes them from
    m = get_model(model)
    c = Case("c", "kernel", m.name, m.op, method, "triton", batch, 8, 8, 0, "float32", lo)
    assert check_against_reference(c, m, "cpu", steps=10) < (1e-4 if lo == "none" else 1e-2)   # crosses a flush


@pytest.mark.parametrize("method", ["eager", "replay"])
def test_workload_is_one_flush_period_over_the_layers(method):
    # the timed sample (also what tools/graph_profile.py profiles): K steps of every layer;
    # staggered cursors come back to where they started after a whole flush period
    import torch

    from replaybench.runners.kernel import workload
    m = get_model("tiny-gdn")
    L = 16 if method == "replay" else 0
    c = Case("c", "kernel", m.name, m.op, method, "reference", 5, L, L, 0, "float32", "none")
    sample, steps, layers = workload(c, m, "cpu")
    assert (steps, layers) == ((16, 1) if method == "replay" else (1, 1))
    if method == "replay":
        import replayssm.reference as R
        calls = []
        orig = R.gdn_replay_step
        try:
            R.gdn_replay_step = lambda rs, **kw: calls.append(rs.cursor.clone()) or orig(rs, **kw)
            sample()
        finally:
            R.gdn_replay_step = orig
        assert len(calls) == 16
        assert torch.equal(calls[0], torch.arange(5, dtype=torch.int32) % 16)
        assert [int(c[0]) for c in calls] == list(range(16))     # row 0 walks its whole period
    else:
        sample()


@pytest.mark.parametrize("period,layers,steps", [(0, 1, 16), (0, 2, 16), (0, 64, 16), (16, 1, 16), (16, 64, 16),
                                                 (8, 1, 16), (8, 4, 16), (5, 1, 20), (5, 64, 20), (32, 1, 32)])
def test_a_gpu_sample_holds_the_same_steps_for_every_method_in_whole_flush_periods(period, layers, steps):
    # every method's sample covers the same steps, in whole flush periods, at least SAMPLE_STEPS
    from replaybench.runners.common import SAMPLE_STEPS, steps_per_sample
    got = steps_per_sample(period, layers, "cuda")
    assert got == steps
    assert got % max(period, 1) == 0 and got >= SAMPLE_STEPS
    assert steps_per_sample(period, layers, "cpu") == max(period, 1)     # the CPU keeps one period


@pytest.mark.parametrize("model,method,batch,want", [("tiny-gdn", "replay", 1, 1), ("tiny-gdn", "replay", 8, 2),
                                                     ("tiny-gdn", "replay-dual", 8, 1), ("tiny-gdn", "replay", 32, 0),
                                                     ("tiny-gdn", "eager", 1, None), ("tiny-mamba2", "replay", 1, 2),
                                                     ("tiny-mamba2", "replay-dual", 1, 1),
                                                     ("tiny-mamba2", "replay", 8, 0)])
def test_a_row_records_the_route_its_replay_step_took(model, method, batch, want, monkeypatch):
    # the small-batch routes (GDN fp32 reads: every step to batch 4, every other step to 16;
    # dual states every step; buffered above; Mamba-2 at head dims not a multiple of 32, fp32:
    # every other step to batch 4, dual every step to batch 2): a batch-1 replay row is an eager-shaped step, and
    # the report says so (report.route_label). The check and the timing are stubbed: this is
    # about the row
    from replaybench.runners import kernel as kernel_runner
    from replaybench.runners import RunContext
    from replaybench.scenario import TimingConfig
    m = get_model(model)
    lo = "bfloat16" if method == "replay-dual" else "none"
    kk = 16 if method.startswith("replay") else 0
    c = Case("c", "kernel", m.name, m.op, method, "triton", batch, kk, kk, 0, "float32", lo)
    monkeypatch.setattr(kernel_runner, "check_against_reference", lambda *a, **k: 0.0)
    monkeypatch.setattr(kernel_runner, "workload", lambda *a, **k: ((lambda: None), 1, 1))
    ctx = RunContext(device="cpu", timing=TimingConfig(warmup=0, min_samples=1, max_samples=1, max_time_s=0.01,
                                                       rel_iqr=1.0))
    row = kernel_runner.run(c, ctx)
    assert row["route_period"] == want
