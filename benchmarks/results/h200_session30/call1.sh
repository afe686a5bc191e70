#!/bin/bash
# Session 30, call 1 (one GPU): the FP8 grouped GEMM whose consumers issue block kb + 1's MMAs
# before kb's promotion (two partial-sum sets, no trap after setmaxnreg.inc) against main's
# a7cab5d build (.old_so, carried): outputs bit for bit on fixed problems, the FP8 kernels'
# tests, bench_gemm's engine figures old and new at DeepSeek E=8 and MoK ep64 T=4096; then the
# Qwen layer's kernels per recipe (profile_recipes). $OUT/call1.tar.gz after every step.
#   bash benchmarks/results/h200_session30/call1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS
R=/tmp/call1; rm -rf $R; mkdir -p $R
save() { tar czf $OUT/call1.tar.gz -C /tmp call1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $R/gpu.txt
cat $R/gpu.txt
NEW=$PWD OLD=/tmp/oldrepo
rm -rf $OLD; mkdir -p $OLD/benchmarks
cp -r mok_megatron scripts tests $OLD/; cp -r benchmarks/diagnostics $OLD/benchmarks/
cp .old_so/_C.cpython-312-x86_64-linux-gnu.so $OLD/mok_megatron/
S=benchmarks/results/h200_session30
for v in old new; do
  R0=$([ $v = old ] && echo $OLD || echo $NEW)
  PYTHONPATH=/tmp/site:$R0 timeout 120 python3 $S/engine_outputs.py $R/out_$v.pt > $R/outputs_$v.txt 2>&1
  echo "outputs $v rc $? $(tail -1 $R/outputs_$v.txt)"
done
python3 - $R/out_old.pt $R/out_new.pt <<'PY' 2>&1 | tee $R/bits.txt
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
same = {k: all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(a[k], b[k])) for k in a}
print("bit-identical old vs new:", sum(same.values()), "of", len(same), [k for k, v in same.items() if not v])
PY
rm -f $R/out_*.pt  # ~1 GB: compared here, not kept
save
timeout 150 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_fp8_blockwise_kernels.py > $R/pytest_fp8_kernels.txt 2>&1
echo "fp8_kernels: $(tail -n 1 $R/pytest_fp8_kernels.txt)"
grep -E "^(FAILED|ERROR)" $R/pytest_fp8_kernels.txt | head -8 | cut -c1-220
save
gemm() {  # build (old|new), name, bench_gemm model arguments...
  local v=$1 name=$2; shift 2
  local R0=$([ $v = old ] && echo $OLD || echo $NEW)
  (cd $R0/scripts && PYTHONPATH=/tmp/site:$R0 timeout 120 python3 bench_gemm.py --fp8-blockwise \
    "$@" --tokens 4096 --out $R/gemm_${name}_$v.json > $R/gemm_${name}_$v.txt 2>&1)
  echo "bench_gemm $name $v rc $?"
  grep -E "FP8 blockwise|same blockwise|ring depth" $R/gemm_${name}_$v.txt | cut -c1-250 | head -6
  save
}
for v in new old new; do gemm $v deepseek_e8 --models deepseek_v3_like --variants full --ep 32; done
for v in new old; do gemm $v mok_ep64 --models mok_bench --variants ep64; done
PYTHONPATH=/tmp/site:$NEW timeout 150 python3 benchmarks/diagnostics/profile_recipes.py \
  --model qwen3_30b_a3b_like --variant ep64 --out $R/profile_qwen_ep64.json > $R/profile_qwen_ep64.txt 2>&1
echo "profile qwen ep64 rc $?"; cut -c1-150 $R/profile_qwen_ep64.txt | grep -v Warning | head -90
save
