#!/usr/bin/env bash
# Run the GPU kernel suite and benchmark on a lent GPU machine (the device tool).
#
#   bash bench/gpu_run.sh cudnn       # TORCH_SDPA, FLASH_ATTN (torch-bundled FA2), CUDNN
#   bash bench/gpu_run.sh flashinfer  # FLASHINFER (JIT-compiles its kernels first)
#
# The machine has no network, so packages travel as wheels in .whl/ (carry it):
# flashinfer-python 0.7.2.post1 (slimmed: JIT sources of unrelated kernels removed
# to fit the 64 MiB a call may carry), apache-tvm-ffi, cuda-tile,
# torch-c-dlpack-ext and nvidia-cudnn-frontend 1.32. Two phases because one call may
# run 10 minutes and FlashInfer's JIT alone can take several. Each phase is
# self-contained: it installs the wheels to /tmp/site, records the environment,
# runs tests/gpu for its backends (results also as JSON lines) and the benchmark,
# and leaves everything under $OUT.
set -uo pipefail
phase=${1:?usage: gpu_run.sh cudnn|flashinfer}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
case "$phase" in
  cudnn)
    tests=TORCH_SDPA,FLASH_ATTN,CUDNN
    bench="FLASH_ATTN,CUDNN,TORCH_SDPA,TRTLLM_RAGGED"
    bench_extra=""
    ;;
  flashinfer)
    tests=FLASHINFER
    bench="FLASHINFER"
    bench_extra="--extra"
    export FLASHINFER_CUDA_ARCH_LIST="${FLASHINFER_CUDA_ARCH_LIST:-9.0a}"
    ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
test_timeout=${TEST_TIMEOUT:-300}
bench_deadline=${BENCH_DEADLINE:-120}

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 - <<'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("capability", torch.cuda.get_device_capability(), torch.cuda.get_device_name())
print(torch.ops.aten._flash_attention_forward.default._schema)
for name in ("cudnn", "flashinfer", "flash_attn", "flash_attn_interface"):
    try:
        mod = importlib.import_module(name)
        print(name, getattr(mod, "__version__", "?"))
    except Exception as exc:
        print(name, "not importable:", type(exc).__name__, exc)
EOF
} 2>&1 | tee "$out/env-$phase.txt"

t0=$(date +%s)
KERNELS_GPU_BACKENDS=$tests KERNELS_GPU_REPORT="$out/checks-$phase.jsonl" \
  timeout "$test_timeout" python3 -m pytest -q -rs -p no:cacheprovider tests/gpu 2>&1 \
  | tee "$out/pytest-$phase.log"
echo "tests took $(( $(date +%s) - t0 )) s" | tee -a "$out/pytest-$phase.log"

t0=$(date +%s)
timeout $(( bench_deadline + 120 )) python3 -m bench.kernel_speed --backends "$bench" $bench_extra \
  --deadline "$bench_deadline" --out "$out/bench-$phase.json" 2>&1 | tee "$out/bench-$phase.log"
echo "bench took $(( $(date +%s) - t0 )) s" | tee -a "$out/bench-$phase.log"
