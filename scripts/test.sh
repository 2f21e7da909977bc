#!/usr/bin/env bash
# The test command: installs what is missing, builds the CLI and the test binaries, fetches the
# test models, builds the browser engine (wasm32), the npm package and the chat page, runs every
# test of the workspace, then the browser tests in headless Chromium.
# Models are cached in $FLINT_HOME (default ~/.cache/flint/models); FLINT_REQUIRE_GPU=1 turns a
# missing GPU adapter into a test failure instead of a skip.
set -euo pipefail
cd "$(dirname "$0")/.."

TEST_MODELS=(gemma-3-270m qwen2.5-coder-0.5b)
target_dir=${CARGO_TARGET_DIR:-target}
timings=()
now() { echo "${EPOCHREALTIME:-$(date +%s)}"; }
t_start=$(now)

# Runs one named stage and prints how long it took.
stage() {
  local name=$1 t0
  t0=$(now)
  shift
  echo "==> $name: $*" >&2
  "$@"
  local secs
  secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  echo "==> $name: done in $secs s" >&2
  timings+=("$(printf '%-8s %7s s' "$name" "$secs")")
}

# The stage times so far, also when a stage fails.
print_timings() {
  local status=$?
  echo "==> timings$( ((status)) && echo " (stopped by a failure, exit status $status)")" >&2
  ((${#timings[@]})) && printf '    %s\n' "${timings[@]}" >&2
  awk -v a="$t_start" -v b="$(now)" 'BEGIN { printf "    total    %7.1f s\n", b - a }' >&2
}
trap print_timings EXIT

pull_models() {
  local model
  for model in "${TEST_MODELS[@]}"; do
    "$target_dir/release/flint" pull "$model"
  done
}

# cargo test with its output shown as it runs, then one line summing its "test result:" lines.
run_tests() {
  local log="$target_dir/test-output.log" status=0
  mkdir -p "$target_dir"
  cargo test --release --workspace --no-fail-fast 2>&1 | tee "$log" || status=$?
  awk '/^test result:/ { for (i = 1; i < NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) g += $i } }
       END { printf "==> all test binaries: %d passed, %d failed, %d ignored (output in %s)\n", p, f, g, FILENAME }' "$log" >&2
  return "$status"
}

# Formatting and lints: the whole workspace, tests and examples included, warnings as errors.
lint() {
  cargo fmt --all --check
  cargo clippy --release --workspace --all-targets -- -D warnings
}

# The desktops this machine cannot run (the design promises Metal and DX12): the native crates
# and the CLI type-check for macOS on Apple silicon and for Windows.
CROSS_TARGETS=(aarch64-apple-darwin x86_64-pc-windows-msvc)
cross_check() {
  local t
  if command -v rustup >/dev/null; then
    for t in "${CROSS_TARGETS[@]}"; do
      rustup target list --installed | grep -qx "$t" || rustup target add "$t"
    done
  fi
  for t in "${CROSS_TARGETS[@]}"; do
    cargo check --release -p flint-cli --target "$t"
  done
}

# The browser tests (tests/web): headless Chromium, WebGPU on SwiftShader, the packed npm
# package and the chat page against `flint web`.
run_browser_tests() {
  (cd tests/web && { [[ -d node_modules/playwright-core && -d node_modules/openai && -d node_modules/ajv ]] || npm ci --no-audit --no-fund; })
  # One file at a time: each drives its own Chromium on the same two cores.
  local f
  for f in tests/web/*.test.mjs; do
    node --test "$f"
  done
}

stage setup bash scripts/setup.sh
# Mesa wants a private runtime directory; without one it prints a harmless error per device.
if [[ -z "${XDG_RUNTIME_DIR:-}" || ! -d "${XDG_RUNTIME_DIR:-}" ]]; then
  export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/flint-xdg-$(id -u)"
  mkdir -p -m 0700 "$XDG_RUNTIME_DIR"
fi
[[ -d "$HOME/.cargo/bin" ]] && export PATH="$HOME/.cargo/bin:$PATH"
# The CLI and every test binary in one build: the tests' dev-dependencies change the features
# of shared crates, so building the CLI alone first compiled flint-core, flint-gpu, flint, naga
# and wgpu twice (142 s more on 2 cores). `flint` comes out of this build too (its tests run it).
stage build cargo test --release --workspace --no-run
stage lint lint
stage models pull_models
# The engine for the browser (flint-wasm, which builds flint-core, flint-gpu and flint for
# wasm32), the npm package and the chat page's site.
stage web-build bash scripts/build-web.sh
stage cross cross_check
stage test run_tests
stage browser run_browser_tests

