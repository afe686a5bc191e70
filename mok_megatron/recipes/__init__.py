"""The FP8 recipes' number formats in plain PyTorch: MXFP8 (mxfp8.py) and blockwise FP8
(fp8_blockwise.py) quantizers and the expert MLP over quantized operands (quantized_mlp.py).
The reference backend computes with them, and the CUDA kernels are checked against them."""
