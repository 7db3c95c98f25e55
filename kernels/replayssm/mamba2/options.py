"""Mamba2Options: the knobs of the Mamba-2 planners, frozen and passed explicitly (`options=`)
to the public ops and planners; `Mamba2Options()` is what ships."""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from ..common.table import Options

_TILE = ("block_p", "chunks", "warps")


@dataclass(frozen=True)
class Mamba2Options(Options):
    """small_batch_route: batches the table's "route" rows cover take the small-batch route
    (False: every replay step buffers; tests of the buffered route).
    pdl: programmatic dependent launches where a plan chains kernels (B_i . C pre-pass and
    step, verify and commit's list launch, list launch and fold).
    commit_list / commit_list_max: a commit lists its folding rows first (one program) and folds
    them with a few workers per head tile, up to that batch; above it, one fold program per row.
    verify_early_buf: the verify loads the buffer tiles for rows < min(K, L) before the cursor
    arrives (rows past it zeroed after): one dependent round trip less.
    verify_f32_precision: tl.dot precision of an fp32 state tile times C in verify.
    verify_chunk_n: state columns per verify MMA step.
    verify_pre_gram: the verify's Gram matrices from a launch ahead of it; None: for fp32 read
    copies whose heads tile without a tail from batch x heads verify_pre_gram_min_work.
    fold_dot_precision: tl.dot precision of the fold with a non-bf16 buffer ("tf32x3" or "ieee";
    a bf16 buffer folds exactly in "bf16x3").
    cursor_block: batch rows per program of the cursor pass.
    override(op, **params): replace the picked table row's params (tuning); ops and params
    in TUNABLE."""

    TUNABLE = MappingProxyType({
        "eager": frozenset(_TILE + ("evict",)),
        "fold": frozenset(_TILE + ("list", "pdl")),
        "verify": frozenset(("block_p", "warps", "whole", "early_buf", "s_prec", "x_prec", "chunk_n", "maxnreg",
                             "tma", "pdl", "gram", "chunks")),
        "replay": frozenset(("block_p", "chunks", "warps", "route", "early", "preload", "ticket", "fold_rows",
                             "fold_cols", "evict", "maxnreg", "pf", "bc", "coef", "pdl", "route_k", "fold_wait")),
    })

    small_batch_route: bool = True
    pdl: bool = True
    commit_list: bool = True
    commit_list_max: int = 128
    verify_early_buf: bool = True
    verify_f32_precision: str = "tf32x3"
    verify_chunk_n: int = 32
    verify_pre_gram: bool | None = None
    verify_pre_gram_min_work: int = 16384
    fold_dot_precision: str = "tf32x3"
    cursor_block: int = 256


DEFAULT = Mamba2Options()


def resolve(options: Mamba2Options | None) -> Mamba2Options:
    """`options`, or the shipped defaults for None (a clear error for anything else)."""
    if options is None:
        return DEFAULT
    if not isinstance(options, Mamba2Options):
        raise TypeError(f"options must be a replayssm.mamba2.Mamba2Options, got {type(options).__name__}")
    return options
