"""Layer runner: a whole decode layer (in-projection, causal conv, SSM op, gated norm,
out-projection) at a model's real dims, checked against the reference, then timed; and, in
the same run on the same layers, the SSM op alone, so a row says what share of a layer's
time (ssm_share) and modelled bytes (ssm_bytes_share, state_bytes_share) is the SSM op.

Structure follows the kernel runner (replaybench.runners.kernel): a sample is `steps` = K
decode steps over `layers` independent layers (each with its own weights, conv state and
SSM state), enough that weights + state together are >= common.STATE_TARGET_BYTES on a GPU
so they stream from HBM, not L2; cursors are staggered across the batch (sequence i starts
at cursor i mod K) so a sample averages over every flush phase. median_us is per step per
layer for the whole batch. The SSM-only timing replays the SSM op of every layer on inputs
that each layer's projection + conv produced once (layer.ssm_inputs), i.e. the same call
`step` makes, at the same states; it runs over max(layers, the kernel runner's layer count
for the SSM state alone) states (`ssm_layers`; extra ones share the first layer's weights),
because without the other stages' weight traffic a few layers' states could stay in L2.

bytes_model = weights (read once per step) + conv state (read + write) + the SSM op's
traffic (replaybench.traffic.step_traffic: state, buffer, its inputs/outputs) + the other
stages' activations (each stage reads its inputs and writes its outputs once, unfused).
"""
from __future__ import annotations

import torch

from replayssm.layers import decode_layer

from ..hardware import achieved_gbps, pct_of_copy
from ..methods import names
from ..models import get_model
from ..timing import measure
from ..traffic import step_traffic
from . import SkipCase
from .common import check_tol, layers_for, rel_err, steps_per_sample

METHODS = names(layer=True)


def make_layer(case, model, device, backend: str | None = None, batch: int | None = None, seed: int = 0,
               dtype=torch.bfloat16, weights_from=None):
    """The case's decode layer (bf16 weights/activations) on `device` (weights shared with
    `weights_from` when given)."""
    return decode_layer(model.op, model.hidden, model.ssm, method=case.method,
                        backend=backend or case.backend, batch=batch or case.batch,
                        buffer_len=max(case.buffer_len, 1), flush_period=max(case.flush_period, 1),
                        state_dtype=case.state_dtype, lo_dtype=case.lo_dtype, device=device, dtype=dtype,
                        seed=seed, weights_from=weights_from)


def check_layer_against_reference(case, model, device, steps: int | None = None) -> float:
    """Max relative output error of the case's backend layer vs the same layer on the
    reference backend (same weights, states and inputs; a padded row included) over
    enough steps to cross a flush. Raises if too large."""
    b = min(case.batch, 8)
    ours = make_layer(case, model, device, batch=b, seed=case.seed + 11)
    ref = make_layer(case, model, device, backend="reference", batch=b, seed=case.seed + 11)
    for layer in (ours, ref):
        layer.randomize_state(case.seed + 13, fill_buffer=True)
    gen = torch.Generator().manual_seed(case.seed + 17)
    idx = torch.arange(b, dtype=torch.int32, device=device)
    if b > 1:
        idx[-1] = -1
    worst = 0.0
    for _ in range(steps or (2 * max(case.flush_period, 1) + 1)):
        h = torch.randn(b, model.hidden, generator=gen).to(device=device, dtype=torch.bfloat16)
        y_ours, y_ref = ours.step(h, idx), ref.step(h, idx)
        if not torch.isfinite(y_ours).all():
            raise AssertionError("non-finite output from the layer")
        if b > 1 and bool((y_ours[-1] != 0).any()):
            raise AssertionError("padded row produced a non-zero output")
        worst = max(worst, rel_err(y_ours, y_ref))
    tol = check_tol(case)
    if worst > tol:
        raise AssertionError(f"layer output differs from the reference: rel err {worst:.3g} > {tol}")
    return worst


def run(case, ctx) -> dict:
    model = get_model(case.model)
    if case.method not in METHODS:
        raise SkipCase(f"method {case.method!r} is not measured by the layer runner; allowed: {', '.join(METHODS)}")
    if case.backend not in ("reference", "triton"):
        raise SkipCase(f"backend {case.backend!r} has no decode layer here (vLLM layers: the e2e runner)")
    device = ctx.device
    if case.backend == "reference" and device.startswith("cuda"):
        raise SkipCase("the reference backend syncs with the host (not CUDA-graph capturable); "
                       "time backend 'triton' on a GPU")
    traffic = step_traffic(case, model)
    check = check_layer_against_reference(case, model, device) if case.backend != "reference" else float("nan")

    first = make_layer(case, model, device, seed=case.seed * 1009)
    per_layer = first.weight_bytes() + case.batch * (first.conv_state_bytes_per_seq()
                                                     + first.ssm_state_bytes_per_seq())
    nl = layers_for(per_layer, device)
    layers = [first] + [make_layer(case, model, device, seed=case.seed * 1009 + i) for i in range(1, nl)]
    for i, layer in enumerate(layers):
        layer.randomize_state(case.seed * 1009 + i, fill_buffer=True)
    gen = torch.Generator().manual_seed(case.seed)
    hidden = torch.randn(case.batch, model.hidden, generator=gen).to(device=device, dtype=torch.bfloat16)
    idx = torch.arange(case.batch, dtype=torch.int32, device=device)
    steps = steps_per_sample(case.flush_period, nl, device)

    def sample_layer():
        for _ in range(steps):
            for layer in layers:
                layer.step(hidden, idx)

    t = measure(sample_layer, device, ctx.timing, per=steps * nl)

    # SSM op alone: as many SSM states as the kernel runner uses (in the layer run the other
    # layers' weights push each state out of L2; here extra states must), extra layers share
    # the first one's weights (ssm_only reads none of them)
    nl_ssm = max(nl, layers_for(case.batch * first.ssm_state_bytes_per_seq(), device))
    for i in range(nl, nl_ssm):
        extra = make_layer(case, model, device, seed=case.seed * 1009 + i, weights_from=first)
        extra.randomize_state(case.seed * 1009 + i, fill_buffer=True)
        layers.append(extra)
    ssm_in = [layer.ssm_inputs(hidden, idx) for layer in layers]

    def sample_ssm():
        for _ in range(steps):
            for layer, inp in zip(layers, ssm_in):
                layer.ssm_only(inp, idx)

    ts = measure(sample_ssm, device, ctx.timing, per=steps * nl_ssm)

    nb = first.non_ssm_step_bytes(case.batch)
    ssm_bytes = traffic.total_bytes
    state_bytes = traffic.parts["state_read"] + traffic.parts["state_write"]
    total = ssm_bytes + nb["weights"] + nb["conv_state"] + nb["activations"]
    flops = traffic.flops + first.matmul_flops(case.batch)
    ssm_gbps = achieved_gbps(ssm_bytes, ts.median_us)
    return {
        **t.columns(),
        "ssm_us": ts.median_us, "ssm_iqr_us": ts.iqr_us, "ssm_samples": ts.samples, "ssm_discarded": ts.discarded,
        "ssm_min_us": ts.min_us, "ssm_rel_iqr": ts.rel_iqr,
        "ssm_share": ts.median_us / t.median_us if t.median_us else None,
        "non_ssm_us": t.median_us - ts.median_us,
        "bytes_model": total, "ssm_bytes_model": ssm_bytes, "state_bytes_model": state_bytes,
        "buffer_bytes_model": traffic.parts["buffer_read"] + traffic.parts["buffer_write"],
        "weight_bytes": nb["weights"], "conv_state_bytes_model": nb["conv_state"],
        "activation_bytes_model": nb["activations"],
        "ssm_bytes_share": ssm_bytes / total, "state_bytes_share": state_bytes / total,
        "flops_model": flops, "intensity": flops / total,
        "ssm_gbps": ssm_gbps, "ssm_pct_copy_bw": pct_of_copy(ssm_gbps, ctx.ceilings) if ssm_gbps else None,
        "check_rel_err": check, "layers": nl, "ssm_layers": nl_ssm, "steps_per_sample": steps, "hidden": model.hidden,
        "conv_kernel": first.conv_kernel, "conv_state_bytes_per_seq": first.conv_state_bytes_per_seq(),
        "ssm_state_bytes_per_seq": first.ssm_state_bytes_per_seq(),
    }
