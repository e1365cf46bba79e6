#!/usr/bin/env bash
# Run the GPU kernel benchmark and correctness suite on a lent GPU machine (device tool).
#
#   bash bench/gpu_run.sh            # both: bench first, then tests/gpu
#   bash bench/gpu_run.sh bench      # bench/kernel_speed.py only
#   bash bench/gpu_run.sh tests      # tests/gpu only
#   bash bench/gpu_run.sh shapes     # bench/shape_sweep.py, then tests/gpu/test_gpu_shapes.py
#
# The machine has no network, so packages travel in .whl/ (carry it), all in one call
# (60.7 MB with the repo under the 64 MiB a call may carry):
#   - flashinfer-python 0.7.2.post1, slimmed (JIT sources of unrelated kernels removed,
#     see kernels/README.md), apache-tvm-ffi, cuda-tile, torch-c-dlpack-ext;
#   - nvidia-cudnn-frontend 1.32.0;
#   - vLLM 0.25.0's bundled FlashAttention (the vLLM wheel built for torch 2.11): only
#     vllm/vllm_flash_attn/{__init__,flash_attn_interface}.py and _vllm_fa3_C.abi3.so,
#     the FA3 library xz-compressed (153 MB -> 8 MB; zip gets 38 MB). No FA2 library,
#     no FA4 (cute) sources: this is the FA3 a vLLM pod runs on Hopper. The rest of
#     vLLM is absent, so vllm/__init__.py and vllm.platforms.current_platform are a
#     tiny stub written here (vllm_flash_attn asks it only for the device capability).
# The repo's modules are importable as mla_switchboard.* through symlinks, the same
# mapping pyproject's package-dir gives an installed copy. Everything lands in $OUT.
set -uo pipefail
phase=${1:-all}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export FLASHINFER_CUDA_ARCH_LIST="${FLASHINFER_CUDA_ARCH_LIST:-9.0a}"
site=/tmp/site
test_timeout=${TEST_TIMEOUT:-330}
bench_deadline=${BENCH_DEADLINE:-200}

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" .whl/*.whl || exit 3
if [ -f .whl/vllm-0.25.0-_vllm_fa3_C.abi3.so.xz ]; then
  tar -xzf .whl/vllm-0.25.0-vllm_flash_attn-py.tar.gz -C "$site" || exit 4
  python3 - "$site" <<'EOF' || exit 4
import lzma, pathlib, shutil, sys
site = pathlib.Path(sys.argv[1])
with lzma.open(".whl/vllm-0.25.0-_vllm_fa3_C.abi3.so.xz") as src, open(
    site / "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "wb"
) as dst:
    shutil.copyfileobj(src, dst, 16 << 20)
(site / "vllm/__init__.py").write_text(
    '"""Stub: only vllm.vllm_flash_attn from the vLLM 0.25.0 wheel is here."""\n'
    '__version__ = "0.25.0"\n'
)
(site / "vllm/platforms").mkdir(exist_ok=True)
(site / "vllm/platforms/__init__.py").write_text('''"""Stub of vllm.platforms: the capability queries vllm_flash_attn makes."""
import torch


class _CudaPlatform:
    def get_device_capability(self, device_id: int = 0):
        return torch.cuda.get_device_capability(device_id)

    def _cap(self) -> int:
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor

    def has_device_capability(self, capability: int, device_id: int = 0) -> bool:
        return self._cap() >= capability

    def is_device_capability(self, capability: int, device_id: int = 0) -> bool:
        return self._cap() == capability

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        return self._cap() // 10 == capability // 10

    def is_cuda(self) -> bool:
        return True


current_platform = _CudaPlatform()
''')
EOF
fi
mkdir -p "$site/mla_switchboard"
for part in core kernels agent service; do ln -sfn "$PWD/$part" "$site/mla_switchboard/$part"; done
export PYTHONPATH="$site:$PWD"

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 - <<'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("capability", torch.cuda.get_device_capability(), torch.cuda.get_device_name())
for name in ("cudnn", "flashinfer", "vllm", "vllm.vllm_flash_attn", "flash_attn",
             "flash_attn_interface", "tokenspeed_mla"):
    try:
        mod = importlib.import_module(name)
        print(name, getattr(mod, "__version__", "?"))
    except Exception as exc:
        print(name, "not importable:", type(exc).__name__, exc)
from mla_switchboard import kernels
for b, opts in (("FLASH_ATTN", {}), ("FLASHINFER", {}), ("CUDNN", {})):
    try:
        inst = kernels.get(b).create(16, 128, 64, 128, 192 ** -0.5, "bf16", "cuda", **opts)
        print(b, "->", inst.impl, getattr(inst, "tried", ""))
    except Exception as exc:
        print(b, "unavailable:", exc)
EOF
} 2>&1 | tee "$out/env.txt"

if [ "$phase" = all ] || [ "$phase" = bench ]; then
  t0=$(date +%s)
  timeout $(( bench_deadline + 150 )) python3 -m bench.kernel_speed \
    --deadline "$bench_deadline" --out "$out/kernels.json" 2>&1 | tee "$out/bench.log"
  echo "bench took $(( $(date +%s) - t0 )) s" | tee -a "$out/bench.log"
fi
if [ "$phase" = all ] || [ "$phase" = shapes ]; then
  t0=$(date +%s)
  timeout "$test_timeout" python3 -m bench.shape_sweep --warm 3 --deadline "$(( test_timeout - 30 ))" \
    --out "$out/shapes.json" \
    2>&1 | tee "$out/shapes.log"
  timeout "$test_timeout" python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu_shapes.py \
    2>&1 | tee "$out/pytest-shapes.log"
  echo "shapes took $(( $(date +%s) - t0 )) s" | tee -a "$out/shapes.log"
fi
if [ "$phase" = all ] || [ "$phase" = tests ]; then
  t0=$(date +%s)
  KERNELS_GPU_REPORT="$out/gpu-checks.jsonl" \
    timeout "$test_timeout" python3 -m pytest -q -rs -p no:cacheprovider tests/gpu \
    --ignore=tests/gpu/test_gpu_shapes.py 2>&1 \
    | tee "$out/pytest-gpu.log"
  echo "tests took $(( $(date +%s) - t0 )) s" | tee -a "$out/pytest-gpu.log"
fi
