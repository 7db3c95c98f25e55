"""Triton kernels behind the public ops (replayssm.mamba2, replayssm.gdn)."""
