"""A training step through Megatron's MoELayer with mok's kernels gives the gradients the
reference backend (mok_megatron/reference/moe.py) gives, on one GPU (EP=1).

Two copies of the same small GPT-MoE (test_megatron_graph_replay.py's model: Megatron's local
spec, bf16, SwiGLU experts and a shared expert, DDP with fp32 gradient buffers) train for
ITERATIONS iterations of MICROBATCHES microbatches with the same batches: one with the recipe
under test on the CUDA backend, one whose dispatchers run the same recipe on the reference
backend. Each iteration starts both from the same weights (the reference model takes the
kernel model's, which took an SGD step from its own gradients after the iteration before), and
the per-token losses and every parameter's main_grad are compared (rel-L2). The kernels must
have run (launch counts), so the test cannot pass on the reference path twice.

    python -m pytest tests/gpu/test_megatron_moe_layer_vs_reference.py -q -s
    python tests/gpu/test_megatron_moe_layer_vs_reference.py --case NAME
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_megatron_graph_replay as model_setup  # noqa: E402

PASSED = "MOE LAYER: KERNELS MATCH THE REFERENCE BACKEND"
ITERATIONS = 3

# Kernel knobs and precision of each case; bound: the largest rel-L2 of a main_grad or of the
# per-token losses against the reference backend. Op-level the kernels are within 2e-3
# (bf16) / 5e-3 (mxfp8) of the reference; through two layers of attention and MoE and an
# update between iterations the difference grows by a few times.
CASES = {
    "separate": dict(knobs={}, precision="bf16", launched="grouped_mm", bound=2e-2),
    "megakernels": dict(knobs={"forward_kernel": "megakernel", "backward_kernel": "megakernel"},
                        precision="bf16", launched="moe_backward_megakernel", bound=2e-2),
    "megakernels_saved": dict(
        knobs={"forward_kernel": "megakernel", "backward_kernel": "megakernel",
               "backward_inputs": "saved"},
        precision="bf16", launched="moe_backward_megakernel", bound=2e-2),
    "megakernels_main_grad": dict(
        knobs={"forward_kernel": "megakernel", "backward_kernel": "megakernel"},
        precision="bf16", launched="moe_backward_megakernel", bound=2e-2,
        grad_accum_fusion=True),
    # The separate backward adds the expert weight gradients into the fp32 main_grads itself.
    "separate_main_grad": dict(knobs={}, precision="bf16", launched="grouped_wgrad_accumulate",
                               bound=2e-2, grad_accum_fusion=True),
    "mxfp8": dict(knobs={}, precision="mxfp8", launched="grouped_gemm", bound=5e-2),
}


def _rel_l2(have: torch.Tensor, want: torch.Tensor) -> float:
    have, want = have.double(), want.double()
    norm = want.norm()
    return float((have - want).norm() / norm) if norm > 0 else float(have.norm())


def run_case(name: str) -> None:
    case = CASES[name]
    recipe_path = model_setup._write_recipe(case["knobs"])
    if case["precision"] != "bf16":
        with open(recipe_path, "a") as f:
            f.write(f"precision: {case['precision']}\n")
    model_setup.init_one_gpu_megatron(recipe_path)

    from mok_megatron.cuda import ops
    from mok_megatron.config import load_recipe

    # Launches of the kernel the case is about (the reference backend launches none of them).
    launches = {"count": 0}
    target = case["launched"]
    if target == "grouped_mm":
        module, attr = torch, "_grouped_mm"
    else:
        module, attr = ops, target
    original = getattr(module, attr)

    def counted(*args, **kwargs):
        launches["count"] += 1
        return original(*args, **kwargs)

    setattr(module, attr, counted)

    graph_case = {"impl": "none", "modules": [], "layer": "TransformerLayer",
                  "grad_accum_fusion": case.get("grad_accum_fusion", False)}
    kernel_model = model_setup._build_model(graph_case, graphed=False)
    reference_model = model_setup._build_model(graph_case, graphed=False)
    reference_recipe = dataclasses.replace(load_recipe(recipe_path), backend="reference")
    dispatchers = 0
    for layer in reference_model.decoder.layers:
        layer.mlp.token_dispatcher.recipe = reference_recipe
        dispatchers += 1
    assert dispatchers == model_setup.NUM_LAYERS
    kernel, reference = (model_setup.Trainer(m, "none") for m in (kernel_model, reference_model))

    print(f"case {name}: recipe {case['precision']} {case['knobs'] or '(default knobs)'}"
          f"{', gradient-accumulation fusion' if graph_case['grad_accum_fusion'] else ''}; "
          f"{model_setup.NUM_LAYERS} MoE layers, {model_setup.EXPERTS} experts "
          f"top-{model_setup.TOPK}, {model_setup.MICROBATCHES} microbatches, {ITERATIONS} "
          f"iterations; cuda backend vs reference backend")
    for iteration in range(ITERATIONS):
        reference_model.load_state_dict(kernel_model.state_dict())
        launches["count"] = 0
        got = kernel.step(model_setup._batches(iteration))
        assert launches["count"] > 0, f"{target} never ran on the cuda backend"
        launches["count"] = 0
        want = reference.step(model_setup._batches(iteration))
        assert launches["count"] == 0, \
            f"{target} ran {launches['count']} times under the reference backend"
        worst, over = {}, {}
        for key, w in want.items():
            group = ("expert main_grad" if ".mlp.experts." in key else
                     "loss" if key.startswith("loss") else "other main_grad")
            err = _rel_l2(got[key], w)
            if err > case["bound"]:
                over[key] = f"{err:.2e} (|want| {w.double().norm():.2e})"
            worst[group] = max(worst.get(group, 0.0), err)
        assert not over, f"iteration {iteration}: rel-L2 above {case['bound']:.0e}: {over}"
        print(f"  iteration {iteration}: rel-L2 vs reference "
              + ", ".join(f"{k} <= {v:.1e}" for k, v in sorted(worst.items()))
              + f" (bound {case['bound']:.0e}); loss {want['loss[microbatch 0]'].mean():.4f}")
    print(PASSED)


@pytest.fixture(scope="module")
def case_runs(request):
    runs = model_setup.CaseRuns(
        __file__, model_setup.selected_cases(request, test_moe_layer_matches_reference_backend))
    yield runs
    runs.close()


@pytest.mark.parametrize("case", list(CASES))
def test_moe_layer_matches_reference_backend(case, case_runs):
    model_setup.assert_case_passed(case_runs.result(case), PASSED)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=list(CASES), required=True)
    model_setup.exit_after_case(run_case, parser.parse_args().case)


if __name__ == "__main__":
    main()
