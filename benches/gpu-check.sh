#!/usr/bin/env bash
# GPU check: builds and runs the CUDA tests (differential against the CPU backend, codegen,
# NVRTC) and a short fused-vs-unfused benchmark. Needs one GPU; finishes in a few minutes.
# Record the output in docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
export KILN_REQUIRE_NVRTC=1
cargo test --release --test cuda_device --test cuda_render -- --nocapture --test-threads=1
cargo run --release --example gpu_bench
