"""ReplaySSM: decode for hybrid SSM/attention models that caches the SSM's recent inputs
and a periodic checkpoint instead of reading and writing the recurrent state every step.

Modules: reference (exact PyTorch oracle), state (checkpoints, buffer, cursors, bytes),
mamba2 / gdn (public ops dispatching to reference or Triton), triton (the kernels).
"""
__version__ = "0.1.0"
