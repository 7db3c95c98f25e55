"""replaybench.runners.kernel: the output check against the reference."""
import pytest

from replaybench.models import get_model
from replaybench.runners.kernel import check_against_reference
from replaybench.scenario import Case


@pytest.mark.parametrize("model,method,lo", [("tiny-mamba2", "replay", "none"), ("tiny-gdn", "replay", "none"),
                                             ("tiny-gdn", "replay-dual", "bfloat16")])
@pytest.mark.parametrize("batch", [1, 12])
def test_check_passes_on_every_route(model, method, lo, batch):
    # the check runs min(batch, 8) rows, which take the eager route (a flush every step) while
    # the reference buffers; the outputs agree as long as the layer's parameters stay fixed
    # across steps (a Mamba-2 buffer decays its entries with the A it is given) and, in GDN's
    # dual mode, the random buffered u agree with the v, beta a flush recomputes them from
    m = get_model(model)
    c = Case("c", "kernel", m.name, m.op, method, "triton", batch, 16, 16, 0, "float32", lo)
    assert check_against_reference(c, m, "cpu", steps=18) < (1e-4 if lo == "none" else 1e-2)
