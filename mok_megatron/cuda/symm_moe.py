"""The CUDA backend's MoE call: dispatch -> experts -> combine over symmetric memory.

No host synchronization anywhere in forward or backward: the per-expert row counts exist only
on the GPU. Per call, on each rank:

forward   publish x (FP8 rows under an FP8 recipe), ids, probs, T into the workspace | barrier
          schedule: every rank's routing -> per-expert row lists (GPU counting sort)
          expert stage: rows pulled from their source ranks, FC1, act * p, FC2, result rows
          pushed to (source rank, token, k) slots | barrier
          fixed-order k-sum of our own slots -> y
backward  publish dY (and x again, if recomputing) | barrier
          expert stage: dY rows pulled, dgrad with the activation backward, dX rows pushed
          with dprobs to the source slots, dW1, dW2 | barrier
          fixed-order k-sum -> dx; slot dprobs -> dprobs

The expert stage runs as separate kernels (separate_path.py, the v1 baseline) or as one
persistent kernel each way (megakernel_path.py), per the recipe's kernel.forward_kernel and
kernel.backward_kernel. Row buffers are sized for the worst case (every slot of every rank
routed here), so any skew fits; only the rows that exist are computed and moved. What
forward keeps for backward is the recipe's kernel.backward_inputs: the rows, h (and act for
the backward megakernel) themselves ("saved", worst-case sized), or only the schedule
("recomputed").
"""

from __future__ import annotations

import logging
import math
from typing import Optional

import torch
import torch.distributed as dist

from . import fp8_block_weights, megakernel_path, mxfp8_weights, ops, separate_path
from ..activations import get_activation
from ..config import (CUDA_PRECISIONS, MXFP8_ROUNDED_MIN_ROWS, Recipe, no_cuda_kernels,
                     recipe_problems, resolve_kernels)
from .expert_weights import stack_expert_pair
from ..inputs import MoECall, check_call, check_routing_values
from .main_grad import main_grad_targets, placeholder_grads
from .mxfp8_weights import layer_weights
from .operands import Bf16Operands, Fp8BlockwiseOperands, Mxfp8Operands, SegmentCodes
from .plan import ExpertInputs, Plan, Schedule, kept_h_rows
from .workspace import Workspace, WorkspaceLayout, get_workspace


_positions: dict[tuple, torch.Tensor] = {}
_said_forms: set[tuple] = set()  # mxfp8 weight forms already logged (quantized_operands)
log = logging.getLogger(__name__)


# The recipes whose expert GEMMs read quantized operands: their operands and weight quantizer
# (mxfp8's codes: quantized_operands picks by the form of its weights).
QUANTIZED_OPERANDS = {
    "mxfp8": (Mxfp8Operands, mxfp8_weights.quantize_pair),
    "fp8_blockwise": (Fp8BlockwiseOperands, fp8_block_weights.quantize_pair),
}


def _expert_position(order: list, device: torch.device) -> torch.Tensor:
    """Cached, so a call never copies from the host (CUDA-graph capture forbids it)."""
    key = (tuple(order), device)
    if key not in _positions:
        position = [0] * len(order)
        for j, e in enumerate(order):
            position[e] = j
        _positions[key] = torch.tensor(position, dtype=torch.int32, device=device)
    return _positions[key]


def schedule_rows(world: int, max_tokens: int, topk: int, capacity: float) -> int:
    """Rows a rank's schedule holds: `capacity` (kernel.schedule_capacity) of the worst case,
    every slot of every rank routed to it."""
    worst = world * max_tokens * topk
    return max(1, min(worst, math.ceil(capacity * worst)))


def _schedule(plan: Plan) -> Schedule:
    """This rank's rows from every rank's published routing (one GPU counting sort)."""
    ws = plan.ws
    rows = schedule_rows(ws.world, ws.layout.max_tokens, plan.topk, plan.schedule_capacity)
    offsets = torch.empty(plan.num_local + 1, dtype=torch.int32, device=ws.device)
    row_slot = torch.empty(rows, dtype=torch.int32, device=ws.device)
    row_prob = torch.empty(rows, dtype=torch.float32, device=ws.device)
    o = ws.offsets
    ops.build_schedule(ws.peer_bases, o["ids"], o["probs"], o["count"], ws.world,
                       ws.layout.max_tokens, plan.topk, ws.rank * plan.num_local,
                       plan.position, offsets, row_slot, row_prob)
    return Schedule(offsets, row_slot, row_prob)


class _SymmMoE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ids, probs, plan: Plan, *weights):
        ws = plan.ws
        T, K = ids.shape
        ids32 = torch.empty(T, K, dtype=torch.int32, device=x.device)
        # x as forward dispatches it: FP8 wire rows under an FP8 recipe, or x itself.
        fp8_rows = ws.layout.fp8_rows
        ops.publish_inputs(x, ids.contiguous(), probs.contiguous(), ws.buffer, ws.offsets,
                           ids32, rows=fp8_rows is None)
        if fp8_rows is not None:
            ops.publish_fp8_rows(x, ws.buffer, ws.offsets["tokens"], fp8_rows)
        ws.barrier(ops.Stage.FORWARD_PUBLISHED)
        sched = _schedule(plan)
        keep = not plan.recompute
        head_rows = kept_h_rows(plan, sched) if plan.recompute else 0
        if plan.forward_megakernel:
            kept = megakernel_path.forward(plan, sched, keep, head_rows)
            head = kept.h if plan.recompute else None
        else:
            # Recomputing with no h kept, backward makes h again: FC1 writes act alone.
            kept = separate_path.forward(plan, sched, keep_h=keep or head_rows > 0)
            head = (None if head_rows == 0 else kept.h if head_rows == sched.capacity
                    else kept.h[:head_rows].clone())
        ws.barrier(ops.Stage.FORWARD_COMBINED)

        y = torch.empty(T, x.shape[1], dtype=x.dtype, device=x.device)
        ops.reduce_slots(ws.slots(T, K), ids32, y)
        ctx.plan = plan
        ctx.probs_dtype = probs.dtype
        if plan.recompute:
            # x is the layer's input, alive anyway; nothing here is sized by the routing (h's
            # head by kernel.kept_h_tokens at most).
            ctx.save_for_backward(ids32, x, sched.offsets, sched.row_slot, sched.row_prob,
                                  head)
        else:
            # The separate backward recomputes act itself; the megakernel reads forward's rows
            # and act as they are, the separate backward wgrad's form of the rows
            # (operands.keep_rows: FP8 codes under an FP8 recipe).
            act = kept.act if plan.backward_megakernel else None
            rows = (kept.rows if plan.backward_megakernel
                    else plan.operands.keep_rows(sched, kept.rows))
            ctx.rows_as_codes = isinstance(rows, SegmentCodes)
            rows = (rows.codes, rows.scales) if ctx.rows_as_codes else (rows,)
            ctx.save_for_backward(ids32, sched.offsets, sched.row_slot, sched.row_prob,
                                  kept.h, act, *rows)
        return y

    @staticmethod
    def backward(ctx, dy):
        plan = ctx.plan
        ws = plan.ws
        if plan.recompute:
            ids32, x, offsets, row_slot, row_prob, head = ctx.saved_tensors
        else:
            ids32, offsets, row_slot, row_prob, h, act, *rows = ctx.saved_tensors
            rows = SegmentCodes(*rows) if ctx.rows_as_codes else rows[0]
        sched = Schedule(offsets, row_slot, row_prob)
        T, K = ids32.shape
        ws.tokens(T).copy_(dy)
        if plan.recompute:
            ws.inputs(T).copy_(x)
        ws.barrier(ops.Stage.BACKWARD_PUBLISHED)
        if plan.backward_megakernel:
            # Recomputing, the launch pulls x again and reruns FC1 itself, per macrobatch.
            kept = None if plan.recompute else ExpertInputs(rows, h, act)
            dw1, dw2 = megakernel_path.backward(plan, sched, kept)
        else:
            if plan.recompute:
                path = megakernel_path if plan.forward_megakernel else separate_path
                kept = path.recompute(plan, sched, head)
            else:
                kept = ExpertInputs(rows, h, act)
            dw1, dw2 = separate_path.backward(plan, sched, kept)
        ws.barrier(ops.Stage.BACKWARD_COMBINED)

        dx = torch.empty(T, dy.shape[1], dtype=dy.dtype, device=dy.device)
        ops.reduce_slots(ws.slots(T, K), ids32, dx)
        dprobs = torch.empty(T, K, dtype=torch.float32, device=dy.device)
        ops.gather_slot_values(ws.slot_values(T, K), ids32, dprobs)
        if plan.main_grads is not None:
            weight_grads = placeholder_grads(plan.main_grads)
        else:
            weight_grads = (*_split(dw1, plan.order), *_split(dw2, plan.order))
        return (dx, None, dprobs.to(ctx.probs_dtype), None, *weight_grads)


def _split(dw: torch.Tensor, order: Optional[list]):
    """Stacked gradient -> the autograd inputs it belongs to (one stacked, or per expert)."""
    if order is None:
        return (dw,)
    grads = [None] * len(order)
    for j, e in enumerate(order):
        grads[e] = dw[j]
    return tuple(grads)


def check_kernel_call(call: MoECall, recipe: Recipe) -> None:
    """What the kernels need beyond what every backend checks (inputs.check_call): before the
    workspace is allocated, so a bad input never leaves peers waiting in a rendezvous."""
    if call.x.dtype != torch.bfloat16:
        raise ValueError(f"the cuda backend runs bf16 activations and weights; x is {call.x.dtype}")
    if recipe.precision not in CUDA_PRECISIONS:
        raise NotImplementedError(no_cuda_kernels(recipe))
    problem = next(recipe_problems(recipe), None)
    if problem is not None:
        raise ValueError(f"recipe {recipe.name!r}: {problem[0]}: {problem[1]}")
    if call.activation not in ops.ACTIVATION_IDS:
        raise ValueError(f"activation {call.activation!r} is not implemented by the cuda backend")
    if call.hidden % 8 or call.ffn % 8:
        raise ValueError(f"the cuda backend needs H and F to be multiples of 8; got "
                         f"H={call.hidden}, F={call.ffn}")
    if (recipe.precision == "fp8_blockwise" and get_activation(call.activation).gated
            and call.ffn % 64):
        raise ValueError(f"recipe {recipe.name!r}: the blockwise FP8 GEMM reads a gated FC1's "
                         f"gate and up rows as whole 64-row halves of 128-row scale blocks; "
                         f"F={call.ffn} is not a multiple of 64")
    knobs = recipe.kernel
    limit = knobs.max_tokens_per_rank
    if call.tokens > limit:
        raise ValueError(
            f"{call.tokens} tokens on this rank exceed the workspace bound "
            f"kernel.max_tokens_per_rank={limit} of recipe {recipe.name!r}; raise it")
    if knobs.backward_kernel == "megakernel" and knobs.backward_inputs == "recomputed":
        ring = ops.macrobatch_mblocks(knobs.macrobatch_tokens)
        rows = schedule_rows(call.world, limit, call.topk, knobs.schedule_capacity)
        needed = ops.macrobatches(rows, call.num_local, ring)
        if needed > ops.MAX_MACROBATCHES:
            least = -(-needed // ops.MAX_MACROBATCHES) * ring * ops.MEGAKERNEL_BLOCK_M
            raise ValueError(
                f"recipe {recipe.name!r}: kernel.macrobatch_tokens={knobs.macrobatch_tokens} cuts "
                f"the schedule's worst case ({rows} rows at EP={call.world}) into {needed} "
                f"macrobatches; the backward megakernel walks at most "
                f"{ops.MAX_MACROBATCHES}: raise macrobatch_tokens to {least} or more")
    if call.world > ops.MAX_RANKS:
        raise ValueError(f"EP={call.world}: the cuda backend supports at most {ops.MAX_RANKS} GPUs")
    if call.num_local > ops.MAX_LOCAL_EXPERTS:
        raise ValueError(f"{call.num_local} experts per rank: the cuda backend supports at most "
                         f"{ops.MAX_LOCAL_EXPERTS}")


def fp8_wire_row(hidden: int, recipe: Recipe) -> Optional[ops.Fp8WireRow]:
    """The FP8 rows forward dispatches under an FP8 recipe (x quantized once at its source,
    as FC1 reads it), or None: bf16 rows. Only with recomputed backward inputs, whose wgrad
    reads the bf16 rows pulled again from `inputs`; saved inputs keep forward's bf16 rows for
    it (dW1 reads x quantized along each expert's rows, not along H). Both forward kernels
    pull them (the forward megakernel dequantizes them as it pulls under mxfp8 and keeps the
    codes under fp8_blockwise)."""
    knobs = recipe.kernel
    if recipe.precision not in QUANTIZED_OPERANDS or knobs.backward_inputs != "recomputed":
        return None
    return ops.Fp8WireRow(hidden, QUANTIZED_OPERANDS[recipe.precision][0].block)


def workspace_layout(topk: int, hidden: int, recipe: Recipe) -> WorkspaceLayout:
    return WorkspaceLayout(recipe.kernel.max_tokens_per_rank, topk, hidden,
                           inputs=recipe.kernel.backward_inputs == "recomputed",
                           fp8_rows=fp8_wire_row(hidden, recipe))


def moe_experts_cuda(call: MoECall, group: Optional[dist.ProcessGroup], recipe: Recipe,
                     accumulate_main_grad: bool = False) -> torch.Tensor:
    """A checked call (inputs.check_call) on the group's workspace, created on first use."""
    recipe = resolve_kernels(recipe, call.world)
    check_kernel_call(call, recipe)
    ws = get_workspace(group, call.x.device, workspace_layout(call.topk, call.hidden, recipe),
                       recipe.kernel.spin_timeout_ms)
    return _run(ws, call, recipe, accumulate_main_grad)


def moe_experts_on_workspace(ws: Workspace, x, ids, probs, w1, w2, *, activation: str,
                             recipe: Recipe, accumulate_main_grad: bool = False
                             ) -> torch.Tensor:
    """The cuda backend on a given workspace (one of Workspace.emulated_group's in tests): an
    entry point of its own, so it checks its inputs as moe_experts does."""
    call = check_call(x, ids, probs, w1, w2, activation=activation, world=ws.world)
    if recipe.kernel.check_inputs:
        check_routing_values(call)
    recipe = resolve_kernels(recipe, call.world)
    check_kernel_call(call, recipe)
    if not ws.layout.matches(workspace_layout(call.topk, call.hidden, recipe)):
        raise ValueError("the workspace's layout does not match this call's shapes and recipe")
    return _run(ws, call, recipe, accumulate_main_grad)


def mxfp8_weight_form(recipe: Recipe, tokens: int, topk: int, num_local: int) -> str:
    """kernel.mxfp8_weights for a call of `tokens` per rank: auto picks from the average rows
    per local expert (tokens x topk / local experts: shapes only, no device sync), or rounded
    where the backward megakernel runs (it reads no codes)."""
    form = recipe.kernel.mxfp8_weights
    if form == "auto":
        rows = tokens * topk / num_local
        form = ("rounded" if rows >= MXFP8_ROUNDED_MIN_ROWS
                or recipe.kernel.backward_kernel == "megakernel" else "codes")
    return form


def quantized_operands(recipe: Recipe, tokens: int, topk: int, num_local: int) -> tuple:
    """(operands type, weight quantizer) of a quantized recipe's call; under mxfp8 the form
    of the weights is logged once per call shape (auto picks it silently otherwise)."""
    if recipe.precision != "mxfp8":
        return QUANTIZED_OPERANDS[recipe.precision]
    form = mxfp8_weight_form(recipe, tokens, topk, num_local)
    shape = (recipe.kernel.mxfp8_weights, form, tokens, topk, num_local)
    if shape not in _said_forms:
        _said_forms.add(shape)
        log.info("mok mxfp8: weights as %s for %d tokens x top-%d over %d local experts "
                 "(%.0f rows per expert; kernel.mxfp8_weights: %s)", form, tokens, topk,
                 num_local, tokens * topk / num_local, recipe.kernel.mxfp8_weights)
    if form == "rounded":
        return Mxfp8Operands, mxfp8_weights.round_pair
    return QUANTIZED_OPERANDS["mxfp8"]


def _run(ws: Workspace, call: MoECall, recipe: Recipe, accumulate_main_grad: bool
         ) -> torch.Tensor:
    w1_stack, w2_stack, order = stack_expert_pair(call.w1, call.w2)
    knobs = recipe.kernel
    forward_megakernel = knobs.forward_kernel == "megakernel"
    backward_megakernel = knobs.backward_kernel == "megakernel"
    w_inputs = (call.w1, call.w2) if order is None else (*call.w1, *call.w2)
    main_grads = main_grad_targets(w_inputs, order) if accumulate_main_grad else None
    recompute = knobs.backward_inputs == "recomputed"
    # The megakernels' rings run only where forward keeps nothing for backward (config.py
    # says so too).
    ring_mblocks = (ops.macrobatch_mblocks(knobs.macrobatch_tokens)
                    if (forward_megakernel or backward_megakernel) and recompute else 0)
    position = _expert_position(order or list(range(call.num_local)), call.x.device)
    if recipe.precision == "bf16":
        operands = Bf16Operands()
    else:  # check_kernel_call let through only the precisions with kernels
        operands_type, quantize = quantized_operands(recipe, call.x.shape[0], call.topk,
                                                     call.num_local)
        version = sum(w._version for w in w_inputs)
        gated = get_activation(call.activation).gated
        operands = operands_type(layer_weights(w_inputs[0], w1_stack, w2_stack, version, gated,
                                               quantize))
    kept_h_tokens = ops.MEGAKERNEL_BLOCK_M * -(-knobs.kept_h_tokens // ops.MEGAKERNEL_BLOCK_M)
    plan = Plan(ws, call.activation, call.topk, call.num_local, call.ffn, w1_stack, w2_stack,
                order, position, forward_megakernel, backward_megakernel,
                knobs.comm_sms_forward, knobs.comm_sms_backward, recompute, ring_mblocks,
                knobs.minibatch_tokens, knobs.schedule_capacity, kept_h_tokens, main_grads,
                operands)
    return _SymmMoE.apply(call.x.contiguous(), call.ids, call.probs, plan, *w_inputs)
