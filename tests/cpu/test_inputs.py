"""A call is checked once, at the API boundary, before anything is allocated: the CUDA path's
own requirements (inputs.check_call, then symm_moe.check_kernel_call) are checked before its
workspace - a collective rendezvous - exists, so a bad input on one rank fails on that rank
with its message. Checked on CPU tensors: every check here is shapes, dtypes and sizes."""

import pytest
import torch

from mok_megatron.cuda import symm_moe
from mok_megatron.config import KernelKnobs, Recipe
from mok_megatron.inputs import check_call
from mok_megatron.testing import ProblemSpec


def _tensors(hidden=32, dtype=torch.bfloat16, tokens=6):
    p = ProblemSpec("inputs", (tokens,), num_experts=4, hidden=hidden, ffn=16,
                    dtype=dtype).build().local(0)
    return p["x"], p["ids"], p["probs"], p["w1"], p["w2"]


def _call(world=1, **kw):
    return check_call(*_tensors(**kw), activation="swiglu", world=world)


@pytest.fixture
def no_workspace(monkeypatch):
    def allocate(*args, **kwargs):
        raise AssertionError("the workspace was allocated before the inputs were checked")

    monkeypatch.setattr(symm_moe, "get_workspace", allocate)


@pytest.mark.parametrize(
    "call, recipe, match",
    [
        (lambda: _call(dtype=torch.float32), Recipe(), "runs bf16 activations and weights"),
        (lambda: _call(tokens=9), Recipe(kernel=KernelKnobs(max_tokens_per_rank=8)),
         "9 tokens on this rank exceed the workspace bound kernel.max_tokens_per_rank=8"),
        (lambda: _call(hidden=36), Recipe(), "H and F to be multiples of 8; got H=36"),
        (lambda: _call(world=9), Recipe(), "supports at most 8 GPUs"),
        # 16384 tokens x top-2 at 128 rows per macrobatch: 261 > 256 macrobatches.
        (lambda: _call(), Recipe(kernel=KernelKnobs(
            backward_kernel="megakernel", backward_inputs="recomputed", macrobatch_tokens=128)),
         "macrobatch_tokens=128 cuts the schedule's worst case \\(32768 rows at EP=1\\) into "
         "261 macrobatches; the backward megakernel walks at most 256: raise macrobatch_tokens "
         "to 256 or more"),
    ],
    ids=["fp32", "too-many-tokens", "h-not-multiple-of-8", "ep9", "macrobatches"],
)
def test_kernel_requirements_fail_before_the_workspace(no_workspace, call, recipe, match):
    with pytest.raises(ValueError, match=match):
        symm_moe.moe_experts_cuda(call(), None, recipe)
