"""FP8 rows on the wire (the FP8 recipes' forward dispatch, ops.Fp8WireRow): x quantized once
at its source (ops.publish_fp8_rows) and pulled as codes and scale codes (ops.pull_fp8_rows)
is, bit for bit, ops.fp8_quantize_rows of the pulled bf16 rows - what the FC1 GEMM read
before - for both scale blocks, a hidden size whose rows need padding, edge values (zeros,
subnormals, saturation, NaN/Inf blocks), and rows pulled from a peer of an emulated group;
pulled as bf16 values instead (ops.pull_fp8_rows_dequantized, MXFP8's FC1 input) they are
each code times its block's scale and, under MXFP8, ops.mx_round_columns of the pulled rows.
The layer under both recipes then gives the bf16 wire's results bit for bit: the recipes'
recomputed-vs-saved checks compare the two wires (saved inputs keep the bf16 rows). Backward's
pulls that write both of a recipe's forms at once equal the in-place pass over the pulled
bf16 rows."""

import pytest
import torch

from mok_megatron.cuda import ops
from mok_megatron.recipes.fp8_blockwise import e8m0_values
from mok_megatron.cuda.workspace import Workspace, WorkspaceLayout
from test_mxfp8_kernels import _edge_rows

pytestmark = pytest.mark.gpu

MAX_TOKENS, TOPK = 64, 3


def _inputs(tokens: int, hidden: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    edge = _edge_rows(hidden, g)
    rest = (torch.randn(tokens - edge.shape[0], hidden, generator=g) * 2).to(torch.bfloat16)
    return torch.cat([edge, rest]).cuda()


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("hidden", [200, 7168])
@pytest.mark.parametrize("block", [ops.MX_BLOCK, ops.FP8_BLOCK])
def test_pulled_fp8_rows_are_the_quantized_pulled_rows(block, hidden, world):
    device = torch.device("cuda")
    wire = ops.Fp8WireRow(hidden, block)
    layout = WorkspaceLayout(MAX_TOKENS, TOPK, hidden, inputs=True, fp8_rows=wire)
    group = Workspace.emulated_group(world, device, layout, timeout_ms=10_000)
    tokens = [37, 50][:world]
    xs = []
    for rank, ws in enumerate(group):
        ws.buffer.fill_(0xAB)  # the pull must read only what the publish wrote
        x = _inputs(tokens[rank], hidden, seed=10 * rank + block)
        ids = torch.zeros(tokens[rank], TOPK, dtype=torch.int64, device=device)
        probs = torch.ones(tokens[rank], TOPK, device=device)
        ids32 = torch.empty(tokens[rank], TOPK, dtype=torch.int32, device=device)
        ops.publish_inputs(x, ids, probs, ws.buffer, ws.offsets, ids32, rows=False)
        start = ws.offsets["tokens"]
        assert bool((ws.buffer[start:start + x.numel() * 2] == 0xAB).all()), \
            "publish_inputs wrote bf16 rows where the FP8 rows go"
        ops.publish_fp8_rows(x, ws.buffer, start, wire)
        xs.append(x)

    # Rank 0's schedule: every (source, token, k) slot in a random order, the last few left
    # past num_rows; each token's k slots pull the same row.
    slots = [(s, t, k) for s in range(world) for t in range(tokens[s]) for k in range(TOPK)]
    g = torch.Generator().manual_seed(block + hidden + world)
    order = [slots[i] for i in torch.randperm(len(slots), generator=g).tolist()]
    rows = len(order) - 5
    row_slot = torch.tensor([s * MAX_TOKENS * TOPK + t * TOPK + k for s, t, k in order],
                            dtype=torch.int32, device=device)
    num_rows = torch.tensor([rows], dtype=torch.int32, device=device)
    ws = group[0]
    codes, scales = ops.pull_fp8_rows(ws.peer_bases, ws.offsets["tokens"], row_slot, num_rows,
                                      MAX_TOKENS, TOPK, wire)

    bf16_rows = torch.stack([xs[s][t] for s, t, _ in order])
    want_codes, want_scales = ops.fp8_quantize_rows(bf16_rows, num_rows, block=block)
    torch.cuda.synchronize()
    assert codes.shape == want_codes.shape and scales.shape == want_scales.shape
    assert torch.equal(codes[:rows].view(torch.uint8), want_codes[:rows].view(torch.uint8)), \
        "pulled codes differ from the quantized pulled rows"
    assert torch.equal(scales[:, :rows], want_scales[:, :rows]), \
        "pulled scale codes differ from the quantized pulled rows"

    values = ops.pull_fp8_rows_dequantized(ws.peer_bases, ws.offsets["tokens"], row_slot,
                                           num_rows, MAX_TOKENS, TOPK, wire)
    factors = e8m0_values(scales[:, :rows]).t().repeat_interleave(block, dim=1)[:, :hidden]
    _assert_same_bits(values[:rows], (codes[:rows].float() * factors).bfloat16(),
                      "pulled bf16 rows differ from codes x scales")
    if block == ops.MX_BLOCK:
        _assert_same_bits(values[:rows], ops.mx_round_columns(bf16_rows, num_rows)[:rows],
                          "pulled bf16 rows differ from the MX-rounded pulled rows")


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("hidden", [200, 7168])
@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_blockwise"])
def test_backward_pull_gives_both_forms(recipe, hidden, world):
    """Backward's pull in both of the recipe's forms at once (ops.pull_rows_mx_round_both,
    ops.pull_rows_fp8_quantize_round_both) gives, bit for bit, the in-place pass over the bf16
    rows the plain pull lands: rows from every rank of an emulated group in a random order, cut
    into uneven segments (an empty one, short ones), the last rows past the schedule."""
    device = torch.device("cuda")
    layout = WorkspaceLayout(MAX_TOKENS, TOPK, hidden, inputs=True)
    group = Workspace.emulated_group(world, device, layout, timeout_ms=10_000)
    tokens = [37, 50][:world]
    for rank, ws in enumerate(group):
        x = _inputs(tokens[rank], hidden, seed=10 * rank + hidden)
        ids = torch.zeros(tokens[rank], TOPK, dtype=torch.int64, device=device)
        probs = torch.ones(tokens[rank], TOPK, device=device)
        ids32 = torch.empty(tokens[rank], TOPK, dtype=torch.int32, device=device)
        ops.publish_inputs(x, ids, probs, ws.buffer, ws.offsets, ids32, rows=True)
    slots = [s * MAX_TOKENS * TOPK + t * TOPK + k
             for s in range(world) for t in range(tokens[s]) for k in range(TOPK)]
    g = torch.Generator().manual_seed(hidden + world)
    row_slot = torch.tensor([slots[i] for i in torch.randperm(len(slots), generator=g)],
                            dtype=torch.int32, device=device)
    counts = [0, 40, 1, 33, len(slots) - 5 - 74]  # 5 rows past the schedule's end
    offsets = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32,
                           device=device)
    n = int(offsets[-1])
    ws = group[0]
    pull = (ws.peer_bases, ws.offsets["tokens"], row_slot, offsets, MAX_TOKENS, TOPK)
    rows = torch.empty(len(slots), hidden, dtype=torch.bfloat16, device=device)
    ops.pull_rows(ws.peer_bases, ws.offsets["tokens"], row_slot, offsets[-1:], MAX_TOKENS, TOPK,
                  rows)
    if recipe == "mxfp8":
        got = ops.pull_rows_mx_round_both(*pull, hidden)
        want = ops.mx_round_both(rows, offsets)
        _assert_same_bits(got[0][:n], want[0][:n], "pulled, along K")
    else:
        got = ops.pull_rows_fp8_quantize_round_both(*pull, hidden)
        want = ops.fp8_quantize_round_both(rows, offsets)
        (codes, scales), (want_codes, want_scales) = got[0], want[0]
        assert torch.equal(codes[:n].view(torch.uint8), want_codes[:n].view(torch.uint8)), \
            "pulled codes along K differ"
        assert torch.equal(scales[:, :n], want_scales[:, :n]), "pulled scale codes differ"
    _assert_same_bits(got[1][:n], want[1][:n], "pulled, along the rows")


def _assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Equal bits where finite, NaN at the same places (a NaN block's payload may differ)."""
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), f"{what}: NaN in other places"
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16)), what


def test_publish_fp8_rows_refuses_a_row_layout_that_does_not_fit():
    x = torch.randn(4, 256, device="cuda").bfloat16()
    buffer = torch.zeros(4 * 256, dtype=torch.uint8, device="cuda")
    with pytest.raises(RuntimeError, match="do not fit"):
        ops.publish_fp8_rows(x, buffer, 0, ops.Fp8WireRow(256, ops.MX_BLOCK))
