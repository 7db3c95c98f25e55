"""The hybrid models replaybench reports on, as data.

Numbers come from /work/shared/MODELS.md (the models' published config.json
fields).  ``state_bytes_per_seq`` reproduces the derived "state per sequence"
figures there.  Depth/width-scaled variants are built by :func:`scaled_model`
and named ``<base>@d<depth>w<width>`` (e.g. ``nemotron-3-super-120b-a12b@d0.5w2``);
:func:`get_model` parses such names.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass

MiB = 1024 * 1024


# The SSM op shapes are the kernel library's (replayssm.inputs.Mamba2Shape / GDNShape): a model
# stores the field values of its op's shape and hands out the library's object as `ssm`
# (imported on first use, so that listing models or validating a scenario never imports torch).
SHAPE_FIELDS = {"mamba2": ("nheads", "head_dim", "d_state", "n_groups"),
                "gdn": ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim")}


def _shape(op: str, **dims) -> tuple[tuple[str, int], ...]:
    if set(dims) != set(SHAPE_FIELDS[op]):
        raise ValueError(f"{op} shape needs {', '.join(SHAPE_FIELDS[op])}, got {', '.join(dims)}")
    return tuple((f, int(dims[f])) for f in SHAPE_FIELDS[op])


@functools.lru_cache(maxsize=None)
def op_shape(op: str, dims: tuple[tuple[str, int], ...]):
    """The kernel library's shape object for an op ('mamba2' | 'gdn') and its field values."""
    from replayssm.inputs import GDNShape, Mamba2Shape
    return (Mamba2Shape if op == "mamba2" else GDNShape)(**dict(dims))


@dataclass(frozen=True)
class HybridModel:
    name: str
    family: str
    op: str                      # 'mamba2' | 'gdn'
    hidden: int
    n_layers: int
    n_ssm_layers: int
    n_attn_layers: int
    vocab: int
    dims: tuple[tuple[str, int], ...]   # the op shape's fields (SHAPE_FIELDS[op]) and values
    attn_heads: int
    attn_kv_heads: int
    attn_head_dim: int
    mtp_layers: int
    pattern: str | None = None
    notes: str = ""
    tiny: bool = False
    base: str | None = None      # for scaled variants: the model they derive from
    depth: float = 1.0
    width: float = 1.0

    @property
    def ssm(self):
        """The op's shape: replayssm.inputs.Mamba2Shape or GDNShape."""
        return op_shape(self.op, self.dims)

    @property
    def state_elems(self) -> int:
        """Recurrent-state elements of one SSM layer for one sequence (heads x rows x cols)."""
        d = dict(self.dims)
        if self.op == "mamba2":
            return d["nheads"] * d["head_dim"] * d["d_state"]
        return d["num_v_heads"] * d["head_k_dim"] * d["head_v_dim"]

    def describe_ssm(self) -> str:
        d = dict(self.dims)
        if self.op == "mamba2":
            return f"{d['nheads']}h x P{d['head_dim']}, N{d['d_state']}, g{d['n_groups']}"
        return f"{d['num_k_heads']}k/{d['num_v_heads']}v heads, dk{d['head_k_dim']} dv{d['head_v_dim']}"

    def state_bytes_per_layer(self, dtype_bytes: float = 4) -> float:
        """Recurrent-state bytes of one SSM layer for one sequence."""
        return self.state_elems * dtype_bytes

    def state_bytes_per_seq(self, dtype_bytes: float = 4) -> float:
        """Recurrent-state bytes of all SSM layers for one sequence."""
        return self.n_ssm_layers * self.state_bytes_per_layer(dtype_bytes)


def _m(**kw) -> HybridModel:
    return HybridModel(**kw)


_BASE_MODELS: list[HybridModel] = [
    _m(name="nemotron-3-nano-4b", family="nemotron-3", op="mamba2",
       hidden=3136, n_layers=42, n_ssm_layers=21, n_attn_layers=4, vocab=131072,
       dims=_shape("mamba2", nheads=96, head_dim=80, d_state=128, n_groups=8),
       attn_heads=40, attn_kv_heads=8, attn_head_dim=128, mtp_layers=0,
       pattern="M-M-M-MM-M-M*-M-M*-M-M-M*-M-M-MM*-MMM-M-M-",
       notes="NemotronHForCausalLM (dense), relu2 MLP 12544; state fp32"),
    _m(name="nemotron-3-super-120b-a12b", family="nemotron-3", op="mamba2",
       hidden=4096, n_layers=88, n_ssm_layers=40, n_attn_layers=8, vocab=131072,
       dims=_shape("mamba2", nheads=128, head_dim=64, d_state=128, n_groups=8),
       attn_heads=32, attn_kv_heads=2, attn_head_dim=128, mtp_layers=1,
       pattern=("MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*"
                "EMEMEMEMEM*EMEMEMEM*EMEMEMEME"),
       notes="latent MoE 512 experts top-22 + 1 shared, latent 1024; MTP; state fp32"),
    _m(name="qwen3.5-4b", family="qwen3.5", op="gdn",
       hidden=2560, n_layers=32, n_ssm_layers=24, n_attn_layers=8, vocab=248320,
       dims=_shape("gdn", num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128),
       attn_heads=16, attn_kv_heads=4, attn_head_dim=256, mtp_layers=1,
       pattern=None,
       notes="3 GDN layers then 1 full-attention layer, repeated; MLP 9216; state fp32"),
    _m(name="qwen3.5-122b-a10b", family="qwen3.5", op="gdn",
       hidden=3072, n_layers=48, n_ssm_layers=36, n_attn_layers=12, vocab=248320,
       dims=_shape("gdn", num_k_heads=16, num_v_heads=64, head_k_dim=128, head_v_dim=128),
       attn_heads=32, attn_kv_heads=2, attn_head_dim=256, mtp_layers=1,
       pattern=None,
       notes="3 GDN + 1 attention, repeated; MoE 256 experts top-8 + 1 shared; "
             "architecture name (i); state fp32"),
    _m(name="nemotron-3-ultra-550b-a55b", family="nemotron-3", op="mamba2",
       hidden=8192, n_layers=108, n_ssm_layers=48, n_attn_layers=12, vocab=131072,
       dims=_shape("mamba2", nheads=256, head_dim=64, d_state=128, n_groups=8),
       attn_heads=64, attn_kv_heads=2, attn_head_dim=128, mtp_layers=0,
       pattern=None,
       notes="MoE 512 experts top-22 + 1 shared, latent 2048; MTP layers not "
             "listed in MODELS.md (0 assumed)"),
    _m(name="nemotron-3-nano-30b-a3b", family="nemotron-3", op="mamba2",
       hidden=2688, n_layers=52, n_ssm_layers=23, n_attn_layers=6, vocab=131072,
       dims=_shape("mamba2", nheads=64, head_dim=64, d_state=128, n_groups=8),
       attn_heads=32, attn_kv_heads=2, attn_head_dim=128, mtp_layers=0,
       pattern=None,
       notes="MoE 128 experts top-6 + 1 shared; MTP layers not listed in "
             "MODELS.md (0 assumed)"),
    # Tiny CPU models: shapes small enough for the PyTorch reference and the
    # Triton interpreter on a CPU-only machine.
    _m(name="tiny-mamba2", family="tiny", op="mamba2",
       hidden=64, n_layers=2, n_ssm_layers=2, n_attn_layers=0, vocab=256,
       dims=_shape("mamba2", nheads=4, head_dim=16, d_state=16, n_groups=2),
       attn_heads=0, attn_kv_heads=0, attn_head_dim=0, mtp_layers=0,
       pattern="MM", notes="tiny CPU test model", tiny=True),
    _m(name="tiny-gdn", family="tiny", op="gdn",
       hidden=64, n_layers=2, n_ssm_layers=2, n_attn_layers=0, vocab=256,
       dims=_shape("gdn", num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16),
       attn_heads=0, attn_kv_heads=0, attn_head_dim=0, mtp_layers=0,
       pattern=None, notes="tiny CPU test model", tiny=True),
]

MODELS: dict[str, HybridModel] = {m.name: m for m in _BASE_MODELS}

#: The four models of the study (MODELS.md), in report order.
STUDY_MODELS = ("nemotron-3-nano-4b", "nemotron-3-super-120b-a12b",
                "qwen3.5-4b", "qwen3.5-122b-a10b")

_SCALED_RE = re.compile(
    r"^(?P<base>[^@]+)@(?:d(?P<d>\d+(?:\.\d+)?))?(?:w(?P<w>\d+(?:\.\d+)?))?$")


def _fmt_factor(x: float) -> str:
    return f"{x:g}"


def scaled_name(base_name: str, depth: float = 1.0, width: float = 1.0) -> str:
    return f"{base_name}@d{_fmt_factor(depth)}w{_fmt_factor(width)}"


def _scale_count(n: int, f: float, minimum: int = 0) -> int:
    return max(minimum, int(round(n * f)))


def scaled_model(base_name: str, depth: float = 1.0, width: float = 1.0) -> HybridModel:
    """A depth/width-scaled variant of a model.

    depth scales the layer counts (total, SSM, attention; at least one SSM
    layer is kept).  width scales the SSM head count: Mamba-2 ``nheads`` (kept a
    multiple of ``n_groups``), GDN ``num_k_heads`` and ``num_v_heads`` (keeping
    their ratio).  Per-head dims, hidden size and attention are unchanged.
    """
    base = _lookup_base(base_name)
    if base.base is not None:
        raise ValueError(f"cannot scale an already scaled model {base.name!r}")
    for what, f in (("depth", depth), ("width", width)):
        if not (isinstance(f, (int, float)) and f > 0):
            raise ValueError(f"scaled_model: {what} must be > 0, got {f!r}")
    d = dict(base.dims)
    if base.op == "mamba2":
        g = d["n_groups"]
        d["nheads"] = max(g, int(round(d["nheads"] * width / g)) * g)
    else:
        ratio = d["num_v_heads"] // d["num_k_heads"]
        if ratio * d["num_k_heads"] != d["num_v_heads"]:
            raise ValueError(f"{base.name}: num_v_heads not a multiple of num_k_heads")
        nk = _scale_count(d["num_k_heads"], width, 1)
        d["num_k_heads"], d["num_v_heads"] = nk, nk * ratio
    dims = _shape(base.op, **d)
    n_ssm = _scale_count(base.n_ssm_layers, depth, 1)
    n_attn = _scale_count(base.n_attn_layers, depth, 0)
    n_layers = max(n_ssm + n_attn, _scale_count(base.n_layers, depth, 1))
    name = scaled_name(base.name, depth, width)
    return dataclasses.replace(
        base, name=name, n_layers=n_layers, n_ssm_layers=n_ssm, n_attn_layers=n_attn,
        dims=dims, pattern=base.pattern if depth == 1 else None,
        notes=f"scaled from {base.name}: depth x{depth:g}, SSM heads x{width:g}",
        base=base.name, depth=float(depth), width=float(width))


def _lookup_base(name: str) -> HybridModel:
    key = name.strip().lower()
    if key in MODELS:
        return MODELS[key]
    raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODELS)} "
                     f"(or '<model>@d<depth>w<width>' for a scaled variant)")


def get_model(name: str) -> HybridModel:
    """Look a model up by (case-insensitive) name, including scaled names.

    Raises ValueError naming the allowed names.
    """
    if not isinstance(name, str):
        raise ValueError(f"model name must be a string, got {name!r}")
    key = name.strip().lower()
    if "@" not in key:
        return _lookup_base(key)
    m = _SCALED_RE.match(key)
    if not m or (m.group("d") is None and m.group("w") is None):
        raise ValueError(f"bad scaled model name {name!r}; expected "
                         f"'<model>@d<depth>w<width>', e.g. 'nemotron-3-nano-4b@d0.5w2'")
    depth = float(m.group("d")) if m.group("d") is not None else 1.0
    width = float(m.group("w")) if m.group("w") is not None else 1.0
    if depth <= 0 or width <= 0:
        raise ValueError(f"bad scaled model name {name!r}: factors must be > 0")
    return scaled_model(m.group("base"), depth, width)


def canonical_name(name: str) -> str:
    return get_model(name).name


def models_table(names: list[str] | None = None) -> str:
    """A fixed-width text table of the models (used by ``replaybench models``)."""
    models = [get_model(n) for n in names] if names else list(MODELS.values())
    head = ["model", "op", "hidden", "layers", "ssm", "attn", "ssm dims",
            "state/layer fp32", "state/seq fp32", "state/seq bf16"]
    rows = []
    for m in models:
        rows.append([
            m.name + (" (tiny)" if m.tiny else ""), m.op, str(m.hidden), str(m.n_layers),
            str(m.n_ssm_layers), str(m.n_attn_layers), m.describe_ssm(),
            _fmt_bytes(m.state_bytes_per_layer(4)), _fmt_bytes(m.state_bytes_per_seq(4)),
            _fmt_bytes(m.state_bytes_per_seq(2)),
        ])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)),
             "  ".join("-" * w for w in widths)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    return "\n".join(lines)


def _fmt_bytes(b: float) -> str:
    if b >= MiB:
        return f"{b / MiB:.2f} MiB"
    return f"{b / 1024:.1f} KiB"
