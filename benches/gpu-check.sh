#!/usr/bin/env bash
# GPU check: the CUDA tests (device placement, allocator, the differential corpus against the
# CPU backend, large reductions, the fuzz corpus against the reference, once more with every
# reduction split over blocks), then a short fused-vs-unfused benchmark with achieved GB/s
# next to a device-to-device copy, reductions, the cost of a launch on a plan-cache hit,
# cuBLAS TFLOP/s, and `char_gpt` trained on the GPU with its default configuration.
# KILN_GPU_CRITERION=1 adds the criterion CUDA groups. Needs one GPU; finishes in a few
# minutes. Record the output in docs/benchmarks.md.
#
# With cargo on the machine it builds everything itself. On a machine without a Rust
# toolchain, build here with `benches/gpu-check.sh --build-only DIR` (copies the test and
# bench binaries into DIR) and run `KILN_BIN_DIR=DIR benches/gpu-check.sh` there.
# KILN_GPU_CASES sets the fuzz programs per profile (default 100).
set -uo pipefail
cd "$(dirname "$0")/.."

binaries() {
    local dir=$1
    mkdir -p "$dir"
    local json
    json=$(cargo test --release --no-run --test cuda_device --test differential --test cuda_render \
        --message-format=json 2>/dev/null; cargo bench --no-run --bench fusion --message-format=json 2>/dev/null)
    cargo build --release --example gpu_bench --example char_gpt || return 1
    for name in cuda_device differential cuda_render fusion; do
        local exe
        exe=$(printf '%s\n' "$json" | grep "\"name\":\"$name\"" | grep -o '"executable":"[^"]*"' |
            tail -1 | cut -d'"' -f4)
        [ -n "$exe" ] || { echo "no executable for $name" >&2; return 1; }
        objcopy --strip-debug "$exe" "$dir/$name" 2>/dev/null || cp "$exe" "$dir/$name"
    done
    for ex in gpu_bench char_gpt; do
        objcopy --strip-debug "target/release/examples/$ex" "$dir/$ex" 2>/dev/null ||
            cp "target/release/examples/$ex" "$dir/$ex"
    done
}

if [ "${1:-}" = "--build-only" ]; then
    binaries "${2:?usage: gpu-check.sh --build-only DIR}"
    exit $?
fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true

# Put NVRTC and cuBLAS on the loader path when the system loader does not know them.
for lib in libnvrtc.so libcublas.so; do
    if ! ldconfig -p 2>/dev/null | grep -q "$lib"; then
        found=$(find /usr/local /opt /usr/lib -name "$lib.1[23]*" 2>/dev/null | head -1)
        [ -n "$found" ] && export LD_LIBRARY_PATH="$(dirname "$found"):${LD_LIBRARY_PATH:-}"
    fi
done
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
export KILN_REQUIRE_NVRTC=1
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-${TMPDIR:-/tmp}/kiln-gpu-check-cubin}
export KILN_GPU_CASES=${KILN_GPU_CASES:-100}

BIN=${KILN_BIN_DIR:-}
if [ -z "$BIN" ]; then
    BIN=target/gpu-check
    binaries "$BIN" || exit 1
fi
# Binaries built elsewhere find the shipped data through the build machine's checkout path.
manifest=$(strings "$BIN/char_gpt" 2>/dev/null | grep -o '^/[^ ]*/data/tinyshakespeare.txt' | head -1)
root=${manifest%/data/tinyshakespeare.txt}
if [ -n "$root" ] && [ ! -e "$manifest" ] && [ "$root" != "$PWD" ]; then
    mkdir -p "$(dirname "$root")" && ln -s "$PWD" "$root" && echo "linked $root -> $PWD"
fi

status=0
step() {
    local limit=$1 label=$2
    shift 2
    echo "=== $label"
    local t0=$SECONDS
    timeout "$limit" "$@"
    local rc=$?
    echo "=== $label: exit $rc after $((SECONDS - t0)) s"
    [ $rc -eq 0 ] || status=1
}

step 120 "CUDA device tests" "$BIN/cuda_device" --nocapture --test-threads=1
step 240 "GPU fuzz corpus ($KILN_GPU_CASES programs per profile)" \
    "$BIN/differential" gpu_fuzz --nocapture --test-threads=1
# Every reduction that can be split runs split into 3 blocks per row group, so the fuzz
# programs' small reductions take the split path too.
KILN_CUDA_REDUCE_SPLITS=3 KILN_GPU_CASES=${KILN_GPU_SPLIT_CASES:-40} step 240 \
    "GPU fuzz corpus, reductions split in 3" "$BIN/differential" gpu_fuzz --nocapture --test-threads=1
# The golden-file test reads tests/golden through the build machine's path; the rest compile
# with this machine's NVRTC.
step 60 "CUDA codegen and NVRTC tests" "$BIN/cuda_render" --nocapture --skip golden
step 150 "GPU benchmark" "$BIN/gpu_bench"
step "${KILN_GPU_GPT_LIMIT:-240}" "char_gpt on the GPU (default configuration)" \
    "$BIN/char_gpt" --device cuda ${KILN_GPU_GPT_ARGS:-}
if [ "${KILN_GPU_CRITERION:-0}" = 1 ]; then
    step 150 "criterion CUDA groups" "$BIN/fusion" --bench cuda_ --warm-up-time 1 \
        --measurement-time 3 --sample-size 10 --noplot
fi
echo "gpu-check: $([ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
