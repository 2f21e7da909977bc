#!/usr/bin/env bash
# One run on a lent GPU machine (the `device` tool), prepared by bench/device/pack.sh:
#   device run `bash bench/device/run.sh`, carry [".gl", ".dev/device"], timeout_s 360.
# Lists the adapters, runs Flint's GPU tests (kernels against the CPU reference; the model
# families against their golden logits; seeded sampling on a synthetic gemma), times single
# matmuls (matmul_speed), then benches Flint and llama.cpp (Vulkan) on the same synthetic
# models, one stream and several, profiles Flint's kernels and, while time is left, benches
# llama.cpp with matrix cores, within 5 minutes. Results land in $OUT, 8 files: run.log,
# devices.txt, tests.txt, matmul.txt, flint.jsonl, llama.jsonl, profile.txt and results.json
# (copy it to bench/results/<date>-h200.json).
set -u
root=$PWD pack=$PWD/.dev/device out=${OUT:-/tmp/out}
mkdir -p "$out"
exec > >(tee "$out/run.log") 2>&1
source bench/device/setup.sh

log tests
timeout 100 bash -c '
  for t in flint_gpu context shaders_validate $(cd $B && ls ops_*) families; do
    echo "--- $t"; timeout 40 $B/$t --test-threads 8 2>&1 | grep -E "^test .*FAILED|test result|panicked|left:|right:" | cut -c1-400
  done
  while [ ! -f $M/gemma-3-270m.gguf ]; do sleep 1; done
  echo "--- seeded (synthetic gemma; the golden tiny qwen3 drafts)"
  timeout 60 $B/seeded --test-threads 3 gpu_ 2>&1 | grep -E "^test |test result|panicked|left:|right:" | cut -c1-400
' > "$out/tests.txt" 2>&1
cat "$out/tests.txt"
wait $synth
cat /tmp/synth.log

# Each bench appends a tagged record (bench/device/results.py); results.json is assembled from
# whatever finished. The run must end within 5 minutes: the required rows first, the reported
# ones only while time is left.
R="python3 $root/bench/device/results.py"
left() { (( SECONDS < $1 )); }
fb() { # TAG TIMEOUT ARGS...: flint bench
  local tag=$1 t=$2; shift 2
  log "flint bench $* ($tag)"
  timeout "$t" $B/flint bench "$@" --format json > /tmp/fb.json 2>> /tmp/flint.err && $R tag "$tag" "flint bench $*" < /tmp/fb.json >> "$out/flint.jsonl"
  tail -3 /tmp/flint.err
}
lb() { # TAG TIMEOUT ARGS...: llama-bench (with MATRIX=1 the matrix-core build's Vulkan backend)
  local tag=$1 t=$2 libs=$L err=/tmp/llama.err build=; shift 2
  [[ -n ${MATRIX:-} ]] && libs=$pack/llama-matrix:$L err=/tmp/llama-matrix.err build=" (matrix-core build)"
  log "llama-bench $* ($tag)$build"
  GGML_VK_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=$libs timeout "$t" $L/llama-bench "$@" -ngl 99 -o jsonl 2>> $err |
    $R tag "$tag" "llama-bench $* -ngl 99$build" >> "$out/llama.jsonl"
}
# One matmul per shape and step size (qwen 0.5b's Q/K/V and the models' feed-forward shapes;
# 9 tokens is the first step past the 8-token kernel; past 16 the tiled GEMM where its grid
# spreads and, `exact`, the exact mode's 16-token tiles: where they cross sets
# GEMM_MIN_GROUPS; the norm folded into a fused gate/up at one token).
log matmul_speed
{
  for shape in "Q8_0 896 1152" "Q5_0 896 4864" "Q6_K 4864 896" "Q4_K 3584 18944" "Q6_K 18944 3584"; do
    timeout 20 $B/matmul_speed $shape 1,8,9,16,32,64,256,512 20 2>&1 | grep -v "^note:"
    timeout 15 $B/matmul_speed $shape 32,64,256,512 20 exact 2>&1 | grep -v "^note:"
  done
  for f in glu glu+norm; do timeout 10 $B/matmul_speed Q5_0 896 4864 1 50 $f 2>&1 | tail -1; done
  # The GEMM in f16 and on 8-bit integers (FLINT_TUNE gemm_in), beside the f32 lines above.
  for t in gemm_in=f16 gemm_in=q8; do
    for shape in "Q5_0 896 4864" "Q4_K 3584 18944" "Q6_K 18944 3584"; do
      FLINT_TUNE=$t timeout 15 $B/matmul_speed $shape 64,256,512 20 2>&1 | grep -v "^note:" | sed "s/^/$t: /"
    done
    FLINT_TUNE=$t timeout 10 $B/matmul_speed Q5_0 896 4864 512 20 glu+norm 2>&1 | tail -1 | sed "s/^/$t: /"
  done
  # The mat-vec kernels on 8-bit activations (FLINT_TUNE q8_act=on), beside the f32 lines above.
  for shape in "Q5_0 896 4864" "Q6_K 4864 896" "Q4_K 3584 18944" "Q6_K 18944 3584"; do
    FLINT_TUNE=q8_act=on timeout 15 $B/matmul_speed $shape 1,8,16 20 2>&1 | grep -v "^note:" | sed "s/^/q8_act=on: /"
  done
  FLINT_TUNE=q8_act=on timeout 10 $B/matmul_speed Q5_0 896 4864 1 50 glu+norm 2>&1 | tail -1 | sed "s/^/q8_act=on: /"
} > "$out/matmul.txt"
cat "$out/matmul.txt"

pp_tg() { # TAG TIMEOUT ARGS...: flint bench's pp512 (tag TAG) and tg128 (tag TAG-tg). llama-bench
  # times tg128 from an empty context, so Flint's starts from a one-token prompt, not after
  # the 512-token one (whose attention spans 512 to 640 positions).
  local tag=$1 t=$2; shift 2
  fb "$tag" "$t" "$@" -p 512 -n 16
  fb "$tag-tg" "$t" "$@" -p 1 -n 128
}
# Required rows (llama-bench's defaults, -r 3), then the reported ones.
for m in gemma-3-270m qwen2.5-coder-0.5b qwen2.5-7b-q4km; do
  pp_tg $m 60 -m $M/$m.gguf --reps 3
  lb $m 60 -m $M/$m.gguf -p 512 -n 128 -r 3
done
q=$M/qwen2.5-coder-0.5b.gguf
fb concurrency 60 -m $q -p 128 -n 128 --reps 2 --concurrency 8,32
log "llama-batched-bench -npp 128 -ntg 128 -npl 8,32"
GGML_VK_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=$L timeout 40 $L/llama-batched-bench -m $q -ngl 99 -c 8192 -npp 128 -ntg 128 -npl 8,32 2>> /tmp/llama.err |
  $R batched batched "llama-batched-bench -m MODEL -ngl 99 -c 8192 -npp 128 -ntg 128 -npl 8,32" >> "$out/llama.jsonl"
left 200 && fb pp4096 40 -m $q -p 4096 -n 1 --reps 1
left 200 && lb pp4096 30 -m $q -p 4096 -n 0 -r 1
left 220 && fb d8192 45 -m $q -d 8192 -p 1 -n 128 --reps 1
left 220 && lb d8192 30 -m $q -p 0 -n 128 -d 8192 -r 1
left 250 && pp_tg exact 20 -m $q --reps 2 --exact
left 260 && FLINT_NO_SUBGROUPS=1 pp_tg no-subgroups 20 -m $q --reps 2
# n-gram speculation on a code-editing prompt (a verify step costs about a decode step here).
left 265 && fb ngram 25 -m $q --spec-type ngram -f $root/bench/prompts/edit-code.txt -n 128 --reps 2
if left 270; then
  log "flint profile"
  timeout 25 $B/flint bench -m $q -p 256 -n 16 --reps 1 --profile > "$out/profile.txt" 2>&1
fi
# llama.cpp with matrix cores (bench/device/glslc.sh), where pack.sh could build it: reported, not gated.
if [[ -d $pack/llama-matrix ]]; then
  for m in qwen2.5-coder-0.5b qwen2.5-7b-q4km gemma-3-270m; do
    left 285 && MATRIX=1 lb $m-matrix 30 -m $M/$m.gguf -p 512 -n 128 -r 3
  done
fi
# Each peer build's device line (its matrix cores and integer dot products) for results.json.
for e in llama llama-matrix; do
  [[ -f /tmp/$e.err ]] && echo "$e: $(grep -m1 "ggml_vulkan: 0 =" /tmp/$e.err)" >> "$out/devices.txt"
done
log results
$R assemble "$out" "$(cat "$pack/commit" 2>/dev/null || echo unknown)"
cat /tmp/llama.err | grep -iE "error|fail" | head -5
log end
