"""Host-side pieces the kernel modules' launchers share: a recorded launch (run it, inspect it,
or compile it offline without a GPU), the argument normalisation before a launch, the
per-state scratch tensors that a step's or commit's launches share, and the state-row TMA
descriptors of the verify kernels."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor


@dataclass
class Launch:
    """One kernel launch, recorded: kernel[grid](*args, **meta). Plans return these so a
    launch can be run, inspected, or compiled offline (compile_offline) without a GPU."""

    kernel: object
    grid: tuple
    args: tuple
    meta: dict
    row: str = ""       # the launch-table row (common.table.Row.name) that chose it

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.meta)

    @property
    def name(self) -> str:
        fn = getattr(self.kernel, "fn", self.kernel)
        return getattr(fn, "__name__", type(fn).__name__)

    def describe(self) -> dict:
        """What runs: kernel name, grid, tile meta (the launch's constexprs and options) and
        the table row that chose it."""
        return {"kernel": self.name, "grid": tuple(int(g) for g in self.grid),
                "meta": {k: v for k, v in self.meta.items()}, "row": self.row}


def pdl_meta(device, on: bool = True) -> dict:
    """Launch meta of a programmatic dependent launch (PDL) on `device`, when `on` and the
    device has it (CUDA compute capability >= 9; the 'meta' device stands for the H200 of
    offline compiles): {"GDC": True, "launch_pdl": True}, else {"GDC": False}. A kernel
    launched so may start while the kernel ahead of it in the stream is finishing; its
    programs wait for that kernel (common.jit.gdc_wait_prior) before touching memory, so the
    launch's latency overlaps the kernel ahead of it instead of following it. Works inside a
    captured CUDA graph (a programmatic edge)."""
    return {"GDC": True, "launch_pdl": True} if on and _hopper_on(torch.device(device)) else {"GDC": False}


def _hopper_on(d: torch.device) -> bool:
    """CUDA compute capability >= 9, or the 'meta' device that offline compiles stand for sm_90 with."""
    return d.type == "meta" or (d.type == "cuda" and torch.cuda.get_device_capability(d)[0] >= 9)


def last_contig(t: torch.Tensor | None) -> torch.Tensor | None:
    """t with a unit stride in its last dim (a copy otherwise; activations and params only)."""
    if t is not None and t.stride(-1) != 1:
        t = t.contiguous()
    return t


def out_like(out: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """The output tensor: `out` (shape of x, unit last stride) or a new one."""
    if out is None:
        return torch.empty_like(x)
    if out.shape != x.shape or out.stride(-1) != 1:
        raise ValueError(f"out must have shape {tuple(x.shape)} and a unit last stride")
    return out


def cache_lines(t: torch.Tensor, row_elems: int) -> tuple[int, int]:
    """(128-byte lines per row as a power of 2, elements per line) of rows of `row_elems`
    elements of t's dtype: the shape of a prefetch hint over those rows (common.jit.prefetch_hint)."""
    es = t.element_size()
    return triton.next_power_of_2(triton.cdiv(row_elems * es, 128)), max(1, 128 // es)


def state_scratch(rs, name: str, numel: int, device) -> torch.Tensor:
    """An int32 scratch tensor [>= numel] kept on the state object rs under attribute `name`:
    one allocation serves every call and a captured CUDA graph (reallocated only when a call
    needs more, or another device). A replaced tensor stays referenced (rs._scratch_retired):
    a graph captured with it (say at a smaller batch, captured first) still reads and writes
    it at every replay, so its memory must not go back to the allocator."""
    t = getattr(rs, name, None)
    if t is None or t.numel() < numel or t.device != torch.device(device):
        if t is not None:
            retired = getattr(rs, "_scratch_retired", None)
            if retired is None:
                retired = []
                setattr(rs, "_scratch_retired", retired)
            retired.append(t)
        t = torch.empty(numel, dtype=torch.int32, device=device)
        setattr(rs, name, t)
    return t


def has_tma(device) -> bool:
    """Whether kernels on `device` may read through TMA descriptors: CUDA compute capability
    >= 9 (Hopper on), the 'meta' device of offline compiles (sm_90) and the CPU (Triton's
    interpreter runs descriptor loads)."""
    d = torch.device(device)
    return d.type == "cpu" or _hopper_on(d)


def tma_rows(t: torch.Tensor, row_elems: int, blocks, key: str, asked: bool | None):
    """TMA descriptors over the contiguous state tensor t viewed as [rows, row_elems], one per
    block shape in `blocks` ([rows per load, elements per load]), or None for pointer loads.
    asked: True / False from a config (key names it), None: use them where TMA can (16-byte
    aligned base, rows a multiple of 16 bytes, row numbers within int32, block dims <= 256,
    a device with TMA: has_tma)."""
    fits = (t.is_contiguous() and t.data_ptr() % 16 == 0 and row_elems * t.element_size() % 16 == 0
            and t.numel() // row_elems < 1 << 31 and all(d <= 256 for b in blocks for d in b))
    if asked and not fits:
        raise ValueError(f"config {key}=True: the state {tuple(t.shape)} {t.dtype} cannot be read through TMA "
                         f"(needs a contiguous 16-byte aligned tensor, rows of a multiple of 16 bytes, < 2^31 rows, "
                         f"blocks of <= 256 x 256: asked {list(blocks)})")
    if not (fits and has_tma(t.device) if asked is None else asked):
        return None
    return [TensorDescriptor.from_tensor(t.view(-1, row_elems), list(b)) for b in blocks]
