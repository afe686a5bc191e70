"""The hooks of the routed experts' modules under ``mok``, whose fused call replaces those
modules' forward: forward pre-hooks run before the call reads the weights, hooks that cannot run
are refused by name, and expert linears wrapped by PEFT are refused at the first forward."""

from __future__ import annotations

import pytest
import torch

import megatron_workers
from megatron_harness import run_distributed

pytest.importorskip("megatron.core")


@pytest.fixture(scope="module")
def out():
    (result,) = run_distributed(1, megatron_workers.expert_hooks)
    return result


def test_pre_hooks_run_before_the_weights_are_read(out):
    r = out["zeroing_pre_hooks"]
    # Every FC2 was zeroed by its pre-hook (plain and with_kwargs) before the fused call read it.
    assert torch.count_nonzero(r["y"]) == 0, "the routed experts read their weights before the hooks"
    assert r["calls"] == [f"local_experts.{i}.linear_fc2" for i in range(4)]


def test_pre_hook_that_replaces_the_input_is_refused(out):
    message = out["pre_hook_returning_input"]
    assert message is not None
    assert "mlp.experts.local_experts.0.linear_fc1 (ColumnParallelLinear)" in message
    assert "returns_input" in message and "alltoall" in message
    assert out["after_removing_it"] is None


@pytest.mark.parametrize("kind, module", [
    ("forward hook", "mlp.experts.local_experts.1.linear_fc2 (RowParallelLinear)"),
    ("backward hook", "mlp.experts (SequentialMLP)"),
    ("backward pre-hook", "mlp.experts.local_experts.0 (MLP)"),
])
def test_hooks_that_cannot_run_are_refused(out, kind, module):
    message = out["refused_hooks"][kind]
    assert message is not None, f"a {kind} on {module} was silently skipped"
    assert f"{kind} (register_" in message and f"on {module}" in message
    assert "alltoall" in message
    assert out["refused_hooks"][f"{kind}, removed"] is None


@pytest.mark.parametrize("wrapper, what", [
    ("StandInLoRALinear", "a StandInLoRALinear wrapping ColumnParallelLinear (a PEFT adapter"),
    ("WeightOnlyByProperty", "a WeightOnlyByProperty without its own weight Parameter"),
])
def test_wrapped_expert_linears_are_refused(out, wrapper, what):
    message = out["wrapped_linears"][wrapper]
    assert message is not None, f"{wrapper} on an expert's linear_fc1 was accepted"
    assert message.startswith(f"mlp.experts.local_experts.0.linear_fc1 is {what}")
    assert "target_modules" in message and "--moe-token-dispatcher-type alltoall" in message


def test_expert_structure_is_checked_once_per_layer(out):
    assert out["structure_checks_in_three_forwards"] == 1


def test_ensure_params_ready_gets_the_expert_weights_after_the_pre_hooks(out):
    r = out["ensure_params_ready"]
    assert r["events"] == ["pre-hook", r["expert_params"]]
    assert len(r["expert_params"]) == 8  # FC1 and FC2 of 4 experts


def test_frozen_experts_run(out):
    # PEFT that adapts non-expert modules leaves the experts frozen: mok must still run them.
    ref, mok = out["frozen_experts"]["alltoall"], out["frozen_experts"]["mok"]
    torch.testing.assert_close(mok["y"], ref["y"])
    torch.testing.assert_close(mok["dx"], ref["dx"])
    assert all(g is None for g in mok["expert_grads"])
