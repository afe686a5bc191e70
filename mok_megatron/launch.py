"""`torchrun ... -m mok_megatron.launch SCRIPT ARGS...`: register the `mok` dispatcher with
Megatron, then run SCRIPT unchanged as __main__ (see mok_megatron/megatron/launch.py)."""

import sys

from mok_megatron.megatron.launch import main

if __name__ == "__main__":
    main(sys.argv[1:])
