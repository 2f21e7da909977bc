#!/usr/bin/env bash
# One run on a lent GPU machine (the `device` tool), prepared by bench/device/pack.sh:
#   device run `bash bench/device/run.sh`, carry [".gl", ".dev/device"], timeout_s 480.
# Lists the adapters, runs Flint's GPU tests (kernels against the CPU reference; the model
# families against their golden logits; seeded sampling on a synthetic gemma), times single
# matmuls (matmul_speed), then benches
# Flint and llama.cpp (Vulkan) on the same synthetic models, one stream and several, and
# profiles Flint's kernels. Results land in $OUT (at most 8 files come back).
set -u
root=$PWD pack=$PWD/.dev/device out=${OUT:-/tmp/out}
mkdir -p "$out"
exec > >(tee "$out/run.log") 2>&1
log() { echo "=== $(date +%T) $*"; }
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
(cd "$pack" && tar xJf pack.tar.xz) || exit 1
# The test binaries find ../shared through the path they were built at (/work/main/crates/...).
mkdir -p /work && ln -sfn "$root" /work/main && ln -sfn "$pack/shared" /work/shared
export FLINT_REQUIRE_GPU=1 XDG_RUNTIME_DIR=/tmp/xdg FLINT_HOME=/tmp/models
mkdir -p -m 700 /tmp/xdg && mkdir -p "$FLINT_HOME"
export B=$pack/bin L=$pack/llama M=$FLINT_HOME

log devices
$B/flint devices > "$out/devices.txt" 2>&1
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if ! grep -qi nvidia "$out/devices.txt" && [[ -f $icd ]]; then
  export VK_DRIVER_FILES=$icd
  { $B/flint devices; VK_LOADER_DEBUG=error,warn $B/flint devices 2>&1 | head -20; } > "$out/devices.txt" 2>&1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv >> "$out/devices.txt" 2>&1
cat "$out/devices.txt"

# The synthetic models, gemma first (the seeded tests load it), while the tests run.
( for m in gemma-3-270m qwen2.5-coder-0.5b qwen2.5-7b-q4km; do
    python3 bench/synth_gguf.py fill "$pack/skel/$m.skel" "$M/$m.gguf.part" --seed 1 && mv "$M/$m.gguf.part" "$M/$m.gguf"
  done ) > /tmp/synth.log 2>&1 &
synth=$!

log tests
timeout 150 bash -c '
  for t in flint_gpu context shaders_validate $(cd $B && ls ops_*) families; do
    echo "--- $t"; timeout 60 $B/$t --test-threads 4 2>&1 | grep -E "^test .*FAILED|test result|panicked|left:|right:" | cut -c1-400
  done
  while [ ! -f $M/gemma-3-270m.gguf ]; do sleep 1; done
  echo "--- seeded (synthetic gemma; the golden tiny qwen3 drafts)"
  timeout 60 $B/seeded --test-threads 3 gpu_ 2>&1 | grep -E "^test |test result|panicked|left:|right:" | cut -c1-400
' > "$out/tests.txt" 2>&1
cat "$out/tests.txt"
wait $synth
cat /tmp/synth.log

fb() { log "flint bench $*"; timeout 90 $B/flint bench "$@" --format json >> "$out/flint.json" 2>> "$out/flint.txt"; echo >> "$out/flint.json"; }
lb() { log "llama-bench $*"; GGML_VK_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=$L timeout 60 $L/llama-bench "$@" -ngl 99 >> "$out/llama.txt" 2>&1; }
# One matmul per shape and step size (the models' feed-forward shapes; 9 tokens is the first
# step past the 8-token kernel).
log matmul_speed
for shape in "Q5_0 896 4864" "Q6_K 4864 896" "Q4_K 3584 18944" "Q6_K 18944 3584"; do
  for tokens in 1 8 9 16 256; do timeout 20 $B/matmul_speed $shape $tokens 20 2>&1 | grep -v "^note:" | tail -1; done
done > "$out/matmul.txt"
cat "$out/matmul.txt"

# Flint's prefill ran at about 0.25 TFLOP/s on the H200 (2026-12-04): the 7B runs short prompts
# so that each step ends inside its timeout.
for m in qwen2.5-coder-0.5b gemma-3-270m; do
  fb -m $M/$m.gguf -p 512 -n 128 --reps 3
  lb -m $M/$m.gguf -p 512 -n 128 -r 3
done
fb -m $M/qwen2.5-7b-q4km.gguf -p 64 -n 64 --reps 2
lb -m $M/qwen2.5-7b-q4km.gguf -p 64 -n 64 -r 2
fb -m $M/qwen2.5-coder-0.5b.gguf -p 128 -n 64 --reps 2 --concurrency 1,8,32
log "llama-batched-bench"
GGML_VK_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=$L timeout 40 $L/llama-batched-bench -m $M/qwen2.5-coder-0.5b.gguf -ngl 99 \
  -c 8192 -npp 128 -ntg 64 -npl 1,8,32 2>&1 | grep -E "^\|" >> "$out/llama.txt"
for m in "qwen2.5-coder-0.5b -p 256" "qwen2.5-7b-q4km -p 64"; do
  set -- $m
  log "flint profile $*"
  timeout 60 $B/flint bench -m $M/$1.gguf $2 $3 -n 16 --reps 1 --profile >> "$out/profile.txt" 2>&1
done
log end
