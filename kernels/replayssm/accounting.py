"""Byte counting: the device-memory bytes each op moves, by kind (checkpoint, buffer, inputs
and outputs), counted from what the op reads and writes per live sequence. The public ops
count before they launch (a counter syncs: it needs the cursors on the host); the reference
counts as it runs. ReplaySSM traffic models (replaybench.traffic) are checked against these."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ByteCounter:
    """Bytes an op touches in device memory, by kind. Counts unique bytes per step
    (a group's B row shared by its heads counts once)."""

    ckpt_read: int = 0
    ckpt_write: int = 0
    buf_read: int = 0
    buf_write: int = 0
    io_read: int = 0
    io_write: int = 0
    steps: int = 0

    def total(self) -> int:
        return self.ckpt_read + self.ckpt_write + self.buf_read + self.buf_write + self.io_read + self.io_write

    def reset(self) -> None:
        for f in ("ckpt_read", "ckpt_write", "buf_read", "buf_write", "io_read", "io_write", "steps"):
            setattr(self, f, 0)


def live_rows(state_indices: torch.Tensor | None, batch: int, device, pool: int | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, slots): batch rows that are not padding and the slots they address. An index
    outside 0 <= idx < pool (the state's slots; None: no upper bound) is padding too: the
    no-op row the kernels make of it."""
    if state_indices is None:
        rows = torch.arange(batch, device=device)
        return rows, rows
    idx = state_indices.to(device=device, dtype=torch.long)
    ok = idx >= 0 if pool is None else (idx >= 0) & (idx < pool)
    rows = torch.nonzero(ok).flatten()
    return rows, idx[rows]


def mamba2_io_bytes(x, dt, B, C, z) -> int:
    """Per-sequence input bytes of one Mamba-2 step (x, dt, B, C, z)."""
    n = x[0].numel() * x.element_size() + dt[0].numel() * dt.element_size()
    n += B[0].numel() * B.element_size() + C[0].numel() * C.element_size()
    if z is not None:
        n += z[0].numel() * z.element_size()
    return n


def gdn_io_bytes(q, k, v, g, beta) -> int:
    return sum(t[0].numel() * t.element_size() for t in (q, k, v, g, beta))


def count_step(rs, n, flush, route: int, io_read: int, io_write: int) -> None:
    """Bytes of one replay step over live rows with entries n [b] and flush decisions
    flush [b] (flush_rows); io_read / io_write: input / output bytes per row; route: the
    small-batch route's period (0: not routed; its steps read the high copy)."""
    nflush = int(flush.sum())
    nn = len(n) - nflush
    rb = rs.buffer_row_bytes()
    read = rs.hi if route else rs.read_ckpt
    rs.count(ckpt_read=nn * read.bytes_per_slot() + nflush * rs.hi.bytes_per_slot(),
             buf_read=int(n.sum()) * rb, buf_write=nn * rb, io_read=len(n) * io_read, io_write=len(n) * io_write)
    count_flush_write(rs, nflush, route)


def flush_rows(rs, slots, n, route: int) -> torch.Tensor:
    """[b] bool: the step flushes the sequence. Its cursor reaches K, or a stale low copy
    (LO_STALE) would be read: the step folds and refreshes it instead. route (the small-batch
    route's period k, which the Triton kernels take by batch size): the cursor reaches
    min(k, K) (k = 1: every sequence flushes); the low copy is not read."""
    if route:
        return n + 1 >= min(int(route), rs.flush_period)
    return (n + 1 >= rs.flush_period) | rs.lo_stale(slots)


def flush_slots(rs, slots):
    """The slots a flush folds: entries pending, or a stale low copy to refresh."""
    if slots is None:
        slots = torch.arange(rs.cursor.shape[0], device=rs.cursor.device)
    slots = slots.to(device=rs.cursor.device, dtype=torch.long)
    slots = slots[(slots >= 0) & (slots < rs.cursor.shape[0])]   # negative or past the pool: skipped
    return slots[rs.cursor[slots] != 0]


def count_flush_write(rs, nflush: int, route: int = 0) -> None:
    per = rs.hi.bytes_per_slot() if route and rs.mode == "dual" else rs.state_bytes_per_slot()
    rs.count(ckpt_write=nflush * per)
    if rs.counter is not None:
        rs.counter.steps += 1


def count_refresh(rs, nstale: int) -> None:
    """Bytes of refreshing `nstale` stale low copies (read high, write low)."""
    if nstale:
        rs.count(ckpt_read=nstale * rs.hi.bytes_per_slot(), ckpt_write=nstale * rs.lo.bytes_per_slot())


def perdraft_rows(slot_table: torch.Tensor, start: torch.Tensor, pool: int | None = None):
    """(live rows, their start slots, destination slots [rows, T]) of a per-draft round; slots
    outside 0..pool-1 are padding (a start) or skipped (a destination)."""
    T = slot_table.shape[1] - 1
    tbl = slot_table.to(torch.long)
    st = start.to(device=tbl.device, dtype=torch.long)
    okc = (st >= 0) & (st <= T)          # a start column outside 0..T: a padded row, as the kernels make it
    st = torch.where(okc, st, torch.zeros_like(st))
    src = tbl.gather(1, st[:, None])[:, 0]
    ok = okc & (src >= 0) if pool is None else okc & (src >= 0) & (src < pool)
    rows = torch.nonzero(ok).flatten()
    dst = tbl.gather(1, perdraft_columns(st, T))
    if pool is not None:
        dst = torch.where(dst < pool, dst, torch.full_like(dst, -1))   # past the pool: skipped
    return rows, src[rows], dst[rows]


def count_perdraft(counter, states, n_rows, n_writes, io_read, io_write) -> None:
    if counter is None:
        return
    sb = states[0].numel() * states.element_size()
    counter.ckpt_read += n_rows * sb
    counter.ckpt_write += n_writes * sb
    counter.io_read += io_read
    counter.io_write += io_write
    counter.steps += 1


def count_eager(counter: ByteCounter, state: torch.Tensor, rows: int, io_read: int, io_write: int) -> None:
    """Bytes of one eager step over `rows` live sequences: their state read and written, io_read /
    io_write input / output bytes per sequence."""
    sb = state[0].numel() * state.element_size()
    counter.ckpt_read += rows * sb
    counter.ckpt_write += rows * sb
    counter.io_read += rows * io_read
    counter.io_write += rows * io_write
    counter.steps += 1


def count_fold(rs, n: torch.Tensor) -> None:
    """Bytes of folding the sequences with entries n [f] (flush, commit): the high copy read,
    their entries read, every copy written."""
    if len(n):
        rs.count(ckpt_read=len(n) * rs.hi.bytes_per_slot(), buf_read=int(n.sum()) * rs.buffer_row_bytes(),
                 ckpt_write=len(n) * rs.state_bytes_per_slot())


def perdraft_columns(start: torch.Tensor, T: int) -> torch.Tensor:
    """[b, T] slot-table columns the states after tokens 0..T-1 go to: (start + 1 + t) mod (1 + T)."""
    return (start.to(torch.long)[:, None] + 1 + torch.arange(T, device=start.device)) % (T + 1)
