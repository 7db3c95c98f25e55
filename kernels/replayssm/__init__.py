"""ReplaySSM: decode for hybrid SSM/attention models that caches the SSM's recent inputs
and a periodic checkpoint instead of reading and writing the recurrent state every step.

Families (one package each: public ops in __init__, reference.py, one file per algorithm with
its Triton kernels and planner, table.py, options.py, plan.py): mamba2, gdn; perdraft (the
per-draft-state speculative baseline). Shared: common (Triton helpers, Launch, the launch-table
schema, offline sm_90 compile, backends), reference (the exact PyTorch oracle of every family,
one namespace), state (checkpoints, buffer, cursors), accounting (byte counting), inputs
(shapes and random inputs), layers (decode layers around the ops).
"""
__version__ = "0.1.0"
