#!/usr/bin/env bash
# Sweeps the GPU kernels' shape knobs (FLINT_TUNE, crates/flint-gpu/src/tune.rs) on a lent GPU
# in one call of at most 5 minutes, from bench/device/pack.sh's pack, as run.sh runs:
#   device run `bash bench/device/tune.sh`, carry [".gl", ".dev/device"], timeout_s 360.
# Each matmul setting: matmul_speed over the models' shapes (1, 8, 9 and 16 tokens, a 512-token
# prompt; settings started in the first 2 minutes), then flint bench of qwen2.5-coder-0.5b (512-token prefill, decode) and of the 7B's
# shapes; each attention setting: qwen2.5-coder-0.5b at a 4096-token prompt and decoding at
# 8192 of context. The first setting is the defaults; every row is read against it.
# Results in $OUT: tune.log, matmul.txt, tune.jsonl (flint bench's reports, tagged with the
# setting) and tune.txt (the table; bench/device/results.py sweep).
# Locally, on any adapter and smaller (the local models, the qwen 0.5b rows only):
#   B=target/release M=~/.cache/flint/models SMALL=1 bash bench/device/tune.sh
# (on a CPU-type adapter add FLINT_TEST_GPU_KERNELS=1: the knobs shape the GPU kernels only).
set -u
root=$PWD pack=$PWD/.dev/device out=${OUT:-/tmp/out}
mkdir -p "$out"
exec > >(tee "$out/tune.log") 2>&1
if [[ -z ${B:-} ]]; then
  source bench/device/setup.sh
else
  log() { echo "=== $(date +%T) $*"; }
  synth=
fi
ms=$B/matmul_speed
[[ -x $ms ]] || ms=$B/examples/matmul_speed
R="python3 $root/bench/device/results.py"
left() { (( SECONDS < $1 )); }
small=${SMALL:-}
# Matmul settings: the prompt's step budget (a setting that starts with -- is flint bench flags,
# not FLINT_TUNE: llama-bench's -ub is 512), how wide a grid is wide enough, the workgroup, the
# lanes per row, the largest mat-vec token block (9-16 token steps in two 8-token tiles), the GEMM
# in f16 or 8-bit integers, its tall 128 x 64 tile, the mat-vec on 8-bit activations, the GEMM's
# tiles and where it starts; and wgpu's runtime checks in every kernel (bounds_checks=off drops
# its index clamps; loop_bounding=on puts back its loop counters, on GPUs the default until
# 2026-12-07).
# Attention settings: the decode splits and the query tiles.
# The likeliest to matter first: the later ones are benched only while time is left.
matmul_tunes=("" bounds_checks=off "--max-batch-tokens 512" gemm_rows=8 loop_bounding=on gemm_in=f16 gemm_in=q8 q8_act=on gemm_rows=8,gemm_in=f16 max_block=8 gemm_min_groups=off gemm_side=8 lanes=32 max_wg=128 min_groups=1024 min_groups=128 max_wg=64 lanes=16 gemm_min_groups=16)
attn_tunes=("" split_min=64 split_min=1024 split_groups=256 split_groups=4096 tiles_from=64 tiles_from=off)
shapes=("Q5_0 896 1152" "Q5_0 896 4864" "Q6_K 4864 896" "Q4_K 3584 18944" "Q6_K 18944 3584")
steps=1,8,9,16,512 reps=20
if [[ -n $small ]]; then
  matmul_tunes=("" bounds_checks=off "--max-batch-tokens 16" gemm_rows=8 q8_act=on gemm_in=q8 gemm_min_groups=off) attn_tunes=("" tiles_from=off) shapes=("Q5_0 896 1152") steps=1,9,64 reps=2
fi
label() { echo "${1:-default}"; }

log matmul_speed
for t in "${matmul_tunes[@]}"; do
  left 120 || break
  [[ $t == --* ]] && continue
  for shape in "${shapes[@]}"; do
    FLINT_TUNE=$t timeout 20 $ms $shape $steps $reps 2>&1 | grep -v "^note:" | sed "s/^/$(label "$t"): /"
  done
done > "$out/matmul.txt"
cat "$out/matmul.txt"
[[ -n $synth ]] && wait $synth

fb() { # SETTING TIMEOUT ARGS...: flint bench with FLINT_TUNE=SETTING (or SETTING's flags where it
  # starts with --), its report tagged
  local t=$1 limit=$2 tune=$1 flags=(); shift 2
  [[ $t == --* ]] && { tune=; read -ra flags <<< "$t"; }
  set -- "$@" "${flags[@]}"
  log "FLINT_TUNE=$tune flint bench $*"
  FLINT_TUNE=$tune timeout "$limit" $B/flint bench "$@" --format json > /tmp/tune.json 2>> /tmp/tune.err &&
    $R tag "$(label "$t")" "flint bench $*" < /tmp/tune.json >> "$out/tune.jsonl"
  tail -2 /tmp/tune.err
}
q=$M/qwen2.5-coder-0.5b.gguf big=$M/qwen2.5-7b-q4km.gguf
# Each setting's benches, "BY TIMEOUT ARGS...": run while the run is younger than BY seconds.
matmul_benches=("200 30 -m $q -p 512 -n 64 --reps 2" "220 40 -m $big -p 512 -n 32 --reps 1")
attn_benches=("265 20 -m $q -p 1 -n 128 --reps 2" "275 30 -m $q -p 4096 -n 1 --reps 1" "285 30 -m $q -d 8192 -p 1 -n 64 --reps 1")
if [[ -n $small ]]; then
  matmul_benches=("900 300 -m $q -p 32 -n 8 --reps 1") attn_benches=("900 300 -m $q -p 48 -n 4 --reps 1")
fi
sweep() { # SETTINGS BENCHES (array names): every bench of every setting, while time is left
  local -n settings=$1 benches=$2
  local t b
  for t in "${settings[@]}"; do
    for b in "${benches[@]}"; do
      set -- $b
      left "$1" || return 0
      local limit=$2
      shift 2
      fb "$t" "$limit" "$@"
    done
  done
}
sweep matmul_tunes matmul_benches
sweep attn_tunes attn_benches
$R sweep "$out" | tee "$out/tune.txt"
log end
