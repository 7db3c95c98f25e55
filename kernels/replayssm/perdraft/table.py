"""Per-draft launch table (common.table rows): per family, rows per program (BLOCK_R, clamped to
the head's rows) and warps. A program's fp32 tile is BLOCK_R x next_pow2(cols): the eager
kernels' tiles, since per token the work is the eager step's."""
from __future__ import annotations

from ..common.table import Row, Table

SPEC = "h200-spec-20261202-nvidia-h200"

TABLE = Table([
    Row("mamba2", "mamba2", {"BLOCK_R": 16, "num_warps": 4},
        why="16 x 128 fp32 tiles: 16 registers per thread at 4 warps", run=SPEC),
    Row("gdn-b4", "gdn", {"BLOCK_R": 8, "num_warps": 1}, max_batch=4,
        why="small batches: 8-row tiles on one warp, as GDN's eager step", run=SPEC),
    Row("gdn-b64", "gdn", {"BLOCK_R": 16, "num_warps": 2}, max_batch=64,
        why="16-row tiles on 2 warps", run=SPEC),
    Row("gdn", "gdn", {"BLOCK_R": 32, "num_warps": 4}, why="large batches: 32-row tiles on 4 warps", run=SPEC),
], {"mamba2": {"BLOCK_R", "num_warps"}, "gdn": {"BLOCK_R", "num_warps"}})
