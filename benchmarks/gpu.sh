#!/usr/bin/env bash
# Training speed of the wt103-base shape on an NVIDIA GPU (issue 10): bf16 and TF32, eager and compiled; one JSON
# line per variant. Arguments go to benchmarks/gpu_train.py (--device cpu --steps 2 checks the path on a CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2 || true
fi
PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python3}" benchmarks/gpu_train.py "$@"
