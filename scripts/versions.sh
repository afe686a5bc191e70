# The versions that scripts/setup_env.sh installs and .ci/run tests (sourced by both).
TORCH_VERSION=2.11.0
# megatron-core: setup.py accepts the supported range (>=0.17.1,<0.20). setup_env.sh installs
# MEGATRON_CORE_VERSION, on which CI runs the whole suite; CI runs the tests that use Megatron
# again on each of MEGATRON_CORE_ALSO_TESTED, the last one being the oldest supported.
MEGATRON_CORE_VERSION=0.19.2
MEGATRON_CORE_ALSO_TESTED=(0.18.2 0.17.1)
# Megatron-Bridge, for the tests of mok_megatron.megatron.bridge against its real model
# provider: installed without its dependencies (its full set does not install on a CPU machine:
# docs/megatron.md), which the modules those tests import do not need, omegaconf aside.
MEGATRON_BRIDGE_VERSION=0.6.2
