#!/bin/sh
# The accelerator bench on one lent GPU, as the one command a session with a GPU runs: the JAX
# engine's step against Hugging Face PyTorch (eager and torch.compile) on BERT-base seq 512 batch
# 64 and GPT-2 small seq 1024 batch 32, printing the table (and bench/accel-gpu.json).
# The lent machine: Python 3.12, jax 0.11.2 + CUDA, flax 0.12.10, optax 0.2.8, torch 2.11,
# transformers 5.17, no TensorFlow; one Python for both sides. About 4-6 minutes on an H200
# (compiles: ~40 s per JAX cold start and per torch.compile); stopped at 8.
#
#     sh bench/gpu_bench.sh [--quick] [--cases gpt2]
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
exec timeout 480 "$PYTHON" -m bench.accel_bench --full --json bench/accel-gpu.json "$@"
