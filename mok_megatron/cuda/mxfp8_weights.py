"""MXFP8 expert weights quantized once per optimizer step, in both orientations, cached
across micro-batches, in one of two forms (kernel.mxfp8_weights): the E4M3 codes, one byte per
weight instead of two, with their scales in the layout the engine that dequantizes codes to
bf16 in shared memory loads them (csrc/gemm/sm90/mx_weight_stage.cuh; quantize_pair), or the
same values as bf16 for the tile engine to multiply as they are (round_pair: two bytes per
weight and orientation, no per-tile conversion).

    forward  W1 [E, F1, H] blocks along H     h   = Q(rows) W1^T
             W2 [E, H, F]  blocks along F     out = Q(act) W2^T
    dgrad    W2^T [E, F, H] blocks along H    dA  = Q(dY) W2
             W1^T [E, H, F1] blocks along F1  dX  = Q(dh) W1

Code rows are padded to 16 bytes (TMA's stride unit; the pad is never read), scales are laid
out as the GEMM's stages load them: E8M0 [E, blocks, halves, rows of a half padded to 16]. Both
orientations together hold about 1.03x the bytes of the bf16 weights themselves.

When they are quantized again: after every torch optimizer step (a global step post-hook:
Megatron's optimizers, the distributed one included, step a torch optimizer before they copy
or all-gather the new parameters, and the next forward reads them), when the weights' addresses,
shapes, strides or version counters change (a checkpoint loaded with copy_), or after
``weights_changed()`` (writes none of those see, such as ``p.data.copy_``).

Under CUDA graphs: a quantizer registered with ``refreshes_in_place`` (the blockwise one) is
refreshed into the cached tensors themselves, and each cache entry holds a device flag that
``weights_changed()`` (the optimizer-step hook) sets; a capture records the quantization reading
that flag (it writes nothing while the flag is 0) and then clearing it, so a replay quantizes
only the first time after the weights changed, and graphs and eager calls read the same
tensors. A capture with no entry cached for the layer yet (no eager call before it), and the
MXFP8 quantizers, quantize at every replay - said once in the log. A replay sees only the
flag: weights written in place outside an optimizer step (a checkpoint loaded with copy_ after
the capture) need ``weights_changed()`` before the next replay.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.weak import WeakIdKeyDictionary

from . import ops

log = logging.getLogger(__name__)

_TMA_ROW_BYTES = 16
_generation = 0
_cache = WeakIdKeyDictionary()  # owner tensor -> _Entry
_in_place: set = set()  # quantizers that take into= and only_if= (refreshes_in_place)
_said_per_replay: set = set()


@dataclass
class _Entry:
    layout: tuple  # what the cached tensors' shapes and the weights' addresses depend on
    state: tuple  # (generation, version counters) the tensors were quantized at
    weights: object
    # int32 [1] on the device, 1 once the weights changed (what a graph replay reads); only for
    # quantizers registered with refreshes_in_place, None for the others
    stale: Optional[torch.Tensor]


def refreshes_in_place(quantize: Callable) -> Callable:
    """Register a quantizer that takes ``into=`` (an earlier result, refreshed in place) and
    ``only_if=`` (a device flag: nothing written while it holds 0)."""
    _in_place.add(quantize)
    return quantize


def weights_changed() -> None:
    """Quantize every layer's weights again at its next call (or graph replay)."""
    global _generation
    _generation += 1
    for entry in list(_cache.values()):
        if entry.stale is not None:
            entry.stale.fill_(1)


register_optimizer_step_post_hook(lambda *_: weights_changed())


def clear() -> None:
    """Drop every layer's cached weights now (their memory back; the next call quantizes)."""
    _cache.clear()


@dataclass
class MxWeight:
    codes: torch.Tensor  # float8_e4m3fn [E, N, K], rows padded to 16 bytes
    scales: torch.Tensor  # uint8 E8M0 [E, ceil(K / 32), halves, N / halves padded to 16]


@dataclass
class Mxfp8Weights:
    w1: MxWeight  # FC1 [E, F1, H]
    w2: MxWeight  # FC2 [E, H, F]
    w1_t: MxWeight  # FC1-dgrad [E, H, F1]
    w2_t: MxWeight  # FC2-dgrad [E, F, H]


def _pad16(n: int) -> int:
    return -(-n // _TMA_ROW_BYTES) * _TMA_ROW_BYTES


def _blocks(n: int) -> int:
    return -(-n // ops.MX_BLOCK)


def quantize_weight(w: torch.Tensor, halves: int = 1) -> MxWeight:
    """A stacked weight [E, N, K] (bf16) with blocks along K; `halves` = 2: a gated FC1, whose
    gate and up rows the GEMM reads as two halves."""
    E, n, k = w.shape
    codes = torch.empty(E, n, _pad16(k), dtype=torch.float8_e4m3fn, device=w.device)[..., :k]
    scales = torch.zeros(E, _blocks(k), halves, _pad16(n // halves), dtype=torch.uint8,
                         device=w.device)
    ops.mx_quantize_columns(w.reshape(E * n, k).contiguous(), codes, scales, matrix_rows=n,
                            halves=halves)
    return MxWeight(codes, scales)


def quantize_weight_transposed(w: torch.Tensor) -> MxWeight:
    """A stacked weight [E, r, c] (bf16) in its other orientation: codes [E, c, r] with blocks
    along r, straight from w (no transposed bf16 copy)."""
    E, r, c = w.shape
    codes = torch.empty(E, c, _pad16(r), dtype=torch.float8_e4m3fn, device=w.device)[..., :r]
    scales = torch.zeros(E, _blocks(r), 1, _pad16(c), dtype=torch.uint8, device=w.device)
    ops.mx_quantize_rows_transposed(w.contiguous(), codes, scales)
    return MxWeight(codes, scales)


def quantize_pair(w1: torch.Tensor, w2: torch.Tensor, gated: bool) -> Mxfp8Weights:
    """Both orientations of a layer's stacked weights."""
    return Mxfp8Weights(quantize_weight(w1, 2 if gated else 1), quantize_weight(w2),
                        quantize_weight_transposed(w1), quantize_weight_transposed(w2))


@dataclass
class RoundedWeights:
    """The same MXFP8 values as bf16 (exact: E4M3 codes times powers of two), in the
    orientations and shapes of Mxfp8Weights' codes (kernel.mxfp8_weights: rounded): the tile
    engine multiplies them as plain bf16 weights, 2 bytes per weight and orientation."""
    w1: torch.Tensor  # FC1 [E, F1, H], blocks along H
    w2: torch.Tensor  # FC2 [E, H, F], blocks along F
    w1_t: torch.Tensor  # FC1-dgrad [E, H, F1], blocks along F1
    w2_t: torch.Tensor  # FC2-dgrad [E, F, H], blocks along H


def _round_rows(w: torch.Tensor) -> torch.Tensor:
    """w [E, n, k] rounded along k (each row's blocks of 32)."""
    E, n, k = w.shape
    return ops.mx_round_columns(w.reshape(E * n, k)).view(E, n, k)


def round_pair(w1: torch.Tensor, w2: torch.Tensor, gated: bool) -> RoundedWeights:
    """Both orientations of a layer's stacked weights as MXFP8 values in bf16 (``gated`` is
    part of the cache key only: rounding along a row does not depend on it)."""
    return RoundedWeights(_round_rows(w1.contiguous()), _round_rows(w2.contiguous()),
                          _round_rows(w1.transpose(1, 2).contiguous()),
                          _round_rows(w2.transpose(1, 2).contiguous()))


def layer_weights(owner: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, version: int,
                  gated: bool, quantize: Optional[Callable] = None):
    """The layer's quantized weights (``quantize(w1, w2, gated)``: MXFP8's quantize_pair when
    None, round_pair, or fp8_block_weights.quantize_pair), quantized again only when the
    module docstring says.
    `owner`: the tensor the cache entry lives and dies with (the layer's first weight);
    `version`: the sum of the version counters of every weight tensor the caller was given;
    `gated`: FC1 is [gate | up] (a gated activation)."""
    quantize = quantize or quantize_pair
    layout = (quantize, gated, w1.data_ptr(), w2.data_ptr(), tuple(w1.shape), tuple(w2.shape),
              w1.stride(), w2.stride(), w1.device)
    entry = _cache.get(owner)
    cached = entry is not None and entry.layout == layout
    in_place = cached and quantize in _in_place
    if w1.is_cuda and torch.cuda.is_current_stream_capturing():
        if not in_place:
            _say_per_replay(quantize, entry is None)
            return quantize(w1, w2, gated)
        quantize(w1, w2, gated, into=entry.weights, only_if=entry.stale)
        entry.stale.zero_()
        return entry.weights
    state = (_generation, version)
    if cached and entry.state == state:
        return entry.weights
    if in_place:
        quantize(w1, w2, gated, into=entry.weights)
        entry.stale.zero_()
        entry.state = state
        return entry.weights
    weights = quantize(w1, w2, gated)
    stale = (torch.zeros(1, dtype=torch.int32, device=w1.device) if quantize in _in_place
             else None)
    _cache[owner] = _Entry(layout, state, weights, stale)
    return weights


def _say_per_replay(quantize: Callable, uncached: bool) -> None:
    key = (quantize, uncached)
    if key in _said_per_replay:
        return
    _said_per_replay.add(key)
    if quantize in _in_place:
        why = ("no eager call before the capture cached this layer's weights; one before "
               "capturing makes replays quantize only after the weights change")
    else:
        why = f"{quantize.__module__}.{quantize.__name__} is not refreshed in place"
    log.warning("mok: a CUDA graph captured a layer's weight quantization, which then runs at "
                "every replay (%s)", why)
