"""Pretrain a GPT (MoE) model with Megatron-Core's own training loop, on mock data, with the
``mok`` dispatcher registered: a stand-in for Megatron-LM's pretrain_gpt.py (which no wheel
ships) for tests and for users without a Megatron-LM checkout.

    torchrun --nproc-per-node 2 scripts/pretrain_mok_gpt.py \
        --moe-token-dispatcher-type mok --expert-model-parallel-size 2 [Megatron args...]

It takes pretrain_gpt.py's arguments and runs ``megatron.training.pretrain`` the same way,
with these differences: data is always Megatron's MockGPTDataset (the tokenizer defaults to
NullTokenizer, so pass --vocab-size), and tensor, pipeline and context parallelism are left out
(sizes 1; expert and data parallelism work). With only the megatron-core wheel installed (no
Megatron-LM checkout) it also:
  - skips Megatron's build of the dataset index helper, which the wheel ships compiled but
    without its Makefile;
  - stops with the flags to add when Transformer Engine or Apex are missing (see
    WHEEL_ONLY_FLAGS), rather than failing deep inside model construction.
"""

import time

_PROGRAM_START_TIME = time.time()

import importlib.util  # noqa: E402
from functools import partial  # noqa: E402

import torch  # noqa: E402

from mok_megatron.megatron import register  # noqa: E402

register()

from megatron.core.datasets import utils as dataset_utils  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_builder import (  # noqa: E402
    BlendedMegatronDatasetBuilder,
)
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset  # noqa: E402
from megatron.core.enums import ModelType  # noqa: E402
from megatron.training import (  # noqa: E402
    get_args,
    get_timers,
    get_tokenizer,
    pretrain,
    print_rank_0,
    set_startup_timestamps,
)
from megatron.training.argument_utils import (  # noqa: E402
    gpt_config_from_args,
    pretrain_cfg_container_from_args,
)
from megatron.training.arguments import parse_and_validate_args  # noqa: E402

# What a run from the wheel alone needs (no Transformer Engine, no Apex).
WHEEL_ONLY_FLAGS = {
    "--transformer-impl local": lambda a: a.transformer_impl == "local",
    "--no-persist-layer-norm": lambda a: a.no_persist_layer_norm,
    "--no-masked-softmax-fusion": lambda a: not a.masked_softmax_fusion,
    "--no-bias-dropout-fusion": lambda a: not a.bias_dropout_fusion,
    "--no-bias-swiglu-fusion": lambda a: not a.bias_swiglu_fusion,
    "--no-gradient-accumulation-fusion": lambda a: not a.gradient_accumulation_fusion,
}


def check_supported(args) -> None:
    unsupported = {
        "--tensor-model-parallel-size": args.tensor_model_parallel_size,
        "--pipeline-model-parallel-size": args.pipeline_model_parallel_size,
        "--context-parallel-size": args.context_parallel_size,
    }
    for flag, size in unsupported.items():
        if size != 1:
            raise SystemExit(f"pretrain_mok_gpt.py runs {flag} 1 only (got {size}); use "
                             f"Megatron-LM's pretrain_gpt.py with the mok launcher for more")
    if args.data_path or args.train_data_path or args.sft:
        raise SystemExit("pretrain_mok_gpt.py trains on mock data only; for real data run "
                         "Megatron-LM's pretrain_gpt.py under "
                         "python -m mok_megatron.megatron.launch")
    have_te = importlib.util.find_spec("transformer_engine") is not None
    have_apex = importlib.util.find_spec("apex") is not None
    if not (have_te and have_apex):
        missing = [flag for flag, ok in WHEEL_ONLY_FLAGS.items() if not ok(args)]
        if missing:
            raise SystemExit("without Transformer Engine and Apex, add: " + " ".join(missing))


def skip_dataset_helper_build() -> None:
    """The wheel ships Megatron's compiled dataset helper but not the Makefile that
    initialize_megatron runs on rank 0 to build it; with the helper importable, skip the build."""
    if importlib.util.find_spec("megatron.core.datasets.helpers_cpp") is not None:
        dataset_utils.compile_helpers = lambda: None


def get_batch(data_iterator):
    batch = next(data_iterator)
    keys = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")
    return [batch[k].cuda(non_blocking=True) if batch.get(k) is not None else None for k in keys]


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    losses = output_tensor.view(-1).float()
    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * loss_mask)
    num_tokens = loss_mask.sum().clone().detach().to(torch.int)
    report = {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])}
    return loss, num_tokens, report


def forward_step(data_iterator, model):
    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    tokens, labels, loss_mask, attention_mask, position_ids = get_batch(data_iterator)
    timers("batch-generator").stop()
    output_tensor = model(tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask)
    return output_tensor, partial(loss_func, loss_mask)


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    args = get_args()
    config = GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        split=args.split,
        tokenizer=get_tokenizer(),
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=args.create_attention_mask_in_dataloader,
    )
    print_rank_0("> building mock train, validation, and test datasets for GPT ...")
    return BlendedMegatronDatasetBuilder(
        MockGPTDataset, train_val_test_num_samples, lambda: True, config
    ).build()


# Every rank builds its own (identical) mock datasets: no broadcast from a data rank.
train_valid_test_datasets_provider.is_distributed = True


def main() -> None:
    set_startup_timestamps(program_start=_PROGRAM_START_TIME, main_entry=time.time())
    skip_dataset_helper_build()
    args = parse_and_validate_args(args_defaults={"tokenizer_type": "NullTokenizer"})
    check_supported(args)
    config = pretrain_cfg_container_from_args(args, gpt_config_from_args(args))
    pretrain(config, train_valid_test_datasets_provider, ModelType.encoder_or_decoder,
             forward_step)


if __name__ == "__main__":
    main()
