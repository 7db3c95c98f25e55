"""replaybench: benchmark and roofline suite for ReplaySSM decode.

Data flow: scenario -> cases -> runner -> rows -> store -> report.
Submodules are imported lazily so that ``replaybench models`` or a scenario
validation error never pays for importing torch.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
