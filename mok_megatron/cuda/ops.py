"""Thin, checked wrappers over the compiled extension ``mok_megatron._C``.

Every op runs on the current CUDA stream and never synchronizes with the host. Checks here
cost no device time (shapes, dtypes, devices); the C++ side checks again.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Optional

import torch

from . import stall_watch

# Mirrors csrc/config/kernel_config.cuh.
MAX_RANKS = 8
MX_BLOCK = 32  # csrc/config/kernel_config.cuh kMxBlock (mxfp8.BLOCK)
FP8_BLOCK = 128  # kFp8ScaleBlock (fp8_blockwise.BLOCK)
NUM_BARRIER_CHANNELS = 4
MAX_LOCAL_EXPERTS = 1024  # kGemmMaxExperts: local experts one launch can schedule
# The blockwise FP8 grouped GEMM's CTAs per cluster unless a call says otherwise: 2 = pairs
# sharing weight tiles (csrc/gemm/fp8_grouped_gemm.cu; docs/perf-log.md, Blockwise FP8, 2026-12-05).
FP8_CLUSTER_CTAS = 1
# kFp8WideBlockN: the blockwise FP8 grouped GEMM's wide tiles (block_n).
FP8_WIDE_BLOCK_N = 192


class Stage(enum.IntEnum):
    """Where a rank waits on its peers (csrc/common/stages.cuh); timeouts name it."""

    FORWARD_PUBLISHED = 0
    FORWARD_COMBINED = 1
    BACKWARD_PUBLISHED = 2
    BACKWARD_COMBINED = 3
    TEST = 4


# Mirrors csrc/epilogue/activation.cu (ActivationId).
ACTIVATION_IDS = {"swiglu": 0, "geglu": 1, "silu": 2, "gelu": 3, "relu": 4, "squared_relu": 5}


@functools.cache
def extension():
    """The compiled extension, or an error that says why it is missing and what to do."""
    try:
        from .. import _C
    except ImportError as err:
        raise RuntimeError(
            "mok_megatron's CUDA extension is not built (import failed: "
            f"{err}). Build it on a machine with nvcc and a CUDA build of torch: "
            "`pip install --no-build-isolation -e .` (MOK_BUILD_CUDA=1 makes a missing "
            "toolkit an error), or choose `backend: reference` in the recipe to run the "
            "plain-PyTorch path explicitly."
        ) from err
    return _C


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(f"mok_megatron.cuda.ops: {msg}")


def _cuda(name: str, t: torch.Tensor, dtype: Optional[torch.dtype] = None) -> None:
    _check(t.is_cuda, f"{name} must be a CUDA tensor, got {t.device}")
    _check(dtype is None or t.dtype == dtype, f"{name} must be {dtype}, got {t.dtype}")
    _check(t.is_contiguous(), f"{name} must be contiguous")


def peer_barrier(peer_bases, flags_offset, epochs, channel, rank, world, timeout_ns, stage):
    _cuda("peer_bases", peer_bases, torch.int64)
    _cuda("epochs", epochs, torch.int32)
    _check(1 <= world <= MAX_RANKS, f"EP size {world} outside [1, {MAX_RANKS}]")
    extension().peer_barrier(
        peer_bases, flags_offset, epochs, channel, rank, world, timeout_ns, int(stage)
    )


def stall_for_test(flag: torch.Tensor, rank: int, timeout_ns: int) -> None:
    _cuda("flag", flag, torch.int32)
    extension().stall_for_test(flag, rank, timeout_ns)


def build_schedule(peer_bases, ids_offset, probs_offset, count_offset, world, max_tokens,
                   topk, expert_begin, expert_position, offsets, row_slot, row_prob):
    """This rank's rows from every rank's published routing, in (expert position, source,
    token, slot) order: offsets [E + 1] (int32), row_slot and row_prob [capacity] (at most
    world * max_tokens * topk; the first offsets[E] entries written). More rows than the
    capacity stop the kernels with a SCHEDULE OVERFLOW report."""
    _cuda("expert_position", expert_position, torch.int32)
    _cuda("offsets", offsets, torch.int32)
    _cuda("row_slot", row_slot, torch.int32)
    _cuda("row_prob", row_prob, torch.float32)
    extension().build_schedule(peer_bases, ids_offset, probs_offset, count_offset, world,
                               max_tokens, topk, expert_begin, expert_position, offsets,
                               row_slot, row_prob)


def check_routing_map(routing_map: torch.Tensor, topk: int, rank: int = 0) -> None:
    """Stop, with a report naming the token, where a routing map [T, E] (bool, on the GPU)
    selects more than ``topk`` experts for a token; no host sync (routing.py)."""
    _check(routing_map.is_cuda and routing_map.dtype == torch.bool and routing_map.dim() == 2,
           f"routing_map must be a bool [T, E] CUDA tensor, got {routing_map.dtype} "
           f"{tuple(routing_map.shape)} on {routing_map.device}")
    extension().check_routing_map(routing_map.contiguous(), topk, rank)


def _pad16(n: int) -> int:
    return -(-n // 16) * 16


@dataclasses.dataclass(frozen=True)
class Fp8WireRow:
    """A token row as a rank publishes it for dispatch under an FP8 recipe: its E4M3 codes
    (``hidden`` bytes, padded to 16) and then one E8M0 scale code per ``block`` of the row
    (padded to 16) - what the FP8 GEMM's A operand is, so the pull moves it as it is."""

    hidden: int
    block: int

    @property
    def blocks(self) -> int:
        return -(-self.hidden // self.block)

    @property
    def code_bytes(self) -> int:
        return _pad16(self.hidden)

    @property
    def row_bytes(self) -> int:
        return self.code_bytes + _pad16(self.blocks)


def publish_inputs(x, ids, probs, buffer, offsets: dict, ids32, rows: bool = True) -> None:
    """x (bf16 [T, H]; skipped when not `rows`), ids (int32/int64 [T, K], written as int32)
    and probs ([T, K], written as fp32) into the workspace regions at `offsets`
    (WorkspaceLayout.offsets()) of `buffer`, and T into its count; ids32 ([T, K] int32)
    receives the ids as well. One launch."""
    for name, t in (("x", x), ("ids", ids), ("probs", probs), ("buffer", buffer)):
        _cuda(name, t)
    _cuda("ids32", ids32, torch.int32)
    extension().publish_inputs(x, ids, probs, buffer, offsets["tokens"], offsets["ids"],
                               offsets["probs"], offsets["count"], ids32, rows)


def publish_fp8_rows(x: torch.Tensor, buffer: torch.Tensor, offset: int,
                     wire: Fp8WireRow) -> None:
    """x (bf16 [T, H]) quantized along its rows into wire rows at `offset` of `buffer`: row t's
    codes and scale codes are ``fp8_quantize_rows(x, block=wire.block)``'s row t."""
    _cuda("x", x, torch.bfloat16)
    _cuda("buffer", buffer, torch.uint8)
    _check(x.shape[1] == wire.hidden, f"x has {x.shape[1]} columns, the wire rows {wire.hidden}")
    extension().quantize_wire_rows(x, buffer, offset, wire.row_bytes, wire.code_bytes,
                                   wire.block)


def pull_rows(peer_bases, src_offset, row_slot, num_rows, max_tokens, topk, out):
    _cuda("row_slot", row_slot, torch.int32)
    _cuda("out", out)
    extension().pull_rows(peer_bases, src_offset, row_slot, num_rows, max_tokens, topk, out)


def pull_fp8_rows(peer_bases, src_offset, row_slot, num_rows, max_tokens, topk,
                  wire: Fp8WireRow) -> tuple[torch.Tensor, torch.Tensor]:
    """The schedule's rows pulled from every rank's wire rows at `src_offset`, in the form
    ``fp8_quantize_rows`` returns for the bf16 rows: codes [cap, H] and transposed scale codes
    [blocks, cap padded to 16] (cap = row_slot's length; rows past the first num_rows are
    left unwritten)."""
    _cuda("row_slot", row_slot, torch.int32)
    cap = row_slot.numel()
    codes = torch.empty(cap, wire.code_bytes, dtype=torch.float8_e4m3fn,
                        device=row_slot.device)[:, :wire.hidden]
    scales = torch.empty(wire.blocks, _pad16(cap), dtype=torch.uint8, device=row_slot.device)
    extension().pull_fp8_rows(peer_bases, src_offset, row_slot, num_rows, max_tokens, topk,
                              wire.row_bytes, wire.code_bytes, codes, scales)
    return codes, scales


def pull_fp8_rows_dequantized(peer_bases, src_offset, row_slot, num_rows, max_tokens, topk,
                              wire: Fp8WireRow) -> torch.Tensor:
    """The schedule's rows pulled from every rank's wire rows at `src_offset` as bf16 [cap, H]:
    each code times its block's scale - bit for bit ``mx_round_columns`` (MXFP8) of the
    published x, for an FC1 that multiplies bf16 (rows past the first num_rows unwritten)."""
    _cuda("row_slot", row_slot, torch.int32)
    rows = torch.empty(row_slot.numel(), wire.hidden, dtype=torch.bfloat16,
                       device=row_slot.device)
    extension().pull_fp8_rows_dequantized(peer_bases, src_offset, row_slot, num_rows, max_tokens,
                                          topk, wire.row_bytes, wire.code_bytes, wire.block,
                                          rows)
    return rows


def push_rows(peer_bases, dst_offset, row_slot, num_rows, slots_per_rank, rows):
    _cuda("row_slot", row_slot, torch.int32)
    _cuda("rows", rows)
    extension().push_rows(peer_bases, dst_offset, row_slot, num_rows, slots_per_rank, rows)


def push_values(peer_bases, dst_offset, row_slot, num_rows, slots_per_rank, values):
    _cuda("values", values, torch.float32)
    extension().push_values(peer_bases, dst_offset, row_slot, num_rows, slots_per_rank, values)


def activation_forward(h, row_prob, num_rows, activation: str, out):
    _cuda("h", h, torch.bfloat16)
    _cuda("row_prob", row_prob, torch.float32)
    _cuda("out", out, torch.bfloat16)
    extension().activation_forward(h, row_prob, num_rows, ACTIVATION_IDS[activation], out)


def activation_backward(h, grad_out, row_prob, num_rows, activation: str, grad_h, act_out,
                        grad_prob):
    _cuda("grad_out", grad_out, torch.bfloat16)
    _cuda("grad_prob", grad_prob, torch.float32)
    extension().activation_backward(h, grad_out, row_prob, num_rows,
                                    ACTIVATION_IDS[activation], grad_h, act_out, grad_prob)


def mx_round_columns(x: torch.Tensor, num_rows: Optional[torch.Tensor] = None,
                     out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [rows, cols] bf16 rounded to MXFP8 with blocks along each row's columns and
    dequantized (exact in bf16; csrc/quant/mx_round.cu) into ``out`` (x's shape, contiguous;
    a new tensor when None); only the first ``num_rows`` rows (int32 [1] on the device) are
    written when given."""
    _cuda("x", x, torch.bfloat16)
    if out is None:
        out = torch.empty_like(x)
    _cuda("out", out, torch.bfloat16)
    _check(out.shape == x.shape and out.is_contiguous(),
           f"out must be contiguous {tuple(x.shape)}, got {tuple(out.shape)}")
    extension().mx_round_columns(x, num_rows, out)
    return out


def mx_round_segments(x: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                      segment_rows: int = 0, block: int = MX_BLOCK) -> torch.Tensor:
    """x [rows, cols] bf16 rounded to MXFP8 with blocks along the rows of each segment, from
    its first row (an expert's rows: ``offsets`` int32 [E + 1] on the device; or every
    ``segment_rows`` rows), dequantized; rows outside every segment are not written.
    ``block``: 32 (MXFP8) or 128 (the blockwise recipe's 128 x 1 blocks, the same scale rule)."""
    _cuda("x", x, torch.bfloat16)
    out = torch.empty_like(x)
    extension().mx_round_segments(x, offsets, segment_rows, block, out)
    return out


def segment_scale_rows(rows: int, segments: int, block: int) -> int:
    """Rows of mx_quantize_segments' scale codes: at most one block per `block` rows plus a
    short one per segment."""
    return rows // block + segments


def mx_quantize_segments(x: torch.Tensor, offsets: torch.Tensor,
                         block: int = MX_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, cols] bf16 quantized as mx_round_segments rounds it (blocks of `block` rows of
    each segment, ``offsets`` int32 [segments + 1] on the device), kept as codes: (E4M3 codes
    as uint8 [rows, cols], E8M0 scale codes uint8 [segment_scale_rows, cols], block b of the
    segment-by-segment numbering in row b; 255 for a block with a NaN or an Inf). Rows
    outside every segment are not written (csrc/quant/segment_codes.cu)."""
    _cuda("x", x, torch.bfloat16)
    _cuda("offsets", offsets, torch.int32)
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    scales = torch.empty(segment_scale_rows(x.shape[0], offsets.numel() - 1, block), x.shape[1],
                         dtype=torch.uint8, device=x.device)
    extension().mx_quantize_segments(x, offsets, block, codes, scales)
    return codes, scales


def mx_dequantize_segments(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
                           block: int = MX_BLOCK) -> torch.Tensor:
    """mx_quantize_segments' codes back to bf16: bit for bit mx_round_segments of the rows
    they were quantized from (NaN where it writes NaN); rows outside every segment are not
    written."""
    _cuda("offsets", offsets, torch.int32)
    out = torch.empty(codes.shape, dtype=torch.bfloat16, device=codes.device)
    extension().mx_dequantize_segments(codes, scales, offsets, block, out)
    return out


def mx_round_both(x: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mx_round_columns(x), mx_round_segments(x, offsets)) in one pass over x (quant/
    mx_round_both.cu), bit for bit; rows outside every segment are not written in either."""
    _cuda("x", x, torch.bfloat16)
    along_k, along_n = torch.empty_like(x), torch.empty_like(x)
    extension().mx_round_both(x, offsets, along_k, along_n)
    return along_k, along_n


def pull_rows_mx_round_both(peer_bases, src_offset, row_slot, offsets, max_tokens, topk,
                            hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The schedule's rows pulled from every rank's bf16 rows at `src_offset` ([cap, hidden],
    cap = row_slot's length), rounded both ways as ``mx_round_both`` rounds them: the pulled
    rows themselves are never written. Rows past offsets[-1] are left unwritten."""
    _cuda("row_slot", row_slot, torch.int32)
    along_k = torch.empty(row_slot.numel(), hidden, dtype=torch.bfloat16,
                          device=row_slot.device)
    along_n = torch.empty_like(along_k)
    extension().pull_rows_mx_round_both(peer_bases, src_offset, row_slot, offsets, max_tokens,
                                        topk, along_k, along_n)
    return along_k, along_n


def _codes(codes: torch.Tensor) -> None:
    """MXFP8 codes: padded rows, so a view (the kernels check its strides)."""
    _check(codes.is_cuda and codes.dtype == torch.float8_e4m3fn,
           f"codes must be a float8_e4m3fn CUDA tensor, got {codes.dtype} on {codes.device}")


def mx_quantize_columns(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, *,
                        matrix_rows: int, halves: int = 1, block: int = MX_BLOCK) -> None:
    """x [rows, cols] bf16 as MXFP8 with blocks along each row's columns, as
    ``mxfp8.quantize(x, dim=1)`` gives them (codes inside a NaN block may differ: every value
    of it dequantizes to NaN either way): E4M3 codes into ``codes`` (float8_e4m3fn
    [rows, cols] or [E, rows / E, cols], rows 16-byte aligned) and E8M0 codes into ``scales``
    (uint8 [rows / matrix_rows, ceil(cols / 32), halves, >= matrix_rows / halves]: the layout
    the MXFP8 grouped GEMMs read, csrc/gemm/sm90/mx_weight_stage.cuh). ``block`` 128: the
    blockwise recipe's 1 x 128 blocks (the same scale rule, ``fp8_blockwise.quantize_rows``)."""
    _cuda("x", x, torch.bfloat16)
    _codes(codes)
    _cuda("scales", scales, torch.uint8)
    extension().mx_quantize_columns(x, None, codes, scales, matrix_rows, halves, block)


def _epilogue_id(activation: Optional[str], row_prob: Optional[torch.Tensor], rank: int) -> int:
    """The grouped GEMMs' epilogue (-1: plain store), checked with what it needs; installs the
    stall watch their bounded waits report through."""
    _check(activation is None or activation in ACTIVATION_IDS,
           f"activation must be None or one of {sorted(ACTIVATION_IDS)}, got {activation!r}")
    if activation is not None:
        _check(row_prob is not None, "an activation epilogue needs row_prob")
        _cuda("row_prob", row_prob, torch.float32)
    _check(0 <= rank < MAX_RANKS, f"rank {rank} outside [0, {MAX_RANKS})")
    stall_watch.install(timeout_reports)
    return -1 if activation is None else ACTIVATION_IDS[activation]


def fp8_quantize_rows(x: torch.Tensor, num_rows: Optional[torch.Tensor] = None,
                      block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, K] bf16 as the FP8 engine's A operand: E4M3 codes [rows, K] (K padded to 16
    in the row stride) and E8M0 scale codes per 1 x ``block`` of each row, stored transposed
    as [ceil(K / block), rows padded to 16] (block 128: ``fp8_blockwise.quantize_rows``
    values; 32: ``mxfp8.quantize(x, dim=1)``'s); only the first ``num_rows`` rows (int32 [1]
    on the device) when given."""
    _cuda("x", x, torch.bfloat16)
    _check(block in (MX_BLOCK, FP8_BLOCK), f"block must be {MX_BLOCK} or {FP8_BLOCK}, got {block}")
    rows, k = x.shape
    codes, scales = _fp8_rows(rows, k, x.device, block)
    extension().mx_quantize_columns(x.contiguous(), num_rows, codes,
                                    scales.view(1, scales.shape[0], 1, scales.shape[1]), rows, 1,
                                    block)
    return codes, scales


def _fp8_rows(rows: int, k: int, device, block: int = FP8_BLOCK):
    """Empty E4M3 codes [rows, k] (rows padded to 16 bytes: a view) and transposed E8M0 scale
    codes [ceil(k / block), rows padded to 16]: the FP8 engine's A operand."""
    codes = torch.empty(rows, -(-k // 16) * 16, dtype=torch.float8_e4m3fn, device=device)[:, :k]
    scales = torch.empty(-(-k // block), -(-rows // 16) * 16, dtype=torch.uint8, device=device)
    return codes, scales


def fp8_quantize_round_both(x: torch.Tensor, offsets: torch.Tensor):
    """-> ((codes, scales), along_n): ``fp8_quantize_rows(x)`` and ``mx_round_segments(x,
    offsets, block=128)`` in one pass over x (quant/mx_round_both.cu), bit for bit; rows
    outside every segment are not written."""
    _cuda("x", x, torch.bfloat16)
    codes, scales = _fp8_rows(x.shape[0], x.shape[1], x.device)
    along_n = torch.empty_like(x)
    extension().fp8_quantize_round_both(x, offsets, codes, scales, along_n)
    return (codes, scales), along_n


def pull_rows_fp8_quantize_round_both(peer_bases, src_offset, row_slot, offsets, max_tokens,
                                      topk, hidden: int):
    """The schedule's rows pulled from every rank's bf16 rows at `src_offset`, quantized and
    rounded as ``fp8_quantize_round_both`` does (the pulled rows themselves are never
    written); rows past offsets[-1] are left unwritten."""
    _cuda("row_slot", row_slot, torch.int32)
    cap = row_slot.numel()
    codes, scales = _fp8_rows(cap, hidden, row_slot.device)
    along_n = torch.empty(cap, hidden, dtype=torch.bfloat16, device=row_slot.device)
    extension().pull_rows_fp8_quantize_round_both(peer_bases, src_offset, row_slot, offsets,
                                                  max_tokens, topk, codes, scales, along_n)
    return (codes, scales), along_n


def fp8_quantize_weight_blocks(w: torch.Tensor, *, transposed: bool = False,
                               out: Optional[tuple] = None,
                               only_if: Optional[torch.Tensor] = None) -> tuple:
    """w [E, N, K] bf16 as E4M3 codes [E, N, K] (rows padded to 16 bytes: a view) with E8M0
    scale codes per 128 x 128 block [E, ceil(N / 128), ceil(K / 128)]
    (``fp8_blockwise.quantize_weight`` values); with ``transposed`` also the other orientation
    from the same rounding, codes [E, K, N] (rows padded to 16 bytes) and scale codes
    [E, ceil(K / 128), ceil(N / 128)]. ``out``: the tensors an earlier call returned for these
    shapes, written in place instead of new ones; ``only_if`` (int32 [1] on the device): the
    launch writes nothing while it holds 0 (a quantization captured in a CUDA graph that runs
    only when the weights changed: fp8_block_weights.py)."""
    _cuda("w", w, torch.bfloat16)
    E, n, k = w.shape
    if out is None:
        out = _weight_block_codes(E, n, k, w.device)
        if transposed:
            out += _weight_block_codes(E, k, n, w.device)
    _check(len(out) == (4 if transposed else 2),
           "out holds codes and scales, and their transposes with transposed=True")
    if only_if is not None:
        _cuda("only_if", only_if, torch.int32)
    extension().fp8_quantize_weight_blocks(w.contiguous(), out[0], out[1],
                                           *(out[2:] if transposed else (None, None)), only_if)
    return tuple(out)


def _weight_block_codes(E: int, n: int, k: int, device) -> tuple:
    """Empty codes [E, n, k] (rows padded to 16 bytes: a view) and scale codes per 128 x 128."""
    codes = torch.empty(E, n, _pad16(k), dtype=torch.float8_e4m3fn, device=device)[..., :k]
    scales = torch.empty(E, -(-n // FP8_BLOCK), -(-k // FP8_BLOCK), dtype=torch.uint8,
                         device=device)
    return codes, scales


def fp8_grouped_gemm(a: torch.Tensor, a_scales: torch.Tensor, w: torch.Tensor,
                     w_scales: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor, *,
                     activation: Optional[str] = None, row_prob: Optional[torch.Tensor] = None,
                     h_out: Optional[torch.Tensor] = None, timeout_ns: int = 10**10,
                     rank: int = 0, stages: int = 0, m_group: int = 0,
                     cluster_ctas: int = FP8_CLUSTER_CTAS, block_n: int = 0) -> None:
    """The blockwise FP8 grouped GEMM (csrc/gemm/fp8_grouped_gemm.cu): ``grouped_gemm``'s
    contract with ``a`` and ``w`` as E4M3 codes and their E8M0 scales, 1 x 128 per row of a
    (``fp8_quantize_rows``) and 128 x 128 per block of w (``fp8_quantize_weight_blocks``).
    The products of the dequantized values are summed in fp32, promoted once per 128 of K.
    ``stages``: the stage ring's depth, 5 or 6 (0: the deepest that fits beside the launch's
    expert tables); ``m_group``: m-blocks per group of the tile order (0: the config's
    kFp8TileGroupMBlocks); ``cluster_ctas``: 1, or 2 for clusters of two CTAs whose tiles
    share a weight tile, read from L2 once per pair (TMA multicast); ``block_n``: the tiles'
    weight rows, 128 (0), or FP8_WIDE_BLOCK_N (a gated tile: 96 gate and 96 up rows; 4
    stages: ``stages`` 0 or 4); the launcher checks them. They change only when and
    where tiles and stages run, never the bits; they are timed by scripts/bench_gemm.py.
    (MXFP8 GEMMs run on ``grouped_gemm`` with ``w_scales``.)"""
    for name, t in (("a", a), ("w", w)):
        _check(t.is_cuda and t.dtype == torch.float8_e4m3fn,
               f"{name} must be float8_e4m3fn codes on the GPU, got {t.dtype} on {t.device}")
    # a_scales may be a column range of a larger one (a row range of a's, transposed: the
    # recompute past kept h); the launcher checks its strides.
    _check(a_scales.is_cuda and a_scales.dtype == torch.uint8 and a_scales.stride(-1) == 1,
           f"a_scales must be uint8 on the GPU with unit column stride, got {a_scales.dtype} "
           f"on {a_scales.device}, strides {a_scales.stride()}")
    _cuda("w_scales", w_scales, torch.uint8)
    _cuda("out", out, torch.bfloat16)
    _cuda("offsets", offsets, torch.int32)
    act_id = _epilogue_id(activation, row_prob, rank)
    extension().fp8_grouped_gemm(a, a_scales, w, w_scales, offsets, row_prob, act_id, out,
                                 h_out, timeout_ns, rank, stages, m_group, cluster_ctas, block_n)


def mx_quantize_rows_transposed(w: torch.Tensor, codes: torch.Tensor,
                                scales: torch.Tensor) -> None:
    """w [E, r, c] bf16 as MXFP8 with blocks along each matrix's rows, written transposed:
    codes [E, c, r] (``mxfp8.quantize(w[e], dim=0)[0].T``), scales [E, ceil(r / 32), 1,
    >= c] - a weight in its dgrad orientation for the MXFP8 grouped GEMMs."""
    _cuda("w", w, torch.bfloat16)
    _codes(codes)
    _cuda("scales", scales, torch.uint8)
    extension().mx_quantize_rows_transposed(w, codes, scales)


def reduce_slots(slots, ids, out):
    _cuda("slots", slots, torch.bfloat16)
    _cuda("ids", ids, torch.int32)
    _cuda("out", out, torch.bfloat16)
    extension().reduce_slots(slots, ids, out)


def gather_slot_values(values, ids, out):
    _cuda("values", values, torch.float32)
    _cuda("ids", ids, torch.int32)
    _cuda("out", out, torch.float32)
    extension().gather_slot_values(values, ids, out)


def grouped_gemm(a: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor, *,
                 activation: Optional[str] = None, row_prob: Optional[torch.Tensor] = None,
                 h_out: Optional[torch.Tensor] = None, w_scales: Optional[torch.Tensor] = None,
                 timeout_ns: int = 10**10, rank: int = 0, m_group: int = 0) -> None:
    """The sm90 grouped GEMM tile engine: ``out[rows of e] = epilogue(a[rows of e] @ w[e].T)``,
    expert ``e`` owning rows ``offsets[e]:offsets[e+1]`` (int32, on the device).

    ``activation=None`` stores the product (FC2). Otherwise ``w`` is FC1 (``[E, 2F, H]`` as
    [gate | up] for gated activations) and ``out = act(h) * row_prob`` with ``h`` rounded to
    bf16 as the reference does; ``h_out`` (``[rows, N]``) also receives ``h`` for backward.
    Rows of ``out`` outside ``offsets[0]:offsets[-1]`` are not written. ``rank``: the EP
    rank launching it, named by its timeout report (stall_watch.py).

    With ``w_scales`` (uint8 E8M0 ``[E, ceil(K / 32), halves, N / halves padded to 16]``,
    halves = 2 for a gated activation), ``w`` holds MXFP8 codes (float8_e4m3fn ``[E, N, K]``,
    rows 16-byte aligned) dequantized in shared memory: the result is bit for bit this
    engine's on the weights ``mx_round_columns`` rounds (mxfp8_weights.py makes both).

    ``m_group``: m-blocks of an expert per group of the tile order, whose tiles run n-block by
    n-block (0: the config's kEngineTileGroupMBlocks; 1: each m-block's tiles in turn). It
    changes only when tiles run, never the bits; scripts/bench_gemm.py times it."""
    _check(a.is_cuda and w.is_cuda and out.is_cuda, "a, w and out must be CUDA tensors")
    w_dtype = torch.bfloat16 if w_scales is None else torch.float8_e4m3fn
    for name, t, dtype in (("a", a, torch.bfloat16), ("w", w, w_dtype),
                           ("out", out, torch.bfloat16)):
        _check(t.dtype == dtype, f"{name} must be {dtype}, got {t.dtype}")
    _cuda("offsets", offsets, torch.int32)
    act_id = _epilogue_id(activation, row_prob, rank)
    extension().grouped_gemm(a, w, offsets, row_prob, act_id, out, h_out, w_scales, timeout_ns,
                             rank, m_group)


def grouped_wgrad_accumulate(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor,
                             grads: torch.Tensor, *, timeout_ns: int = 10**10,
                             rank: int = 0) -> None:
    """``grad[e] += a[rows of e].T @ b[rows of e]`` in fp32, in place, for every expert ``e``
    (rows ``offsets[e]:offsets[e+1]``, int32 on the device): ``a`` [rows, M] and ``b``
    [rows, N] bf16, ``grads`` int64 [E], the address of each expert's contiguous fp32 [M, N]
    gradient (Megatron's main_grad). Each element gets one add: the same bits every run."""
    for name, t in (("a", a), ("b", b)):
        _cuda(name, t, torch.bfloat16)
        _check(t.dim() == 2, f"{name} must be 2-D [rows, cols], got {tuple(t.shape)}")
    _cuda("offsets", offsets, torch.int32)
    _cuda("grads", grads, torch.int64)
    stall_watch.install(timeout_reports)
    extension().grouped_wgrad_accumulate(a, b, offsets, grads, a.shape[1], b.shape[1],
                                         timeout_ns, rank)


MEGAKERNEL_BLOCK_M = 128  # csrc/config/kernel_config.cuh kGemmBlockM


def moe_forward_megakernel(peer_bases, tokens_offset, slots_offset, offsets, row_slot, row_prob,
                           max_tokens, topk, w1, w2, activation: str, rows, act, h_out,
                           counters, comm_blocks: int, timeout_ns: int,
                           minibatch_rows: int = MEGAKERNEL_BLOCK_M, ring_mblocks: int = 0,
                           rank: int = 0, profile_skip: int = 0,
                           trace: Optional[torch.Tensor] = None, mxfp8: bool = False,
                           w1_scales: Optional[torch.Tensor] = None,
                           w2_scales: Optional[torch.Tensor] = None,
                           wire: Optional[Fp8WireRow] = None, fp8_blockwise: bool = False,
                           rows_scales: Optional[torch.Tensor] = None,
                           act_scales: Optional[torch.Tensor] = None) -> None:
    """Pull-dispatch + FC1/activation + FC2 + push-combine in one persistent launch
    (csrc/megakernel/moe_forward.cu). ``mxfp8``: the MXFP8 recipe - the published rows are
    ``wire`` rows (publish_fp8_rows: x quantized along H at its source) that the pull
    dequantizes; act is rounded along F before FC2 reads it, and ``w1``/``w2`` are the
    weights' MXFP8 values in bf16 or, with ``w1_scales``/``w2_scales``, their codes
    (mxfp8_weights.MxWeight). ``fp8_blockwise``: the blockwise recipe on the FP8 engine - the
    pull copies the ``wire`` rows' codes into ``rows`` and their scale codes into
    ``rows_scales`` (``megakernel_fp8_rows``), act is stored as codes into ``act`` with
    ``act_scales``, the weights are their blockwise codes with ``w1_scales``/``w2_scales``
    per 128 x 128 block (fp8_block_weights), and no ``profile_skip``.
    ``h_out``: FC1's output h for backward ``[rows, F1]`` by schedule row, or None (not
    kept): every schedule row's, or with the ring the first rows' (kernel.kept_h_tokens).
    ``counters``: ``megakernel_counters(...)``, zeroed before every launch.
    ``minibatch_rows``: rows the pull copies and publishes together (the overlap unit).
    ``ring_mblocks`` > 0: ``rows`` and ``act`` are a ring of MACROBATCH_RING_SLOTS macrobatches
    of that many 128-row m-blocks (``macrobatch_ring_rows`` rows); 0: they hold every schedule
    row. ``rank``: the EP rank launching it, named by its timeout
    report (stall_watch.py). ``profile_skip``
    (timing only, results meaningless when set): PROFILE_SKIP bits of stages to leave out.
    ``trace``: ``megakernel_trace_buffer(...)`` to record the blocks' timestamps
    (``TRACE_SLOTS``, ``TRACE_HEADER``; benchmarks/diagnostics/trace_tiles.py reads them), or
    None."""
    _cuda("peer_bases", peer_bases, torch.int64)
    _cuda("offsets", offsets, torch.int32)
    _cuda("row_slot", row_slot, torch.int32)
    _cuda("row_prob", row_prob, torch.float32)
    _cuda("counters", counters, torch.int32)
    _check(not (mxfp8 and fp8_blockwise), "one recipe: mxfp8 or fp8_blockwise")
    if fp8_blockwise:
        # Codes rows padded to 16 bytes (megakernel_fp8_rows): the launcher checks strides.
        for name, t in (("rows", rows), ("act", act)):
            _check(t.is_cuda and t.dtype == torch.float8_e4m3fn,
                   f"{name} must be float8_e4m3fn codes on the GPU (megakernel_fp8_rows)")
        _check(profile_skip == 0, "fp8_blockwise has no profiling variants (traces only)")
    else:
        for name, t in (("rows", rows), ("act", act)):
            _cuda(name, t, torch.bfloat16)
    if h_out is not None:
        _cuda("h_out", h_out, torch.bfloat16)
    _check(fp8_blockwise == (rows_scales is not None) == (act_scales is not None),
           "rows_scales and act_scales come with fp8_blockwise, and only with it")
    codes = w1_scales is not None
    _check(codes == (w2_scales is not None) and (codes == fp8_blockwise or mxfp8),
           "weight scales come for both weights: under fp8_blockwise always, under mxfp8 with "
           "the codes, else never")
    weight_dtype = torch.float8_e4m3fn if codes else torch.bfloat16
    _check(w1.dtype == weight_dtype and w2.dtype == weight_dtype,
           f"weights must be {weight_dtype} (got {w1.dtype}, {w2.dtype})")
    fp8 = mxfp8 or fp8_blockwise
    _check(fp8 == (wire is not None) and (wire is None or wire.hidden == rows.shape[1]),
           "the FP8 recipes pull FP8 wire rows as wide as the rows, and only they do")
    _check(0 <= rank < MAX_RANKS, f"rank {rank} outside [0, {MAX_RANKS})")
    wire_layout = (0, 0, 0) if wire is None else (wire.row_bytes, wire.code_bytes, wire.block)
    precision = "fp8_blockwise" if fp8_blockwise else "mxfp8" if mxfp8 else "bf16"
    stall_watch.install(timeout_reports)
    extension().moe_forward_megakernel(peer_bases, tokens_offset, slots_offset, offsets,
                                       row_slot, row_prob, max_tokens, topk, w1, w2, w1_scales,
                                       w2_scales, precision, *wire_layout,
                                       ACTIVATION_IDS[activation], rows, act, rows_scales,
                                       act_scales, h_out, counters,
                                       comm_blocks, minibatch_rows, ring_mblocks,
                                       MACROBATCH_RING_SLOTS, timeout_ns, rank, profile_skip,
                                       trace)


def megakernel_fp8_rows(rows: int, cols: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A row buffer of the forward megakernel under fp8_blockwise (its pulled rows, its act):
    E4M3 codes [rows, cols] in 16-byte aligned rows and the transposed E8M0 scale codes
    [ceil(cols / 128), rows padded to 16] - the FP8 engine's A operand, as
    fp8_quantize_rows lays it out."""
    return _fp8_rows(rows, cols, device)


def moe_backward_megakernel(peer_bases, tokens_offset: int, inputs_offset: int,
                            slots_offset: int, values_offset: int, offsets, row_slot, row_prob,
                            max_tokens: int, topk: int, activation: str, rows, h, act,
                            dout, dh, dprob_part, counters, comm_blocks: int, timeout_ns: int,
                            *, w1, w2, dw1=None, dw2=None, dw1_fp32=None, dw2_fp32=None,
                            carry=None, mxfp8: Optional[MxBackwardOperands] = None,
                            fp8_blockwise: Optional[Fp8BackwardOperands] = None,
                            minibatch_rows: int = MEGAKERNEL_BLOCK_M, ring_mblocks: int = 0,
                            rank: int = 0, trace: Optional[torch.Tensor] = None) -> None:
    """Pull dY + FC2-dgrad with the activation backward + dW2 + FC1-dgrad (dX rows and dprobs
    pushed to their (token, k) slots) + dW1 in one persistent launch
    (csrc/megakernel/moe_backward.cu). ``ring_mblocks`` == 0: ``rows``, ``h``, ``act`` are
    forward's token rows, FC1 output and activation at schedule positions ([cap, H], [cap,
    F1], [cap, F]). ``ring_mblocks`` > 0: the launch recomputes them - it pulls the x rows
    published at ``inputs_offset`` along with dY and reruns FC1 - macrobatch by macrobatch
    through a ring of MACROBATCH_RING_SLOTS macrobatches of that many m-blocks, and every row
    buffer (``rows``, ``h``, ``act``, ``dout``, ``dh``: ``macrobatch_ring_rows`` rows;
    ``dprob_part``) is the ring's; ``carry`` (``backward_carry``) holds weight-gradient tiles
    between macrobatches. ``dout``, ``dh`` and ``dprob_part`` (fp32, ``dprob_part_size``) are
    the launch's own buffers. Each weight gradient goes to ``dw`` (bf16, stacked like the
    weight) or is added into fp32 tensors whose addresses ``dw_fp32`` lists (int64 [E], e.g.
    Megatron's main_grad). ``counters``: ``backward_megakernel_counters(...)``, zeroed before
    every launch. ``mxfp8`` (ring only): every GEMM multiplies MXFP8 values
    (MxBackwardOperands), ``w1`` then being W1's MXFP8 values along H; the launch rounds dY,
    x, act and dh itself, overwriting ``dout``, ``rows``, ``act`` and ``dh`` with their forms
    along the rows. ``fp8_blockwise`` (ring only): the blockwise recipe's operands
    (Fp8BackwardOperands; ``w1`` and ``w2`` stay the bf16 weights, which give the shapes): the
    launch quantizes dY, x and dh along K into its buffers and rounds them, and act, along the
    rows in place, as under mxfp8. ``trace``: ``backward_trace_buffer(...)`` to record the
    blocks' timestamps (``BACKWARD_TRACE_SLOTS``, ``TRACE_HEADER``;
    benchmarks/diagnostics/trace_backward.py reads them) in the launch's diagnostic kernel, or
    None."""
    _cuda("peer_bases", peer_bases, torch.int64)
    _cuda("offsets", offsets, torch.int32)
    _cuda("row_slot", row_slot, torch.int32)
    _cuda("row_prob", row_prob, torch.float32)
    _cuda("counters", counters, torch.int32)
    _cuda("dprob_part", dprob_part, torch.float32)
    if carry is not None:
        _cuda("carry", carry, torch.float32)
    for name, t in (("rows", rows), ("h", h), ("act", act), ("dout", dout), ("dh", dh),
                    ("dw1", dw1), ("dw2", dw2)):
        if t is not None:
            _cuda(name, t, torch.bfloat16)
    for name, t in (("dw1_fp32", dw1_fp32), ("dw2_fp32", dw2_fp32)):
        if t is not None:
            _cuda(name, t, torch.int64)
    _check((dw1 is None) != (dw1_fp32 is None) and (dw2 is None) != (dw2_fp32 is None),
           "each weight gradient is either bf16 (dw) or fp32 accumulated (dw_fp32)")
    _check(w1.dtype == torch.bfloat16 and w2.dtype == torch.bfloat16, "weights must be bf16")
    _check(0 <= rank < MAX_RANKS, f"rank {rank} outside [0, {MAX_RANKS})")
    _check(mxfp8 is None or fp8_blockwise is None, "one recipe's operands, not both")
    _check((mxfp8 is None and fp8_blockwise is None) or ring_mblocks > 0,
           "the FP8 recipes run with the ring (recomputed inputs) only")
    # The extension's recipe arguments: the dgrads' transposed weights and the buffers along K
    # (MXFP8 values, or blockwise codes with their scale codes in fp8_scales).
    along_k = mxfp8 or MxBackwardOperands(None, None, None, None, None)
    fp8_scales = []
    if mxfp8 is not None:
        for name, t in vars(mxfp8).items():
            _cuda(name, t, torch.bfloat16)
    if fp8_blockwise is not None:
        # Codes rows padded to 16 bytes (views; the launcher checks strides), scales contiguous.
        for name, (codes, scales) in vars(fp8_blockwise).items():
            _check(codes.is_cuda and codes.dtype == torch.float8_e4m3fn,
                   f"{name} must be float8_e4m3fn codes on the GPU, got {codes.dtype} on "
                   f"{codes.device}")
            _cuda(name + " scales", scales, torch.uint8)
        f = fp8_blockwise
        w1 = f.w1[0]
        along_k = MxBackwardOperands(f.w1_t[0], f.w2_t[0], f.rows_k[0], f.dout_k[0], f.dh_k[0])
        fp8_scales = [f.rows_k[1], f.dout_k[1], f.dh_k[1], f.w1[1], f.w1_t[1], f.w2_t[1]]
    stall_watch.install(timeout_reports)
    extension().moe_backward_megakernel(peer_bases, tokens_offset, inputs_offset, slots_offset,
                                        values_offset, offsets, row_slot, row_prob, max_tokens,
                                        topk, w1, w2, ACTIVATION_IDS[activation], rows, h, act,
                                        dout, dh, dprob_part, dw1, dw2, dw1_fp32, dw2_fp32,
                                        carry, along_k.w1_t, along_k.w2_t, along_k.rows_k,
                                        along_k.dout_k, along_k.dh_k, fp8_scales, counters,
                                        comm_blocks, minibatch_rows, ring_mblocks,
                                        MACROBATCH_RING_SLOTS, timeout_ns, rank, trace)


@dataclasses.dataclass(frozen=True)
class MxBackwardOperands:
    """What the backward megakernel reads under MXFP8 beyond the BF16 launch's arguments: the
    dgrads' weights as MXFP8 values along their K, transposed (``w1_t`` [E, H, F1] along F1,
    ``w2_t`` [E, F, H] along H: mxfp8_weights.RoundedWeights), and the launch's buffers of the
    forms rounded along K (``rows_k``, ``dout_k`` [ring rows, H], ``dh_k`` [ring rows, F1])."""

    w1_t: Optional[torch.Tensor]
    w2_t: Optional[torch.Tensor]
    rows_k: Optional[torch.Tensor]
    dout_k: Optional[torch.Tensor]
    dh_k: Optional[torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Fp8BackwardOperands:
    """What the backward megakernel reads under fp8_blockwise beyond the BF16 launch's
    arguments, each as (E4M3 codes, E8M0 scale codes): the weights as the FP8 engine reads them
    (fp8_block_weights.BlockWeight: ``w1`` [E, F1, H] for FC1 again, the dgrads' ``w1_t`` [E,
    H, F1] and ``w2_t`` [E, F, H], one scale per 128 x 128 block), and the launch's buffers of
    dY, x and dh along K (``rows_k``, ``dout_k`` [ring rows, H], ``dh_k`` [ring rows, F1]:
    megakernel_fp8_rows)."""

    w1: tuple
    w1_t: tuple
    w2_t: tuple
    rows_k: tuple
    dout_k: tuple
    dh_k: tuple


DGRAD2_COLS = 128  # csrc/megakernel/backward_tiles.cuh kDgrad2Cols
WGRAD_BLOCK_N = 256  # csrc/config/kernel_config.cuh kGemmBlockN
CARRY_FLOATS = 128 * 128  # csrc/gemm/sm90/wgrad.cuh kCarryFloats (one consumer warpgroup)
CONSUMERS = 2  # csrc/config/kernel_config.cuh kGemmConsumers


def dprob_part_size(rows: int, ffn: int) -> int:
    """fp32 values of the backward megakernel's per-row dprob partials: one per row and
    FC2-dgrad tile (DGRAD2_COLS columns of F)."""
    return rows * -(-ffn // DGRAD2_COLS)


def backward_wgrad_tiles(hidden: int, ffn: int, f1: int) -> int:
    """Weight-gradient tiles of one expert in the backward megakernel (dW2 [H, F], dW1 [F1,
    H] in MEGAKERNEL_BLOCK_M x WGRAD_BLOCK_N tiles; csrc BackwardOrder::wgrad_tiles)."""
    def tiles(m, n):
        return -(-m // MEGAKERNEL_BLOCK_M) * -(-n // WGRAD_BLOCK_N)
    return tiles(hidden, ffn) + tiles(f1, hidden)


def macrobatch_mblocks(macrobatch_tokens: int) -> int:
    """The rings' macrobatch size in m-blocks (kernel.macrobatch_tokens rounded up)."""
    return -(-macrobatch_tokens // MEGAKERNEL_BLOCK_M)


# Macrobatches one backward megakernel launch can walk (csrc kMaxMacrobatches).
MAX_MACROBATCHES = 256


def macrobatches(rows: int, num_experts: int, ring_mblocks: int) -> int:
    """Macrobatches of `ring_mblocks` m-blocks a schedule of `rows` rows can need (1 without
    a ring)."""
    return -(-_max_mblocks(rows, num_experts) // ring_mblocks) if ring_mblocks > 0 else 1


def backward_megakernel_counters(rows: int, num_experts: int, device, ring_mblocks: int = 0,
                                 wgrad_tiles: int = 0,
                                 rounding_tiles: bool = False) -> torch.Tensor:
    """Zeroed counters for a backward megakernel launch over `rows` scheduled rows: per
    m-block rows pulled, FC1 and FC2-dgrad tile halves stored; per macrobatch tile halves
    done; with the ring (``ring_mblocks``), per macrobatch and weight-gradient tile
    (``backward_wgrad_tiles``) the carries stored; per macrobatch the three totals; the tile
    counter and the arrival ticket counter; with ``rounding_tiles`` (the FP8 recipes), per
    m-block and then per macrobatch the halves of their three kinds."""
    macros = macrobatches(rows, num_experts, ring_mblocks)
    mblocks = _max_mblocks(rows, num_experts)
    carry_flags = macros * wgrad_tiles * CONSUMERS if ring_mblocks > 0 else 0
    rounded = 3 * mblocks + 3 * macros if rounding_tiles else 0
    return torch.zeros(3 * mblocks + 4 * macros + carry_flags + 2 + rounded,
                       dtype=torch.int32, device=device)


def backward_carry(rows: int, num_experts: int, ring_mblocks: int, wgrad_tiles: int,
                   device) -> Optional[torch.Tensor]:
    """The fp32 weight-gradient carries of a backward megakernel launch with the ring
    (MACROBATCH_RING_SLOTS + 1 slots of one expert's tiles), or None where no expert can cross
    a macrobatch boundary (a single macrobatch)."""
    if ring_mblocks <= 0 or macrobatches(rows, num_experts, ring_mblocks) <= 1:
        return None
    return torch.empty((MACROBATCH_RING_SLOTS + 1) * wgrad_tiles * CONSUMERS * CARRY_FLOATS,
                       dtype=torch.float32, device=device)


PROFILE_SKIP = {"pull": 1, "waits": 2, "fc1": 4, "fc2": 8, "stores": 16, "mma": 32,
                "loads": 64}  # csrc ProfileSkip

# The forward megakernel's trace layout (csrc/megakernel/tile_trace.cuh): per block, TRACE_TILES tiles
# of TRACE_SLOTS values (clock64, except "tile_id" = tile * 2 + fc1), then TRACE_HEADER.
TRACE_TILES = 64
TRACE_SLOTS = ("tile_start", "tile_queued", "mainloop_end", "tile_end", "tile_id",
               "producer_start", "pushed", "ready", "loads_issued", "staged", "storer_took",
               "storer_h_out", "storer_activated", "storer_released", "storer_done")
TRACE_HEADER = ("start_ns", "start_clock", "end_ns", "end_clock", "pull_end_clock", "ticket")

# The backward megakernel's (csrc/megakernel/backward_trace.cuh): "tile_id" = tile * 8 + kind
# (BACKWARD_KINDS), "macro", "rows" and "part" values, the rest clock64; the same header.
BACKWARD_TRACE_TILES = 512
BACKWARD_TRACE_SLOTS = ("tile_start", "tile_queued", "inputs_ready", "mainloop_end",
                        "epilogue1", "epilogue2", "tile_end", "tile_id", "macro", "rows", "part",
                        "producer_start", "taken", "pushed", "ready", "loads_issued",
                        "storer_took", "storer_made", "storer_released", "storer_done")
BACKWARD_KINDS = ("fc1", "dgrad2", "wgrad2", "dgrad1", "wgrad1", "round_in", "round_act",
                  "round_dh")  # csrc BackwardKind


def _trace_buffer(device, tiles: int, slots: int) -> torch.Tensor:
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return torch.zeros(sms, tiles * slots + len(TRACE_HEADER), dtype=torch.int64, device=device)


def _trace_parts(trace: torch.Tensor, tiles: int, slots: int):
    cut = tiles * slots
    return trace[:, :cut].view(trace.shape[0], tiles, slots), trace[:, cut:]


def megakernel_trace_buffer(device) -> torch.Tensor:
    """Zeroed int64 [SMs, TRACE_TILES * len(TRACE_SLOTS) + len(TRACE_HEADER)] for a traced
    megakernel launch (one row per block of its SM-count grid)."""
    return _trace_buffer(device, TRACE_TILES, len(TRACE_SLOTS))


def megakernel_trace_parts(trace: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of a trace buffer (megakernel_trace_buffer): the tiles' stamps [blocks,
    TRACE_TILES, len(TRACE_SLOTS)] and the blocks' headers [blocks, len(TRACE_HEADER)]."""
    return _trace_parts(trace, TRACE_TILES, len(TRACE_SLOTS))


def backward_trace_buffer(device) -> torch.Tensor:
    """Zeroed int64 [SMs, BACKWARD_TRACE_TILES * len(BACKWARD_TRACE_SLOTS) +
    len(TRACE_HEADER)] for a traced backward megakernel launch."""
    return _trace_buffer(device, BACKWARD_TRACE_TILES, len(BACKWARD_TRACE_SLOTS))


def backward_trace_parts(trace: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of a backward trace buffer (backward_trace_buffer): the tiles' stamps [blocks,
    BACKWARD_TRACE_TILES, len(BACKWARD_TRACE_SLOTS)] and the blocks' headers."""
    return _trace_parts(trace, BACKWARD_TRACE_TILES, len(BACKWARD_TRACE_SLOTS))


# Macrobatches the megakernel's ring holds at once: FC2 lags FC1 by one macrobatch and the
# pull runs one ahead of FC1 (csrc/megakernel/macrobatch_ring.cuh; at least 2).
MACROBATCH_RING_SLOTS = 3


def _max_mblocks(rows: int, num_experts: int) -> int:
    return rows // MEGAKERNEL_BLOCK_M + num_experts + 1


def megakernel_counters(rows: int, num_experts: int, device,
                        ring_mblocks: int = 0) -> torch.Tensor:
    """Zeroed counters for a megakernel launch over `rows` scheduled rows: per m-block (at
    most rows / 128 + num_experts + 1) rows pulled and FC1 tile halves stored, per
    macrobatch FC2 tile halves done, then the counter that hands out tiles and the one that
    gives each block its arrival ticket (its role)."""
    return torch.zeros(2 * _max_mblocks(rows, num_experts)
                       + macrobatches(rows, num_experts, ring_mblocks) + 2,
                       dtype=torch.int32, device=device)


def macrobatch_ring_rows(rows: int, num_experts: int, ring_mblocks: int) -> int:
    """Rows of a megakernel's row buffers over a schedule of `rows` rows: with the ring
    (ring_mblocks > 0) its slots (never more than the padded schedule needs), without it every
    schedule row (csrc RingSize)."""
    if ring_mblocks <= 0:
        return rows
    return min(MACROBATCH_RING_SLOTS * ring_mblocks,
               _max_mblocks(rows, num_experts)) * MEGAKERNEL_BLOCK_M


WAIT_ROLES = ("gemm producer", "gemm mma", "rows ready", "fc1 done", "pull slot",
              "pull row", "tile queue", "ring slot", "staging", "fc2 dgrad done",
              "h tile", "wgrad carry", "operands rounded")  # csrc sm90::WaitRole
REPORT_KERNELS = ("grouped GEMM engine", "forward megakernel",
                  "backward megakernel")  # csrc ReportKernel


def timeout_reports() -> list[dict]:
    """Every bounded wait of a persistent kernel (grouped GEMM, megakernel) that timed out in
    this process - the kernel traps after writing where - one per (kernel, EP rank). Readable
    after the trap: the records live in host memory, and reading them calls no CUDA API."""
    flat = extension().timeout_reports()
    reports = []
    for i in range(0, len(flat), 7):
        kernel, rank, role, block, tile, stage, timeout_ms = flat[i:i + 7]
        reports.append({"kernel": REPORT_KERNELS[kernel], "rank": rank,
                        "role": WAIT_ROLES[role], "block": block, "tile": tile,
                        "stage": stage, "timeout_ms": timeout_ms})
    return reports
