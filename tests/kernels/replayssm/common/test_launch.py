"""The host-side launch helpers shared by the kernel modules (replayssm.common.launch)."""
import pytest
import torch

from replayssm.common.launch import pdl_meta, state_scratch, tma_rows


def test_tma_rows_where_tma_can_read():
    """Descriptors over the state as [rows, row elements], one per block shape, where TMA can
    read it (16-byte rows); pointer loads (None) when a config says no, or by default when the
    rows are not a multiple of 16 bytes; a config that asks for TMA there gets a clear error."""
    s = torch.zeros(3, 4, 8, 32)                                    # fp32 rows of 128 bytes
    d = tma_rows(s, 32, [(8, 16), (16, 16)], "TMA", None)
    assert [list(x.shape) for x in d] == [[96, 32]] * 2 and [list(x.block_shape) for x in d] == [[8, 16], [16, 16]]
    assert tma_rows(s, 32, [(8, 16)], "TMA", False) is None
    odd = torch.zeros(3, 4, 8, 12, dtype=torch.bfloat16)           # rows of 24 bytes
    assert tma_rows(odd, 12, [(8, 16)], "TMA", None) is None
    with pytest.raises(ValueError, match="config TMA=True.*multiple of 16 bytes"):
        tma_rows(odd, 12, [(8, 16)], "TMA", True)
    with pytest.raises(ValueError, match="config TMA=True"):
        tma_rows(s[:, :, :, :16], 16, [(8, 16)], "TMA", True)       # not contiguous


def test_state_scratch_is_kept_and_grown():
    """One int32 scratch per name on the state object: the same tensor while it is large
    enough, a larger one when a call needs more; the replaced one stays referenced (a CUDA
    graph captured with it keeps using its memory)."""
    class S:
        pass
    rs = S()
    a = state_scratch(rs, "_x", 5, "cpu")
    assert a.dtype == torch.int32 and a.numel() == 5 and state_scratch(rs, "_x", 3, "cpu") is a
    b = state_scratch(rs, "_x", 9, "cpu")
    assert b.numel() == 9 and rs._x is b and state_scratch(rs, "_y", 2, "cpu") is not b
    assert len(rs._scratch_retired) == 1 and rs._scratch_retired[0] is a


def test_pdl_meta_only_where_the_device_has_it():
    """Programmatic dependent launches need compute capability >= 9: the 'meta' device (offline
    sm_90 compiles) gets them, the CPU (the interpreter) does not, nor a launch that asks not to."""
    assert pdl_meta("meta") == {"GDC": True, "launch_pdl": True}
    assert pdl_meta("meta", on=False) == {"GDC": False}
    assert pdl_meta("cpu") == {"GDC": False}
    if torch.cuda.is_available():
        assert pdl_meta("cuda")["GDC"] == (torch.cuda.get_device_capability()[0] >= 9)
