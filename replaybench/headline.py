"""The README's headline results table, generated from a committed baseline run.

Per study model: vLLM's eager decode kernel's median / our method's median (same run, model,
batch and state dtype; one configuration per method as the report's paper-style section pairs
them, replaybench.report.paper.ratios) at one batch, and the replay step's modelled bytes /
time as % of the run's measured copy ceiling.

    python -m replaybench.headline                    # print the table
    python -m replaybench.headline --write README.md  # replace the block between the markers
    python -m replaybench.headline --check README.md  # exit 1 if README's block is stale
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .methods import EAGER, METHODS, PEER_EAGER, names
from .generated_block import replace_block, write_or_check
from .models import STUDY_MODELS, get_model

RUN = "h200-kernels-fp32-20261203-nvidia-h200"
BATCH = 256
# the methods the paper-style figure divides vLLM's eager kernel by: ours eager, replay, dual
COLUMNS = tuple((m, "eager (ours)" if m == EAGER else "dual fp32 + bf16" if METHODS[m].precision == "dual" else m)
                for m in names(paper_baseline=PEER_EAGER))
START, END = "<!-- headline:start -->", "<!-- headline:end -->"
FAMILY_NAMES = {"mamba2": "Mamba-2", "gdn": "GDN"}


def display_name(model: str) -> str:
    """'nemotron-3-super-120b-a12b' -> 'Nemotron-3-Super-120B-A12B' (sizes upper-case)."""
    parts = []
    for p in model.split("-"):
        parts.append(p.upper() if re.fullmatch(r"a?\d+(\.\d+)?b", p) else p[:1].upper() + p[1:])
    return "-".join(parts)


def table(run: str = RUN, results_dir: str | Path = "results", batch: int = BATCH) -> str:
    """The Markdown table for `run` at `batch` (a dash where the run has no pair)."""
    from .report.paper import paper_ok_rows, ratios
    from .store import RunStore

    root = Path(results_dir)
    if not (root / run).exists() and not root.is_absolute():
        root = Path(__file__).resolve().parents[1] / results_dir     # run from outside the checkout
    ok = paper_ok_rows(RunStore.open(run, root).dataframe())
    models = [m for m in STUDY_MODELS if m in set(ok["model"])]
    got = {(r["model"], r["method"]): r for method, _ in COLUMNS
           for r in ratios(ok, method, PEER_EAGER, 0, [batch], models)}
    head = ["model", "SSM"] + [label for _, label in COLUMNS] + ["replay % of copy"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in models:
        cells = [display_name(m), FAMILY_NAMES[get_model(m).op]]
        for method, _ in COLUMNS:
            r = got.get((m, method))
            cells.append(f"{r['ratio']:.2f}×" if r else "—")
        rep = got.get((m, "replay"))
        cells.append(f"{rep['method_pct_copy']:.0f} %" if rep and rep["method_pct_copy"] == rep["method_pct_copy"]
                     else "—")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def render(text: str, block: str, path: str = "README.md") -> str:
    """`text` with the block between the headline markers replaced by `block`."""
    return replace_block(text, START, END, block, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m replaybench.headline",
                                 description="The README's headline table from the committed fp32 baseline "
                                             f"({RUN}): vLLM eager median / our median at batch {BATCH}.")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="FILE", help="replace the block between FILE's headline markers")
    g.add_argument("--check", metavar="FILE", help="exit 1 if FILE's block differs from the generated table")
    ap.add_argument("--results-dir", default="results", help="where the run is (default: results)")
    args = ap.parse_args(argv)
    try:
        block = table(results_dir=args.results_dir)
    except Exception as e:  # noqa: BLE001 - a missing run or store problem: one line, exit 2
        print(f"replaybench.headline: {e}", file=sys.stderr)
        return 2
    path = args.write or args.check
    if not path:
        sys.stdout.write(block)
        return 0
    return write_or_check(path, START, END, block, "replaybench.headline", check=bool(args.check))

if __name__ == "__main__":
    sys.exit(main())
