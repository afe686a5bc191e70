"""The backward megakernel (kernel.backward_kernel: megakernel) on one GPU: EP=1 and the
emulated EP=2/4 group. dx, dprobs, dW1, dW2 (and y) against the reference on uniform, skewed
and adversarial routings, experts without rows, F and H not multiples of the tile, outputs
poisoned first; bit-identical over runs, across numbers of dY-pulling blocks, minibatches and
macrobatch sizes (the ring with recomputed inputs, down to one m-block per macrobatch, where
every expert's weight gradient is carried across macrobatches), saved against recomputed
backward inputs; CUDA-graph replay with new inputs; the ring's memory does not grow with the
schedule's worst case."""

import pytest
import torch

import gpu_checks
from mok_megatron.functional import moe_experts
from mok_megatron.testing import ProblemSpec, rel_l2, run_layer
from test_symm_moe import SPECS

pytestmark = pytest.mark.gpu

BACKWARD = {"backward_kernel": "megakernel", "comm_sms_backward": 8, "backward_inputs": "saved"}
MEGAKERNEL_PATH = {**BACKWARD, "forward_kernel": "megakernel", "comm_sms_forward": 8}
RING = {**MEGAKERNEL_PATH, "backward_inputs": "recomputed", "macrobatch_tokens": 256}
# One m-block per macrobatch: an expert of several m-blocks has a part in each, the middle
# ones carried in and out.
RING_ONE_MBLOCK = {**RING, "macrobatch_tokens": 128}
# The backward megakernel's own ring, after the separate forward.
RING_SEPARATE_FORWARD = {**BACKWARD, "backward_inputs": "recomputed", "macrobatch_tokens": 256}
SETTINGS = {"megakernel_path": MEGAKERNEL_PATH, "separate_forward": BACKWARD, "ring": RING,
            "ring_one_mblock": RING_ONE_MBLOCK, "ring_separate_forward": RING_SEPARATE_FORWARD}

# Sizes off every tile edge: H and F multiples of 8 only (FC2-dgrad tiles are 128 columns
# of F, FC1-dgrad and wgrad tiles 256 columns, wgrad reductions 64 rows at a time), and top-1
# routing whose experts end mid-k-block.
ODD_SPECS = [
    ProblemSpec("odd_sizes", (700,), num_experts=6, hidden=200, ffn=104, topk=3,
                dtype=torch.bfloat16, probs_dtype=torch.float32, routing="zipf", seed=7),
    ProblemSpec("odd_top1", (333,), num_experts=5, hidden=328, ffn=136, topk=1,
                dtype=torch.bfloat16, probs_dtype=torch.float32, routing="zipf", seed=8),
    ProblemSpec("odd_relu", (300,), num_experts=3, hidden=136, ffn=264, topk=2,
                dtype=torch.bfloat16, probs_dtype=torch.float32, activation="squared_relu",
                seed=9),
]


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("spec", SPECS + ODD_SPECS, ids=lambda s: s.name)
def test_matches_reference_and_is_deterministic(spec, setting):
    errors = gpu_checks.check_against_reference(spec, 0, None, **SETTINGS[setting])
    print(spec.name, setting, {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("spec", SPECS[:3] + ODD_SPECS[:1], ids=lambda s: s.name)
def test_bit_identical_across_settings_and_inputs(spec):
    """Pulling blocks, minibatches and saved vs recomputed inputs change who does the work
    and when, never the bits; reported, not asserted: whether the separate backward (another
    dprob summation order) gives the same bits."""
    problem = spec.build()
    max_tokens = max(spec.tokens_per_rank)
    settings = [MEGAKERNEL_PATH, {**MEGAKERNEL_PATH, "comm_sms_backward": 1},
                {**MEGAKERNEL_PATH, "comm_sms_backward": 32, "minibatch_tokens": 37},
                {**MEGAKERNEL_PATH, "backward_inputs": "recomputed"}, RING, RING_ONE_MBLOCK,
                {**RING_ONE_MBLOCK, "comm_sms_backward": 1, "minibatch_tokens": 37},
                RING_SEPARATE_FORWARD]
    runs = [gpu_checks.run_cuda(problem, 0, None, max_tokens, **k) for k in settings]
    for knobs, run in zip(settings[1:], runs[1:]):
        gpu_checks.assert_same_bits(runs[0], run, f"({spec.name}) between {settings[0]} and "
                                    f"{knobs}")
    separate = gpu_checks.run_cuda(problem, 0, None, max_tokens, forward_kernel="megakernel",
                                   backward_inputs="saved")
    print(spec.name, "megakernel backward == separate bitwise:",
          {n: torch.equal(runs[0][n], separate[n]) for n in gpu_checks.NAMES})


@pytest.mark.parametrize("setting", ["megakernel_path", "ring", "ring_one_mblock"])
def test_cuda_graph_replay(setting):
    gpu_checks.check_cuda_graph(SPECS[1], 0, None, **SETTINGS[setting])


NAMES = [s.name for s in gpu_checks.ep_specs(2)]


@pytest.mark.parametrize("index", range(len(NAMES)), ids=NAMES)
@pytest.mark.parametrize("world", [2, 4])
def test_emulated_group_matches_reference(world, index):
    spec = gpu_checks.ep_specs(world)[index]
    errors = gpu_checks.check_emulated_against_reference(spec, **MEGAKERNEL_PATH)
    print(f"EP={world}", spec.name, {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("world", [2, 4])
def test_emulated_group_bit_identical_across_settings(world):
    spec = gpu_checks.ep_specs(world)[3]  # ragged, one rank without tokens
    gpu_checks.check_emulated_settings(spec, [
        MEGAKERNEL_PATH, {**MEGAKERNEL_PATH, "comm_sms_backward": 3},
        {**MEGAKERNEL_PATH, "backward_inputs": "recomputed"}, RING, RING_ONE_MBLOCK])


@pytest.mark.parametrize("world", [2, 4])
def test_emulated_cuda_graph_replay(world):
    gpu_checks.check_emulated_cuda_graph(gpu_checks.ep_specs(world)[1], **MEGAKERNEL_PATH)


def _run_into_main_grads(problem, layout: str, flag: bool, seed: int = 11,
                         knobs: dict = MEGAKERNEL_PATH):
    """One fwd+bwd with accumulate_main_grad=True on weights that carry fp32 main_grads (random
    start values) as Megatron's DDP gives them; `flag`: the weights carry DDP's
    grad_added_to_main_grad. -> (start, main_grads after, the weights, y and the gradients)."""
    device = torch.device("cuda", torch.cuda.current_device())
    inputs = problem.local(0, device)
    rec = gpu_checks.recipe(max(problem.spec.tokens_per_rank), **knobs)
    g = torch.Generator(device="cuda").manual_seed(seed)
    start, weights = {}, {}
    gpu_checks.poison(device)

    def layer(x, ids, probs, w1, w2):
        for name, w in (("w1", w1), ("w2", w2)):
            ws = w if layout == "stacked" else gpu_checks.per_expert(w, layout)
            start[name] = torch.randn(w.shape, device="cuda", generator=g) * 0.01
            for e, t in enumerate([ws] if layout == "stacked" else ws):
                t.main_grad = (start[name] if layout == "stacked" else start[name][e]).clone()
                if flag:
                    t.grad_added_to_main_grad = False
            weights[name] = ws
        return moe_experts(x, ids, probs, weights["w1"], weights["w2"],
                           activation=problem.spec.activation, recipe=rec,
                           accumulate_main_grad=True)

    out = run_layer(layer, inputs)
    after = {}
    for name, ws in weights.items():
        after[name] = (ws.main_grad if layout == "stacked"
                       else torch.stack([t.main_grad for t in ws])).cpu()
    return {n: t.cpu() for n, t in start.items()}, after, weights, out


# The backwards whose weight gradients go into main_grad: the megakernel's tiles, and the
# separate backward's weight-gradient launch (ops.grouped_wgrad_accumulate) on every recipe,
# after either forward.
MAIN_GRAD_BACKWARDS = {
    "megakernel": MEGAKERNEL_PATH,
    "separate": {"forward_kernel": "megakernel", "backward_inputs": "saved"},
    "separate_recomputed": {},
    "separate_mxfp8": {"precision": "mxfp8"},
    "separate_fp8_blockwise": {"precision": "fp8_blockwise"},
}
# main_grad's change against the reference's dW: the reference rounds dW to bf16 (~1.1e-3
# rel-L2 by itself), main_grad's is not; under an FP8 recipe the kernel tolerance of the recipe.
MAIN_GRAD_VS_REFERENCE = {"bf16": 4e-3, "mxfp8": gpu_checks.TOLERANCE["mxfp8"],
                          "fp8_blockwise": gpu_checks.TOLERANCE["fp8_blockwise"]}


@pytest.mark.parametrize("backward", MAIN_GRAD_BACKWARDS)
@pytest.mark.parametrize("layout", ["stacked", "views", "reversed_views", "separate"])
def test_weight_gradients_accumulate_into_main_grad(layout, backward):
    """accumulate_main_grad (Megatron's gradient-accumulation fusion): the weight-gradient
    tiles add dW into each weight's fp32 main_grad once, in place - the change matches the
    bf16 gradients of the same backward within bf16 rounding and the reference within the
    kernel tolerance, an expert without rows leaves its main_grad's bits untouched, and two
    runs give the same bits; autograd gets Megatron's placeholders with
    grad_added_to_main_grad set (so DDP skips its add); dx and dprobs are the bf16 path's."""
    knobs = MAIN_GRAD_BACKWARDS[backward]
    precision = knobs.get("precision", "bf16")
    spec = SPECS[3]  # empty_expert: the last expert gets no rows
    problem = spec.build()
    max_tokens = max(spec.tokens_per_rank)
    bf16 = gpu_checks.run_cuda(problem, 0, None, max_tokens, **knobs)
    reference = gpu_checks.run_cuda(problem, 0, None, max_tokens, backend="reference",
                                    precision=precision)
    start, after, weights, out = _run_into_main_grads(problem, layout, flag=True, knobs=knobs)
    _, again, _, _ = _run_into_main_grads(problem, layout, flag=True, knobs=knobs)
    for name in ("dx", "dprobs"):
        assert torch.equal(out[name], bf16[name]), name
    for name in ("w1", "w2"):
        added = after[name] - start[name]
        err = rel_l2(added, bf16["d" + name].float())
        assert err < 1e-2, (name, err)
        ref_err = rel_l2(added, reference["d" + name].float())
        assert ref_err < MAIN_GRAD_VS_REFERENCE[precision], (name, ref_err)
        empty = added.flatten(1).abs().sum(1) == 0
        assert empty.any() and bool((bf16["d" + name].flatten(1).abs().sum(1) == 0)[empty].all())
        assert torch.equal(after[name][empty], start[name][empty]), name
        assert torch.equal(after[name], again[name]), f"{name}.main_grad differs between runs"
        for t in ([weights[name]] if layout == "stacked" else weights[name]):
            assert t.grad_added_to_main_grad is True
        print(backward, layout, name, f"main_grad change vs bf16 dW rel-L2 {err:.2e}, vs reference "
              f"{ref_err:.2e}")


def test_main_grad_without_ddp_flag_leaves_no_gradient():
    """Weights with a main_grad but without DDP's grad_added_to_main_grad (nothing would skip
    an add): the gradient is in main_grad only and autograd gets None, as Megatron's linears."""
    problem = SPECS[0].build()
    start, after, _, out = _run_into_main_grads(problem, "stacked", flag=False)
    assert not out["dw1"].any() and not out["dw2"].any()  # layer_outputs: zeros for None
    assert not torch.equal(after["w1"], start["w1"])


def test_main_grad_through_the_ring_matches_saved():
    """Recomputing through the ring, the weight-gradient tiles carried across macrobatches add
    the same sums into main_grad as the saved setting's single pass, bit for bit."""
    problem = SPECS[1].build()  # zipf: experts of several m-blocks, one macrobatch each
    _, saved, _, saved_out = _run_into_main_grads(problem, "stacked", flag=True)
    _, ring, _, ring_out = _run_into_main_grads(problem, "stacked", flag=True,
                                                knobs=RING_ONE_MBLOCK)
    for name in ("w1", "w2"):
        assert torch.equal(saved[name], ring[name]), f"{name}.main_grad differs"
    for name in ("y", "dx", "dprobs"):
        assert torch.equal(saved_out[name], ring_out[name]), name


def _peak_bytes(problem, max_tokens: int, knobs: dict) -> int:
    """Peak memory allocated by one fwd+bwd beyond what was allocated before it (the
    workspace, created by a first call, included in that)."""
    device = torch.device("cuda", torch.cuda.current_device())
    gpu_checks.run_cuda(problem, 0, None, max_tokens, **knobs)
    rec = gpu_checks.recipe(max_tokens, **knobs)
    inputs = problem.local(0, device)

    def layer(x, ids, probs, w1, w2):
        return moe_experts(x, ids, probs, w1, w2, activation=problem.spec.activation,
                           recipe=rec)

    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    run_layer(layer, inputs, cpu=False)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def test_ring_memory_does_not_grow_with_the_worst_case():
    """With recomputed inputs the megakernels' buffers are their rings: a 16x larger
    workspace bound (max_tokens_per_rank, the schedule's worst case) adds only the schedule's
    own 8 bytes per row and the counters - at most 32 bytes per worst-case row - to a
    fwd+bwd's peak, where saved inputs add their rows, h and act (checked, so the measure can
    fail)."""
    problem = SPECS[1].build()
    tokens = max(problem.spec.tokens_per_rank)
    worst_rows = 15 * tokens * problem.spec.topk  # the schedule's growth
    # 8 m-blocks per macrobatch: the larger bound's schedule stays within the 256 macrobatches
    # a launch can walk (at 2 it would need 297, refused by name).
    ring = {**RING, "macrobatch_tokens": 1024}
    growth = {name: _peak_bytes(problem, 16 * tokens, knobs) - _peak_bytes(problem, tokens, knobs)
              for name, knobs in (("ring", ring), ("saved", MEGAKERNEL_PATH))}
    print({k: f"{v / worst_rows:.1f} B per worst-case row" for k, v in growth.items()})
    assert growth["ring"] <= 32 * worst_rows, growth
    assert growth["saved"] > 32 * worst_rows, growth
