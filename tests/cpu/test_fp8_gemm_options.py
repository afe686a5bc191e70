"""ops.fp8_grouped_gemm's tile options are checked before any tensor is looked at: the
192-column tiles (block_n) run the plain epilogue only, one CTA per tile, 4 stages."""

import pytest
import torch

from mok_megatron.cuda import ops

NONE = torch.empty(0)


def call(**options):
    ops.fp8_grouped_gemm(NONE, NONE, NONE, NONE, NONE, NONE, **options)


@pytest.mark.parametrize("block_n", [64, 256, 1])
def test_block_n_values(block_n):
    with pytest.raises(ValueError, match="block_n must be 0, 128 or 192"):
        call(block_n=block_n)


@pytest.mark.parametrize("options", [{"activation": "swiglu"}, {"cluster_ctas": 2},
                                     {"stages": 5}, {"stages": 6}])
def test_wide_tiles_take_the_plain_epilogue_one_cta_four_stages(options):
    with pytest.raises(ValueError, match="192-column tiles take the plain epilogue"):
        call(block_n=ops.FP8_WIDE_BLOCK_N, **options)


@pytest.mark.parametrize("options", [{}, {"stages": 4}, {"block_n": 128, "cluster_ctas": 2}])
def test_accepted_options_reach_the_tensor_checks(options):
    block_n = options.pop("block_n", ops.FP8_WIDE_BLOCK_N)
    with pytest.raises(ValueError, match="float8_e4m3fn codes on the GPU"):
        call(block_n=block_n, **options)
