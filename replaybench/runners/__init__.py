"""Runner registry and the runner contract.

A runner is anything with ``run(case, ctx) -> dict`` (a module or an object).
It returns metric columns (median_us, iqr_us, samples, bytes_model, ...), raises
on failure (the sweep records a status='error' row and goes on), or raises
:class:`SkipCase` to record a status='skipped' row with the reason.

Names resolve, in order:
  * runners registered with :func:`register` (tests use this);
  * built-in names 'kernel', 'layer', 'e2e', 'drift' -> module
    ``replaybench.runners.<name>`` imported lazily (so TRITON_INTERPRET can be
    set first);
  * ``'package.module:Attr'`` -> ``Attr`` from that module; a class is
    instantiated without arguments, a function is used as ``run``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


BUILTIN_RUNNERS = {
    "kernel": "replaybench.runners.kernel",
    "layer": "replaybench.runners.layer",
    "e2e": "replaybench.runners.e2e",
    "drift": "replaybench.runners.drift",
}


# Case and TimingConfig are replaybench.scenario's; named in annotations only, so that the
# scenario module (which resolves registered runner names) and this one do not import each other.

@dataclass
class RunContext:
    device: str                              # torch device string: 'cpu', 'cuda', 'cuda:0'
    timing: "TimingConfig"
    ceilings: dict = field(default_factory=dict)   # copy_gbps, read_gbps, matmul_tflops
    device_name: str = ""                    # GPU name or CPU model (informational)


class Runner(Protocol):
    def run(self, case: Case, ctx: RunContext) -> dict: ...


class RunnerError(RuntimeError):
    """A runner name that cannot be resolved (unknown, or its module is missing)."""


class SkipCase(Exception):
    """Raise from a runner to record the case as status='skipped' with this reason."""


class _FunctionRunner:
    def __init__(self, fn: Callable[[Case, RunContext], dict], name: str):
        self._fn = fn
        self.name = name

    def run(self, case: Case, ctx: RunContext) -> dict:
        return self._fn(case, ctx)


_REGISTRY: dict[str, Any] = {}


def register(name: str, runner: Any) -> None:
    """Register a runner object/class/function under ``name`` (overrides built-ins)."""
    _REGISTRY[name] = _as_runner(runner, name)


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def available() -> list[str]:
    return sorted(set(BUILTIN_RUNNERS) | set(_REGISTRY))


def _as_runner(obj: Any, name: str) -> Any:
    if isinstance(obj, type):
        obj = obj()
    if callable(getattr(obj, "run", None)):
        return obj
    if callable(obj):
        return _FunctionRunner(obj, name)
    raise RunnerError(f"runner {name!r}: {obj!r} has no run(case, ctx)")


def _import(modname: str, name: str):
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name and (modname == e.name or modname.startswith(e.name + ".")):
            raise RunnerError(
                f"runner {name!r} is not available: module {modname} does not exist "
                f"(yet); available runners: {', '.join(available())}") from None
        raise RunnerError(f"runner {name!r}: importing {modname} failed: "
                          f"ModuleNotFoundError: {e}") from e
    except Exception as e:
        raise RunnerError(f"runner {name!r}: importing {modname} failed: "
                          f"{type(e).__name__}: {e}") from e


def get(name: str) -> Runner:
    """Resolve a runner name to an object with ``run(case, ctx)``.  Raises RunnerError."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in BUILTIN_RUNNERS:
        mod = _import(BUILTIN_RUNNERS[name], name)
        if not callable(getattr(mod, "run", None)):
            raise RunnerError(f"runner {name!r}: module {mod.__name__} has no run(case, ctx)")
        return mod
    if ":" in name:
        modname, _, attr = name.partition(":")
        mod = _import(modname, name)
        try:
            obj = getattr(mod, attr)
        except AttributeError:
            raise RunnerError(f"runner {name!r}: module {modname} has no attribute {attr!r}") from None
        runner = _as_runner(obj, name)
        _REGISTRY[name] = runner
        return runner
    raise RunnerError(f"unknown runner {name!r}; allowed: {', '.join(available())}, "
                      f"or 'package.module:Attr'")
