"""What the kernel families (replayssm.mamba2, replayssm.gdn, replayssm.perdraft) share:
jit (shared @triton.jit helpers), mma (exact-product tl.dot helpers), launch (the recorded
Launch and host-side launch helpers), table (the one launch-table schema and Options base),
offline (sm_90 compile of a Launch without a GPU), backends (the backend argument)."""
