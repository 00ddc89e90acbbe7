#!/usr/bin/env bash
# On an NVIDIA GPU: first the cuda-marked tests (the fused attention against the CPU path and the cache against
# forward with a memory, float32), then the training speed of the wt103-base shape (issue 10): bf16 and TF32,
# eager and compiled; one JSON line per variant. Arguments go to benchmarks/gpu_train.py (--device cpu --steps 2
# checks the path on a CPU). TXL_GPU_SKIP_TESTS=1 skips the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2 || true
fi
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
if [[ "${TXL_GPU_SKIP_TESTS:-0}" != 1 ]]; then
    "${PYTHON:-python3}" -m pytest -q -m cuda tests/test_cuda.py >&2
fi
exec "${PYTHON:-python3}" benchmarks/gpu_train.py "$@"
