"""The forward megakernel (kernel.forward_kernel: megakernel) on one GPU (EP=1): the v1 checks
(reference agreement on uniform, skewed and adversarial routings, poisoned outputs, bitwise
reruns, CUDA graphs), plus bit-identical results across numbers of row-pulling blocks and
minibatch sizes, and with the macrobatch ring at several macrobatch sizes; and that the
profiling variants (a phase left out) still run every tile they keep."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gpu_checks
from mok_megatron.cuda import ops
from test_symm_moe import SPECS

pytestmark = pytest.mark.gpu

MEGAKERNEL = {"forward_kernel": "megakernel", "comm_sms_forward": 8, "backward_inputs": "saved"}
# The ring runs with recomputed backward inputs; 256-row macrobatches make it wrap many times.
RING = {**MEGAKERNEL, "backward_inputs": "recomputed", "macrobatch_tokens": 256}
SETTINGS = {"plain": MEGAKERNEL, "ring": RING}


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_matches_reference_and_is_deterministic(spec, setting):
    errors = gpu_checks.check_against_reference(spec, 0, None, **SETTINGS[setting])
    print(spec.name, setting, {k: f"{v:.2e}" for k, v in errors.items()})


@pytest.mark.parametrize("spec", SPECS[:3], ids=lambda s: s.name)
def test_bit_identical_across_comm_blocks_and_minibatches(spec):
    gpu_checks.check_megakernel_settings(spec, 0, None)


@pytest.mark.parametrize("spec", SPECS[:3], ids=lambda s: s.name)
def test_ring_bit_identical_to_no_ring(spec):
    gpu_checks.check_macrobatch_ring(spec, 0, None)


@pytest.mark.parametrize("setting", SETTINGS)
def test_cuda_graph_replay(setting):
    gpu_checks.check_cuda_graph(SPECS[1], 0, None, **SETTINGS[setting])


def _small_launch(ring_mblocks: int, seed: int = 3, counts: list[int] | None = None) -> dict:
    """A small EP=1 megakernel problem (2 FC1 and 2 FC2 tiles per m-block) in the form
    ops.moe_forward_megakernel takes; `launch(**kw)` runs it. Routing: 6 experts, 300 tokens
    top-2 at random, or with `counts` top-1 with expert e given counts[e] of the tokens."""
    H, F = 512, 256
    g = torch.Generator(device="cuda").manual_seed(seed)
    if counts is None:
        E, T, K = 6, 300, 2
        ids = torch.rand(T, E, device="cuda", generator=g).topk(K, dim=1).indices
    else:
        E, T, K = len(counts), sum(counts), 1
        ids = torch.repeat_interleave(torch.arange(E, device="cuda"),
                                      torch.tensor(counts, device="cuda"))
        ids = ids[torch.randperm(T, device="cuda", generator=g)].view(T, 1)
    x = torch.randn(T, H, device="cuda", generator=g).bfloat16()
    n = T * K
    keys = torch.sort(ids.flatten().long() * n + torch.arange(n, device="cuda")).values
    row_slot = torch.remainder(keys, n).to(torch.int32)
    offsets = torch.searchsorted(keys, torch.arange(E + 1, device="cuda") * n).to(torch.int32)
    rows_per_expert = (offsets[1:] - offsets[:-1]).tolist()
    w1 = (torch.randn(E, 2 * F, H, device="cuda", generator=g) * H**-0.5).bfloat16()
    w2 = (torch.randn(E, H, F, device="cuda", generator=g) * F**-0.5).bfloat16()
    buf_rows = ops.macrobatch_ring_rows(n, E, ring_mblocks)
    rows = torch.empty(buf_rows, H, device="cuda", dtype=torch.bfloat16)
    act = torch.empty(buf_rows, F, device="cuda", dtype=torch.bfloat16)
    h = None if ring_mblocks else torch.empty(n, 2 * F, device="cuda", dtype=torch.bfloat16)
    slots = torch.full((n, H), float("nan"), device="cuda", dtype=torch.bfloat16)
    bases = torch.zeros(1, dtype=torch.int64, device="cuda")
    prob = torch.rand(n, device="cuda", generator=g)

    def launch(comm_blocks=0, timeout_ns=10**10, first_ticket=0, **kw):
        counters = ops.megakernel_counters(n, E, "cuda", ring_mblocks)
        counters[-1] = first_ticket  # the arrival counter: tickets >= comm_blocks pull nothing
        ops.moe_forward_megakernel(bases, x.data_ptr(), slots.data_ptr(), offsets, row_slot,
                                   prob, T, K, w1, w2, "swiglu", rows, act, h, counters,
                                   comm_blocks, timeout_ns, ring_mblocks=ring_mblocks, **kw)
        torch.cuda.synchronize()
        assert ops.timeout_reports() == []
        return counters.cpu()

    return {"launch": launch, "slots": slots, "experts": E, "rows": n, "x": x, "ids": ids,
            "prob": prob, "row_slot": row_slot, "w1": w1, "w2": w2,
            "mblocks": sum(-(-c // 128) for c in rows_per_expert),
            "fc1_tiles": -(-F // 128), "fc2_tiles": -(-H // 256)}


@pytest.mark.parametrize("ring_mblocks", [0, 2])
def test_profile_variants_run_every_kept_tile(ring_mblocks):
    """The timing variants of benchmarks/diagnostics/profile_megakernel.py leave a phase out by
    moving the tile counter past its runs; every tile of the kept phase must still run (counted
    in the counters: FC1 tile halves per m-block, FC2 tile halves per macrobatch), with no wait
    timing out."""
    p = _small_launch(ring_mblocks)
    skip = ops.PROFILE_SKIP
    max_mblocks = p["rows"] // 128 + p["experts"] + 1
    mblocks = p["mblocks"]
    macros = -(-mblocks // ring_mblocks) if ring_mblocks else 1
    variants = {}
    for phase, other in (("fc1", "fc2"), ("fc2", "fc1")):
        only = skip["pull"] | skip[other]
        variants[f"{phase}_only"] = only
        variants[f"{phase}_only_no_stores"] = only | skip["stores"]
        variants[f"{phase}_only_loads_only"] = only | skip["stores"] | skip["mma"]
        variants[f"{phase}_only_mma_only"] = only | skip["stores"] | skip["loads"]
    for variant, bits in variants.items():
        c = p["launch"](profile_skip=bits)
        fc1_done = c[max_mblocks:max_mblocks + mblocks]
        fc2_done = c[2 * max_mblocks:2 * max_mblocks + macros]
        if variant.startswith("fc1"):
            assert (fc1_done == 2 * p["fc1_tiles"]).all(), (variant, fc1_done)
            assert (fc2_done == 0).all(), variant
        else:
            assert int(fc2_done.sum()) == 2 * p["fc2_tiles"] * mblocks, (variant, fc2_done)
            assert (fc1_done == 0).all(), variant


@pytest.mark.parametrize("ring_mblocks", [0, 2])
def test_traced_launch_same_bits_and_ordered_stamps(ring_mblocks):
    """A traced launch (the diagnostic kernel) gives the production kernel's results bit for
    bit, and its stamps are consistent: every block started and ended on the global timer,
    tickets are a permutation, each traced tile's phase stamps (consumer side, and its
    storer's after the mainloop) are in order and every tile appears once."""
    p = _small_launch(ring_mblocks)
    p["launch"](comm_blocks=4)
    expected = p["slots"].clone()
    p["slots"].fill_(float("nan"))
    trace = ops.megakernel_trace_buffer("cuda")
    p["launch"](comm_blocks=4, trace=trace)
    assert torch.equal(p["slots"], expected)
    trace = trace.cpu()
    seen = gpu_checks.check_trace_stamps(trace)
    pull_end = ops.megakernel_trace_parts(trace)[1][:, ops.TRACE_HEADER.index("pull_end_clock")]
    assert int((pull_end != 0).sum()) == 4
    total = p["mblocks"] * (p["fc1_tiles"] + p["fc2_tiles"])
    assert sorted(seen) == list(range(total))


@pytest.mark.parametrize("ring_mblocks", [0, 2])
def test_short_m_blocks_match_reference(ring_mblocks):
    """Experts whose last m-block holds at most 64 rows run it on the first consumer
    warpgroup alone (the second passes its stages): rows on either side of the 64- and
    128-row edges, an empty expert and a 1-row one, against an fp32 reference with the
    kernel's bf16 rounding points."""
    counts = [1, 63, 64, 65, 0, 127, 128, 129, 192, 193, 300]
    p = _small_launch(ring_mblocks, seed=5, counts=counts)
    p["launch"](comm_blocks=2)
    out = p["slots"].float()
    # Row r of the schedule is token row_slot[r] (top-1), with prob p["prob"][r].
    prob = torch.empty_like(p["prob"])
    prob[p["row_slot"].long()] = p["prob"]
    e = p["ids"].view(-1)
    h = torch.einsum("th,tfh->tf", p["x"].float(), p["w1"][e].float()).bfloat16().float()
    g, u = h.chunk(2, dim=1)
    act = (torch.nn.functional.silu(g) * u * prob[:, None]).bfloat16().float()
    ref = torch.einsum("tf,thf->th", act, p["w2"][e].float())
    for expert, count in enumerate(counts):
        rows = e == expert
        if count == 0:
            continue
        err = (out[rows] - ref[rows]).norm() / ref[rows].norm()
        assert err < 1e-2, (expert, count, float(err))
    assert not torch.isnan(out).any()


def test_stalled_megakernel_reports_where():
    """A megakernel whose FC1 tiles wait for rows nobody pulls (every block's arrival ticket
    starts past the pulling ones) traps after the bound instead of hanging, and the report
    names a wait that hangs on those rows: an FC1 producer's for them, its consumers' for the
    tile's first stage or next entry, an FC2 producer's for the FC1 tiles - they all start
    within microseconds, and the report is the last trapping thread's. In a subprocess, as a
    trap ends the CUDA context."""
    code = ("import sys; sys.path[:0] = ['tests', 'tests/gpu']; "
            "from mok_megatron.cuda import ops; from test_megakernel import _small_launch; "
            "p = _small_launch(0)\n"
            "try:\n"
            "    p['launch'](comm_blocks=4, timeout_ns=200_000_000, first_ticket=1000)\n"
            "except Exception as e:\n"
            "    print('FAILED', type(e).__name__)\n"
            "print('REPORT', ops.timeout_reports())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert "FAILED" in proc.stdout, proc.stdout + proc.stderr
    roles = ("rows ready", "gemm mma", "tile queue", "fc1 done")
    assert any(f"'role': '{r}'" in proc.stdout for r in roles), proc.stdout + proc.stderr


@pytest.mark.parametrize("precision", ["bf16", "mxfp8", "fp8_blockwise"])
def test_auto_kernels_give_the_bits_of_both_choices(precision):
    """kernel.forward_kernel / backward_kernel: auto (the default) picks a path by speed alone
    (config.resolve_kernels: at EP = 1 the forward megakernel and the separate backward): its
    y, dx, dprobs and weight gradients are the bits of that explicit choice, and y those of the
    other forward kernel too (the two forwards give the same bits)."""
    spec = SPECS[1]  # zipf
    problem = spec.build()
    max_tokens = max(spec.tokens_per_rank)

    def run(forward, backward):
        return gpu_checks.run_cuda(problem, 0, None, max_tokens, precision=precision,
                                   forward_kernel=forward, backward_kernel=backward)

    auto = run("auto", "auto")
    gpu_checks.assert_same_bits(run("megakernel", "separate"), auto,
                                f"({precision}) auto against its resolved choice")
    assert torch.equal(run("separate", "separate")["y"], auto["y"]), precision
