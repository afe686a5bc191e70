"""The CUDA backend: the autograd Function over the kernels (symm_moe.py), the plan a call
becomes (plan.py), the two paths - separate kernels (separate_path.py) and the megakernels
(megakernel_path.py) - with each recipe's GEMM operands (operands.py), the symmetric-memory
workspace (workspace.py), the weight caches of the FP8 recipes (mxfp8_weights.py,
fp8_block_weights.py), Megatron's main_grad (main_grad.py), and the checked wrappers of the
compiled extension mok_megatron._C (ops.py, stall_watch.py)."""
