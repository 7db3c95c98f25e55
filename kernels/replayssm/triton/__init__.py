"""Transitional: the old module paths (replayssm.triton.mamba2 / .gdn) that the suite's traffic
model and its tests still import. The kernels live in replayssm.mamba2 and replayssm.gdn; this
package goes once nothing imports it."""
