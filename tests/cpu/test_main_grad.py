"""When the weight gradients go into Megatron's main_grad (mok_megatron/cuda/main_grad.py), and what
autograd gets then. The kernel side (the backward megakernel's in-place fp32 adds) is tested on
a GPU: tests/gpu/test_backward_megakernel.py, tests/gpu/test_megatron_graph_replay.py."""

import logging

import pytest
import torch

from mok_megatron.cuda import main_grad
from mok_megatron.cuda.main_grad import main_grad_targets, placeholder_grads

E, F1, H, F = 3, 8, 4, 4


def _with_main_grads(tensors, dtype=torch.float32, flag=True):
    for t in tensors:
        t.main_grad = torch.zeros(t.shape, dtype=dtype)
        if flag:
            t.grad_added_to_main_grad = False
    return tensors


def _per_expert(**kw):
    w1 = _with_main_grads([torch.randn(F1, H, dtype=torch.bfloat16) for _ in range(E)], **kw)
    w2 = _with_main_grads([torch.randn(H, F, dtype=torch.bfloat16) for _ in range(E)], **kw)
    return w1, w2


def test_stacked_rows_in_order():
    w1, w2 = _with_main_grads([torch.randn(E, F1, H, dtype=torch.bfloat16),
                               torch.randn(E, H, F, dtype=torch.bfloat16)])
    targets = main_grad_targets((w1, w2), None)
    assert targets.params == (w1, w2)
    base, row = w1.main_grad.data_ptr(), F1 * H * 4
    assert targets.dw1.tolist() == [base + e * row for e in range(E)]
    assert targets.dw2.dtype == torch.int64 and targets.dw2.numel() == E


def test_per_expert_in_stacked_order_and_cached():
    w1, w2 = _per_expert()
    order = [2, 0, 1]
    targets = main_grad_targets((*w1, *w2), order)
    assert targets.params == (*w1, *w2)
    assert targets.dw1.tolist() == [w1[e].main_grad.data_ptr() for e in order]
    assert targets.dw2.tolist() == [w2[e].main_grad.data_ptr() for e in order]
    again = main_grad_targets((*w1, *w2), order)
    assert again.dw1 is targets.dw1  # no host copy on later calls (CUDA-graph capture)


def test_not_fused_without_main_grad():
    w1, w2 = _per_expert()
    del w2[1].main_grad
    assert main_grad_targets((*w1, *w2), [0, 1, 2]) is None


def test_bf16_main_grad_not_fused_said_once(caplog, monkeypatch):
    monkeypatch.setattr(main_grad, "_said", set())  # what earlier tests said is forgotten
    w1, w2 = _per_expert(dtype=torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="mok_megatron.cuda.main_grad"):
        for _ in range(2):
            assert main_grad_targets((*w1, *w2), [0, 1, 2]) is None
    said = [r.getMessage() for r in caplog.records if "DDP adds them" in r.getMessage()]
    assert len(said) == 1, said
    assert "non-fp32" in said[0]


@pytest.mark.parametrize("bad", ["shape", "contiguity"])
def test_malformed_main_grad_refused(bad):
    w1, w2 = _per_expert()
    w1[1].main_grad = (torch.zeros(F1, H + 1) if bad == "shape"
                       else torch.zeros(H, F1).t())
    with pytest.raises(ValueError, match="main_grad"):
        main_grad_targets((*w1, *w2), [0, 1, 2])


def test_placeholders_follow_megatron():
    w1, w2 = _per_expert()
    w2[0].zero_out_wgrad = True
    del w2[2].grad_added_to_main_grad
    targets = main_grad_targets((*w1, *w2), [0, 1, 2])
    grads = placeholder_grads(targets)
    assert [g is None for g in grads] == [False] * 5 + [True]
    assert all(g.shape == p.shape and g.dtype == p.dtype for g, p in zip(grads[:5], targets.params[:5]))
    assert torch.equal(grads[3], torch.zeros(H, F, dtype=torch.bfloat16))
    assert all(p.grad_added_to_main_grad is True for p in (*w1, w2[0], w2[1]))
    assert not hasattr(w2[2], "grad_added_to_main_grad")
