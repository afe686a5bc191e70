"""A few training steps of a small Megatron ``GPTModel`` with MoE layers, wrapped the way
Megatron's training loop wraps it: ``Float16Module`` (bf16), ``DistributedDataParallel`` with the
distributed optimizer and overlapped parameter all-gather / gradient reduce-scatter,
``get_megatron_optimizer``, and the no-pipelining schedule with DDP's ``no_sync`` and
``finalize_model_grads``. Runs on gloo ranks (see megatron_harness.run_distributed); what each
step leaves is returned for the tests to compare across ranks and dispatchers.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from megatron_harness import NUM_EXPERTS, base_config, cuda_calls_on_cpu

VOCAB = 64
SEQUENCE = 8
MICRO_BATCH = 2
MICROBATCHES = 2
LAYERS = 2
# Small buckets (in elements) so that the dense and the expert parameters span several DDP
# buckets each, and the all-gather of one bucket is started in the pre-hook of the one before.
BUCKET_SIZE = 400
# Adam's first steps are about lr * sign(gradient) wherever |gradient| >> eps: with the default
# eps (1e-8) a bf16-rounding difference in a near-zero gradient flips a whole step. An eps above
# these gradients (|g| <= ~1e-3 here) makes the update a smooth function of the gradient, so that
# the weights of two dispatchers differ as their gradients do; lr makes the updates many bf16
# units of the weights (~0.02) in size.
LR = 3e-2
ADAM_EPS = 1e-3


def _gpt_model(dispatcher: str, expert_model_parallel_size: int, seed: int):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    config = base_config(
        dispatcher,
        expert_model_parallel_size,
        num_layers=LAYERS,
        gated_linear_unit=True,
        activation_func=F.silu,
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=1e-2,
        moe_router_dtype="fp32",
        bf16=True,
        params_dtype=torch.bfloat16,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
    )
    torch.manual_seed(seed)
    spec = get_gpt_layer_local_spec(num_experts=NUM_EXPERTS, moe_grouped_gemm=False)
    model = GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQUENCE,
                     position_embedding_type="rope")
    return config, model


def _batches(steps: int):
    """The same token batches under every dispatcher; different on every data-parallel rank."""
    from megatron.core import parallel_state

    generator = torch.Generator().manual_seed(1000 + parallel_state.get_data_parallel_rank())
    mask = torch.tril(torch.ones(1, 1, SEQUENCE, SEQUENCE)) < 0.5  # True = masked out
    for _ in range(steps * MICROBATCHES):
        tokens = torch.randint(0, VOCAB, (MICRO_BATCH, SEQUENCE + 1), generator=generator)
        yield dict(
            input_ids=tokens[:, :-1],
            labels=tokens[:, 1:],
            position_ids=torch.arange(SEQUENCE).expand(MICRO_BATCH, SEQUENCE),
            attention_mask=mask,
        )


def _forward_step(data_iterator, model):
    batch = next(data_iterator)
    losses = model(batch["input_ids"], batch["position_ids"], batch["attention_mask"],
                   labels=batch["labels"])
    return losses, functools.partial(_loss, losses.numel())


def _loss(num_tokens: int, losses: torch.Tensor):
    loss = losses.float().sum() / num_tokens
    return loss, {"lm loss": loss.detach().clone()}


def _expert_weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()
            if ".experts.local_experts." in name}


def _expert_grad_hooks_fired(ddp) -> tuple[int, int]:
    """(expert Parameters whose DDP gradient hook fired in the last microbatch, all of them)."""
    groups = ddp.expert_parallel_bucket_groups
    return (sum(len(g.per_param_grad_ready_counts) for g in groups),
            sum(len(g.params) for g in groups))


def _gathers_in_flight(ddp) -> int:
    """Bucket groups whose parameter all-gather was started and never waited on."""
    return sum(g.param_gather_handle is not None
               for g in ddp.bucket_groups + ddp.expert_parallel_bucket_groups)


def train(dispatcher: str, align_param_gather: bool, steps: int, seed: int = 1234) -> dict:
    """``steps`` training steps, then one forward-only pass. After each forward (the point at
    which the model has read its weights) the local expert weights are recorded, so record k holds
    the weights after k optimizer steps as the forward used them."""
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.module import Float16Module

    ep = parallel_state.get_expert_model_parallel_world_size()
    config, model = _gpt_model(dispatcher, ep, seed)
    model = Float16Module(config, model)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=True,
        overlap_param_gather=True,
        align_param_gather=align_param_gather,
        use_distributed_optimizer=True,
        bucket_size=BUCKET_SIZE,
    )
    ddp = DistributedDataParallel(config, ddp_config, model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=LR, adam_eps=ADAM_EPS, weight_decay=0.0, bf16=True,
                        use_distributed_optimizer=True, clip_grad=1.0),
        [ddp],
    )
    # As megatron.training.training.train sets them up.
    config.no_sync_func = ddp.no_sync
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    if align_param_gather:
        # The interleaved schedule (the only one Megatron allows align_param_gather with) calls
        # this before the first microbatch; the no-pipelining schedule used here does not.
        config.param_sync_func = ddp.start_param_sync

    forward_backward = get_forward_backward_func()
    batches = _batches(steps + 1)
    weights, losses, in_flight, grad_hooks = [], [], [], []
    for step in range(steps + 1):
        training = step < steps
        if training:
            ddp.zero_grad_buffer()
            optimizer.zero_grad()
        if align_param_gather:
            config.param_sync_func(ddp.parameters())
        reduced = forward_backward(
            forward_step_func=_forward_step,
            data_iterator=batches,
            model=[ddp],
            num_microbatches=MICROBATCHES,
            seq_length=SEQUENCE,
            micro_batch_size=MICRO_BATCH,
            forward_only=not training,
        )
        weights.append(_expert_weights(ddp))
        in_flight.append(_gathers_in_flight(ddp))
        losses.append(torch.stack([r["lm loss"] for r in reduced]))
        if training:
            grad_hooks.append(_expert_grad_hooks_fired(ddp))
            update_successful, _, _ = optimizer.step()
            assert update_successful
    return {
        "expert_rank": parallel_state.get_expert_model_parallel_rank(),
        "expert_data_parallel_rank": parallel_state.get_expert_data_parallel_rank(),
        "expert_bucket_groups": len(ddp.expert_parallel_bucket_groups),
        "weights": weights,
        "losses": losses,
        "gathers_in_flight": in_flight,
        "grad_hooks": grad_hooks,
    }


def train_variants(variants: list[tuple[str, bool]], steps: int) -> dict:
    with cuda_calls_on_cpu():
        return {variant: train(*variant, steps=steps) for variant in variants}
