"""The row schema: every column a result row can hold, its type and what it means.

One row per case, written by the sweep (replaybench.sweep.make_row) from the runner's metrics.
Who fills a column:
    sweep    the case's identity and status; a runner cannot override these
    derived  computed by the sweep (from the runner's metrics and the run's measured ceilings,
             or about the invocation)
    timing   every timed runner, from replaybench.timing
    runner   the runner, where it applies (null otherwise)

``contract`` columns are in every row and every stored table, first and in this order (the
store fills missing ones with null); the others follow in the order the rows bring them.
docs/CONTRACTS.md's column table is generated from this module:

    python -m replaybench.schema --write docs/CONTRACTS.md     # rewrite the marked block
    python -m replaybench.schema --check docs/CONTRACTS.md     # exit 1 if it is stale
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from .generated_block import replace_block, write_or_check

DTYPES = ("str", "int", "float", "bool")
OWNERS = ("sweep", "derived", "timing", "runner")


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str            # str | int | float | bool (int / float columns may be null)
    owner: str            # sweep | derived | timing | runner
    meaning: str
    contract: bool = False   # in every row and stored table, in this order
    table: bool = False      # in the report's "All rows" table


_C = Column
COLUMNS: tuple[Column, ...] = (
    _C("run_id", "str", "sweep", "the run (results/<run_id>/)", contract=True),
    _C("case_id", "str", "sweep", "stable id from every case parameter (device excluded): runs on different "
       "devices match by it", contract=True, table=True),
    _C("runner", "str", "sweep", "the runner that measured the case (kernel, layer, drift, ...)", contract=True),
    _C("model", "str", "sweep", "model name (replaybench.models; scaled variants '<model>@d<depth>w<width>')",
       contract=True),
    _C("op", "str", "sweep", "SSM family: mamba2 | gdn", contract=True),
    _C("method", "str", "sweep", "decode method (replaybench.methods)", contract=True, table=True),
    _C("backend", "str", "sweep", "reference | triton | vllm", contract=True, table=True),
    _C("batch", "int", "sweep", "sequences per step", contract=True, table=True),
    _C("buffer_len", "int", "sweep", "input buffer capacity L (0: no buffer)", contract=True, table=True),
    _C("flush_period", "int", "sweep", "flush period K (0: no buffer)", contract=True, table=True),
    _C("spec_window", "int", "sweep", "speculative window T (0: not speculative)", contract=True, table=True),
    _C("state_dtype", "str", "sweep", "dtype of the (high) checkpoint / recurrent state", contract=True,
       table=True),
    _C("lo_dtype", "str", "sweep", "dtype of the low-precision copy, or 'none'", contract=True, table=True),
    _C("device", "str", "sweep", "GPU name, or 'cpu'", contract=True),
    _C("median_us", "float", "timing", "median time per unit of work (a decode step, or a speculative "
       "round, of one layer for the whole batch) [us]", contract=True, table=True),
    _C("iqr_us", "float", "timing", "interquartile range of the samples [us]", contract=True, table=True),
    _C("samples", "int", "timing", "samples kept", contract=True, table=True),
    _C("bytes_model", "float", "runner", "modelled bytes read + written per unit (replaybench.traffic)",
       contract=True, table=True),
    _C("gbps", "float", "derived", "bytes_model / median_us [GB/s, 1e9]", contract=True, table=True),
    _C("pct_copy_bw", "float", "derived", "gbps as % of the copy ceiling measured at the run's start",
       contract=True, table=True),
    _C("status", "str", "sweep", "ok | error | skipped", contract=True, table=True),
    _C("error", "str", "sweep", "the exception (error) or the reason (skipped); null when ok", contract=True,
       table=True),
    # identity beyond the contract
    _C("torch_device", "str", "sweep", "torch device string the case ran on ('cuda', 'cpu')"),
    _C("seed", "int", "sweep", "input seed"),
    _C("accept", "str", "sweep", "acceptance model of speculative methods ('fixed:2', 'uniform', 'geom:0.7'), "
       "'none' otherwise"),
    _C("wall_s", "float", "derived", "wall time of the case, check and timing included [s]"),
    _C("session", "int", "derived", "index of the sweep invocation in the manifest's 'sessions'"),
    _C("finished", "str", "derived", "UTC time the row was written (ISO 8601)"),
    # timing
    _C("discarded", "int", "timing", "samples of batches timed under an NVML throttle reason, dropped"),
    _C("mean_us", "float", "timing", "mean of the kept samples [us]"),
    _C("min_us", "float", "timing", "fastest kept sample [us]"),
    _C("rel_iqr", "float", "timing", "iqr_us / median_us"),
    _C("sm_clock_mhz", "float", "timing", "mean SM clock while timing (NVML) [MHz]"),
    _C("mem_clock_mhz", "float", "timing", "mean memory clock while timing (NVML) [MHz]"),
    _C("power_w", "float", "timing", "mean board power while timing (NVML) [W]"),
    _C("throttle", "str", "timing", "NVML throttle reasons seen ('' none)"),
    _C("power_capped", "bool", "timing", "every batch ran under the power cap alone: the median is that "
       "capped rate"),
    _C("noisy", "bool", "timing", "fewer than 3 samples or IQR / median above 10 %: read the median with care"),
    _C("samples_us", "str", "timing", "every kept sample in measured order [us] (JSON list; the regression "
       "gate's test reads them)"),
    # runner metrics
    _C("read_bytes_model", "float", "runner", "modelled bytes read per unit"),
    _C("write_bytes_model", "float", "runner", "modelled bytes written per unit"),
    _C("state_bytes_model", "float", "runner", "modelled state bytes (read + write) per unit"),
    _C("buffer_bytes_model", "float", "runner", "modelled buffer bytes (read + write) per unit"),
    _C("flops_model", "float", "runner", "modelled FLOPs per unit"),
    _C("intensity", "float", "runner", "flops_model / bytes_model [FLOP/byte]"),
    _C("check_rel_err", "float", "runner", "largest relative output error against the reference before "
       "timing (null for the reference backend)"),
    _C("layers", "int", "runner", "independent layer states per sample (enough to stream from HBM on a GPU)"),
    _C("steps_per_sample", "int", "runner", "decode steps (or rounds) per sample"),
    _C("route_period", "int", "runner", "replay rows: 0 buffered, k >= 1 the small-batch route writing the "
       "state every k-th step"),
    _C("heads", "int", "runner", "state heads"),
    _C("state_rows", "int", "runner", "rows of one head's state matrix"),
    _C("state_cols", "int", "runner", "columns of one head's state matrix"),
    _C("dram_bytes", "float", "runner", "DRAM bytes per step measured by Nsight Compute (sweep --ncu)"),
    _C("dram_vs_model", "float", "runner", "dram_bytes / bytes_model"),
    # drift runner (replaybench.runners.drift, docs/drift.md): values at the last measurement step
    _C("config", "str", "runner", "drift: the state-precision configuration ('eager bf16', 'dual fp32+fp8', ...)"),
    _C("steps", "int", "runner", "drift: decode steps of the case"),
    _C("step", "int", "runner", "drift: the last measurement step (the flat drift columns are its values)"),
    _C("rel_err", "float", "runner", "drift: per-step relative output error vs fp64, median over sequences, "
       "heads and the window's steps"),
    _C("rel_err_p99", "float", "runner", "drift: the same, p99"),
    _C("state_rel_err", "float", "runner", "drift: relative error of the carried state (replay: the high "
       "checkpoint) at the last flush, median over sequences and heads"),
    _C("state_rel_err_p99", "float", "runner", "drift: the same, p99"),
    _C("kl", "float", "runner", "drift: KL(p_fp64 || p) of the stack's next-token distribution, mean over "
       "sequences and the window's steps [nats]"),
    _C("kl_p99", "float", "runner", "drift: the same, p99 [nats]"),
    _C("top1", "float", "runner", "drift: fraction of next-token argmaxes equal to fp64's"),
    _C("drift_series", "str", "runner", "drift: every measurement step's values (JSON list of records; "
       "replaybench.report.drift.drift_long expands it)"),
    _C("window", "int", "runner", "drift: steps pooled at each measurement step"),
    _C("ref_entropy", "float", "runner", "drift: mean entropy of the fp64 stack's next-token distribution [nats]"),
    _C("stack_layers", "int", "runner", "drift: decode layers in the stack"),
    _C("stack_hidden", "int", "runner", "drift: the stack's hidden size"),
    _C("stack_vocab", "int", "runner", "drift: the stack's vocabulary"),
    _C("memory_min_steps", "float", "runner", "drift: shortest head memory 1 / (|A| dt0) [steps]"),
    _C("memory_median_steps", "float", "runner", "drift: median head memory [steps]"),
    _C("memory_max_steps", "float", "runner", "drift: longest head memory [steps]"),
    _C("graphed", "bool", "runner", "drift: the op's steps ran as CUDA-graph replays (checked against eager)"),
    _C("stack_graphed", "bool", "runner", "drift: the stack's steps ran as CUDA-graph replays"),
)

BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}
CONTRACT_COLUMNS: list[str] = [c.name for c in COLUMNS if c.contract]
IDENTITY_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.owner == "sweep")
TABLE_COLUMNS: list[str] = [c.name for c in COLUMNS if c.table]
FLOAT_CONTRACT = tuple(c.name for c in COLUMNS if c.contract and c.dtype == "float")
INT_CONTRACT = tuple(c.name for c in COLUMNS if c.contract and c.dtype == "int")

START = "<!-- columns:start (generated by python -m replaybench.schema --write docs/CONTRACTS.md) -->"
END = "<!-- columns:end -->"


def markdown_table() -> str:
    """The column table of docs/CONTRACTS.md."""
    out = ["| column | type | filled by | in every row | meaning |", "|---|---|---|---|---|"]
    for c in COLUMNS:
        out.append(f"| `{c.name}` | {c.dtype} | {c.owner} | {'yes' if c.contract else ''} | "
                   f"{c.meaning.replace('|', chr(92) + '|')} |")
    return "\n".join(out) + "\n"


def render(text: str, path: str = "docs/CONTRACTS.md") -> str:
    """`text` with the block between the markers replaced by the current table."""
    return replace_block(text, START, END, markdown_table(), path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m replaybench.schema",
                                 description="Print the row-schema table, or write / check it in a Markdown "
                                             "file between its markers.")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="FILE", help="rewrite the table between the markers of FILE")
    g.add_argument("--check", metavar="FILE", help="exit 1 if FILE's table differs from the schema")
    args = ap.parse_args(argv)
    path = args.write or args.check
    if not path:
        sys.stdout.write(markdown_table())
        return 0
    return write_or_check(path, START, END, markdown_table(), "replaybench.schema", check=bool(args.check))

if __name__ == "__main__":
    sys.exit(main())
