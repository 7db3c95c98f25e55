"""Traffic model: hand-computed cases, and agreement with the reference's byte accounting."""
import pytest
import torch

from replaybench import traffic as T
from replaybench.models import get_model
from replayssm import reference as R
from replayssm.inputs import GDNShape, Mamba2Shape, gdn_step_inputs, mamba2_params, mamba2_step_inputs
from replayssm.state import ByteCounter, GDNReplayState, Mamba2ReplayState

MiB = 1 << 20


def test_mamba2_super120b_by_hand():
    # Nemotron-3-Super-120B: 128 heads x 64, state 128, 8 groups; fp32 state, bf16 activations, gated
    sup = get_model("nemotron-3-super-120b-a12b").ssm
    lb = T.layer_bytes_for("mamba2", sup, "eager", "float32", "none")
    assert lb.state_hi == 4 * MiB
    io_in = 128 * 64 * 2 + 128 * 4 + 2 * 8 * 128 * 2 + 128 * 64 * 2      # x, dt, B+C, z = 37376
    assert lb.io_in == io_in == 37376 and lb.io_out == 16384
    eager = T.eager_traffic(lb, batch=1)
    assert eager.total_bytes == 2 * 4 * MiB + 37376 + 16384            # 8442368
    rl = T.layer_bytes_for("mamba2", sup, "replay", "float32", "none")
    assert rl.row == 128 * 64 * 2 + 8 * 128 * 2 + 128 * 4                 # x + B + dt = 18944
    rep = T.replay_traffic(rl, batch=1, flush_period=16)
    # read: state once per step + buffer rows 0..15 on average 7.5; write: state once per 16 steps
    expect = 4 * MiB + 4 * MiB / 16 + 18944 * 7.5 + 18944 * 15 / 16 + 37376 + 16384
    assert rep.total_bytes == pytest.approx(expect) == pytest.approx(4670048)
    assert T.speedup_ceiling(eager, rep) == pytest.approx(1.8078, abs=1e-4)


def test_gdn_qwen122b_by_hand():
    # Qwen3.5-122B-A10B: 16 key heads, 64 value heads, dk = dv = 128
    q122 = get_model("qwen3.5-122b-a10b").ssm
    lb = T.layer_bytes_for("gdn", q122, "eager", "float32", "none")
    assert lb.state_hi == 4 * MiB
    assert lb.io_in == 2 * 16 * 128 * 2 + 64 * 128 * 2 + 2 * 64 * 4 == 25088
    rl = T.layer_bytes_for("gdn", q122, "replay", "float32", "none")
    assert rl.row == 64 * 128 * 4 + 16 * 128 * 2 + 64 * 4 == 37120       # u fp32 + raw k + g
    rep = T.replay_traffic(rl, batch=256, flush_period=16)
    per_seq = 4 * MiB * (1 + 1 / 16) + 37120 * (7.5 + 15 / 16) + 25088 + 16384
    assert rep.total_bytes == pytest.approx(256 * per_seq)
    dual = T.replay_traffic(T.layer_bytes_for("gdn", q122, "replay-dual", "float32", "bfloat16"), 1, 16)
    # dual: non-flush steps read the bf16 copy (2 MiB); flushes read+write fp32 and write bf16
    assert dual.parts["state_read"] == pytest.approx((15 * 2 * MiB + 4 * MiB) / 16)
    assert dual.parts["state_write"] == pytest.approx(6 * MiB / 16)


def test_fp8_state_counts_scales():
    lb = T.mamba2_layer_bytes(4, 8, 16, 2, "replay-shared-low", "float32", "float8_e4m3")
    assert lb.state_hi == 4 * 8 * 16 + 4 * 8 * 4


def _cycle(family, mode, lo, K, L=16):
    """Run K*3 steps with batch = K sequences whose cursors are staggered 0..K-1, so every step
    holds one sequence at each flush phase: per-step bytes = batch x the period average."""
    gen = torch.Generator().manual_seed(0)
    cnt = ByteCounter()
    K_seq = K
    if family == "mamba2":
        sh = Mamba2Shape(4, 8, 16, 2)
        rs = Mamba2ReplayState.allocate(K_seq, 4, 8, 16, 2, L, K, mode, "float32", lo, torch.bfloat16,
                                        counter=cnt)
        p = mamba2_params(sh, gen=gen)
        step = lambda: R.mamba2_replay_step(rs, **mamba2_step_inputs(sh, K_seq, gen=gen), **p)  # noqa: E731
        lb = T.mamba2_layer_bytes(4, 8, 16, 2, _method(mode), "float32", lo or "none")
    else:
        sh = GDNShape(2, 4, 16, 8)
        rs = GDNReplayState.allocate(K_seq, 2, 4, 16, 8, L, K, mode, "float32", lo, torch.bfloat16, counter=cnt)
        step = lambda: R.gdn_replay_step(rs, **gdn_step_inputs(sh, K_seq, gen=gen))  # noqa: E731
        lb = T.gdn_layer_bytes(2, 4, 16, 8, _method(mode), "float32", lo or "none")
    rs.cursor.copy_(torch.arange(K_seq, dtype=torch.int32))
    for _ in range(K):
        step()
    cnt.reset()
    for _ in range(3 * K):
        step()
    return cnt, lb, rs


def _method(mode):
    return {"replay": "replay", "dual": "replay-dual", "shared-low": "replay-shared-low"}[mode]


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("mode,lo", [("replay", None), ("dual", "bfloat16"), ("shared-low", "float8_e4m3")])
@pytest.mark.parametrize("K", [1, 4, 8])
def test_model_matches_byte_accounting(family, mode, lo, K):
    cnt, lb, rs = _cycle(family, mode, lo, K)
    model = T.replay_traffic(lb, batch=K, flush_period=K)
    steps = cnt.steps
    assert steps == 3 * K
    assert lb.row == rs.buffer_row_bytes()
    assert lb.state_hi + lb.state_lo == rs.state_bytes_per_slot()
    assert (cnt.ckpt_read / steps) == pytest.approx(model.parts["state_read"])
    assert (cnt.ckpt_write / steps) == pytest.approx(model.parts["state_write"])
    assert (cnt.buf_read / steps) == pytest.approx(model.parts["buffer_read"])
    assert (cnt.buf_write / steps) == pytest.approx(model.parts["buffer_write"])
    assert ((cnt.io_read + cnt.io_write) / steps) == pytest.approx(model.parts["io"])
    assert cnt.total() / steps == pytest.approx(model.total_bytes)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_eager_model_matches_byte_accounting(family):
    cnt = ByteCounter()
    gen = torch.Generator().manual_seed(1)
    if family == "mamba2":
        sh = Mamba2Shape(4, 8, 16, 2)
        st = torch.zeros(3, 4, 8, 16)
        R.mamba2_eager_step(st, **mamba2_step_inputs(sh, 3, gen=gen), **mamba2_params(sh, gen=gen), counter=cnt)
        lb = T.mamba2_layer_bytes(4, 8, 16, 2)
    else:
        sh = GDNShape(2, 4, 16, 8)
        st = torch.zeros(3, 4, 8, 16)
        R.gdn_eager_step(st, **gdn_step_inputs(sh, 3, gen=gen), counter=cnt)
        lb = T.gdn_layer_bytes(2, 4, 16, 8)
    assert cnt.total() == pytest.approx(T.eager_traffic(lb, 3).total_bytes)


def test_gdn_eager_route_is_modelled_as_a_flush_every_step():
    # a replay step that the kernel table sends down the eager route moves eager's bytes: the
    # model follows the table (shipped: fp32 and 16-bit reads at batch <= 16, dual states while
    # batch x value heads <= the options' dual_route_heads), and only for triton GDN
    from replayssm.gdn.options import GDNOptions
    from replaybench.models import get_model
    from replaybench.scenario import Case
    model = get_model("qwen3.5-122b-a10b")

    def case(method, batch, backend="triton", lo="none"):
        return Case("c", "kernel", model.name, "gdn", method, backend, batch, 16, 16, 0, "float32", lo)

    lb = T.layer_bytes_for("gdn", model.ssm, "replay", "float32", "none")
    assert T.step_traffic(case("replay", 1), model).total_bytes == pytest.approx(T.replay_traffic(lb, 1, 1).total_bytes)
    assert T.step_traffic(case("replay", 1, "reference"), model).total_bytes == pytest.approx(
        T.replay_traffic(lb, 1, 16).total_bytes)
    assert T.step_traffic(case("replay", 256), model).total_bytes == pytest.approx(
        T.replay_traffic(lb, 256, 16).total_bytes)
    dual = T.layer_bytes_for("gdn", model.ssm, "replay-dual", "float32", "bfloat16")
    routed = T.step_traffic(case("replay-dual", 1, lo="bfloat16"), model)
    assert routed.total_bytes == pytest.approx(T.replay_traffic(dual, 1, 16, routed=True).total_bytes)
    # routed, a dual state moves fp32 eager's bytes: its low copy is left stale, not written
    eager = T.eager_traffic(T.layer_bytes_for("gdn", model.ssm, "eager", "float32", "none"), 1)
    assert routed.parts["state_write"] == eager.parts["state_write"] == dual.state_hi
    assert routed.total_bytes == pytest.approx(eager.total_bytes)
    b = GDNOptions().dual_route_heads // model.ssm.num_v_heads
    assert T.step_traffic(case("replay-dual", b, lo="bfloat16"), model).total_bytes == pytest.approx(
        T.replay_traffic(dual, b, 16, routed=True).total_bytes)
    b += 1
    assert T.step_traffic(case("replay-dual", b, lo="bfloat16"), model).total_bytes == pytest.approx(
        T.replay_traffic(dual, b, 16).total_bytes)
    # batch 5-16: the deferred route (the table's ROUTE_K 2): the high copy read every step,
    # written every other, one entry buffered in between
    deferred = T.step_traffic(case("replay", 8), model)
    assert deferred.total_bytes == pytest.approx(T.replay_traffic(lb, 8, 16, routed=2).total_bytes)
    assert deferred.parts["state_read"] == pytest.approx(8 * lb.state_hi)
    assert deferred.parts["state_write"] == pytest.approx(8 * lb.state_hi / 2)
    assert deferred.parts["buffer_write"] == pytest.approx(8 * lb.row / 2)
    assert T.step_traffic(case("replay", 32), model).total_bytes == pytest.approx(
        T.replay_traffic(lb, 32, 16).total_bytes)
    # routing off (the library's options; the suite runs the shipped defaults): every step buffers
    from replayssm.gdn import route_period
    from replayssm.gdn.options import GDNOptions
    assert route_period(batch=1, heads=model.ssm.num_v_heads, head_dim=model.ssm.head_v_dim,
                        key_dim=model.ssm.head_k_dim, buffer_len=16, read_bytes=4, flush_period=16,
                        options=GDNOptions(small_batch_route=False)) == 0
    assert T.replay_traffic(lb, 1, 16, routed=0).total_bytes == pytest.approx(T.replay_traffic(lb, 1, 16).total_bytes)


def test_mamba2_eager_route_is_modelled_as_a_flush_every_step():
    from replayssm.mamba2.options import Mamba2Options
    from replaybench.models import get_model
    from replaybench.scenario import Case
    model = get_model("nemotron-3-super-120b-a12b")

    def case(batch, backend="triton"):
        return Case("c", "kernel", model.name, "mamba2", "replay", backend, batch, 16, 16, 0, "float32", "none")

    lb = T.layer_bytes_for("mamba2", model.ssm, "replay", "float32", "none")
    assert T.step_traffic(case(1), model).total_bytes == pytest.approx(T.replay_traffic(lb, 1, 1).total_bytes)
    assert T.step_traffic(case(1, "reference"), model).total_bytes == pytest.approx(
        T.replay_traffic(lb, 1, 16).total_bytes)
    assert T.step_traffic(case(256), model).total_bytes == pytest.approx(T.replay_traffic(lb, 256, 16).total_bytes)
    # dual states route where Super's fp32 states do (batch <= 2), moving fp32 eager's bytes
    dual_lb = T.layer_bytes_for("mamba2", model.ssm, "replay-dual", "float32", "bfloat16")
    for b in (1, 2, 3, 5):
        dual = Case("c", "kernel", model.name, "mamba2", "replay-dual", "triton", b, 16, 16, 0, "float32", "bfloat16")
        routed = b <= 2
        assert T.step_traffic(dual, model).total_bytes == pytest.approx(
            T.replay_traffic(dual_lb, b, 16, routed).total_bytes)
        if routed:
            assert T.step_traffic(dual, model).total_bytes == pytest.approx(T.step_traffic(case(b), model).total_bytes)
    # Nano's head dim (80): the deferred route (period 2) for fp32 states to batch 4
    nano = get_model("nemotron-3-nano-4b")
    nano_lb = T.layer_bytes_for("mamba2", nano.ssm, "replay", "float32", "none")
    for b, period in ((1, 2), (4, 2), (5, 0)):
        c = Case("c", "kernel", nano.name, "mamba2", "replay", "triton", b, 16, 16, 0, "float32", "none")
        assert T.step_traffic(c, nano).total_bytes == pytest.approx(T.replay_traffic(nano_lb, b, 16, period).total_bytes)
    routed = Mamba2Options().override("replay", route="eager")       # an override routes any batch
    assert T.route_period(case(256), model, routed) == 1
    # the deferred route (route_k): the high copy read every step, written every k-th (at most K)
    for k, period in ((2, 2), (4, 4), (40, 16)):
        assert T.route_period(case(2), model, Mamba2Options().override("replay", route="eager", route_k=k)) == period
        got = T.replay_traffic(lb, 2, 16, routed=period)
        assert got.parts["state_write"] == pytest.approx(2 * lb.state_hi / period)
    assert T.route_period(case(1), model, Mamba2Options(small_batch_route=False)) == 0   # routing off: it buffers
