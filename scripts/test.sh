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
# Seconds since $1 (a `now`), one decimal.
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
t_start=$(now)

# Runs one named stage and prints how long it took.
stage() {
  local name=$1 t0
  t0=$(now)
  shift
  echo "==> $name: $*" >&2
  "$@"
  local secs
  secs=$(since "$t0")
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

# The test binaries, and then the browser test files, run two at a time. lavapipe compiles
# each kernel at its first dispatch, on its queue's one thread, so on a cold Mesa cache one test
# binary keeps about one core busy (families.rs alone: 390 s of CPU in 371 s), and a browser
# file about as much (SwiftShader; the browser stage ran at 1.0-1.3 of 2 cores busy): a second
# one fills the other core. FLINT_TEST_JOBS=1 runs one at a time.
JOBS=${FLINT_TEST_JOBS:-2}
# The heaviest test binaries start first, so the long ones overlap.
TESTS_FIRST=(gpu_golden families kv_types cli split seeded ops_matmul tools golden_models overlap)
# Binaries that time what they watch (a server's load, a stalled client, a lost device, a
# terminal session) run after the others, one at a time.
TESTS_ALONE=(serve chat device_lost)

# Runs `$1 ITEM` for each further argument, at most $JOBS at once, in order; fails if any
# failed, once all have run.
pool() {
  local fn=$1 running=0 status=0 item
  shift
  for item in "$@"; do
    if ((running >= JOBS)); then
      wait -n || status=1
      running=$((running - 1))
    fi
    "$fn" "$item" &
    running=$((running + 1))
  done
  while ((running > 0)); do
    wait -n || status=1
    running=$((running - 1))
  done
  return "$status"
}

# run_logged NAME DIR COMMAND...: runs COMMAND in DIR with its output in $logs/NAME.log, then
# prints that log whole (one log at a time, as runs end) and the run's time.
run_logged() {
  local name=$1 cwd=$2 t0 rc=0 secs
  shift 2
  t0=$(now)
  (cd "$cwd" && "$@") > "$logs/$name.log" 2>&1 || rc=$?
  secs=$(since "$t0")
  {
    flock 9
    echo "     Running $name: $*"
    cat "$logs/$name.log"
    echo "==> $name: exit status $rc in $secs s" >&2
  } 9> "$logs/.print"
  return "$rc"
}

# One test binary ("name <TAB> executable <TAB> package directory"), as cargo test runs it:
# from its package's directory.
run_test_binary() {
  local name exe pkg
  IFS=$'\t' read -r name exe pkg <<< "$1"
  CARGO_MANIFEST_DIR="$pkg" run_logged "$name" "$pkg" "$exe"
}

# Every test binary of the workspace (built by the build stage), the heaviest first and the
# timed ones last, then the doc tests, and one line summing the "test result:" lines.
run_tests() {
  local log="$target_dir/test-output.log" status=0 line name
  logs="$target_dir/test-logs"
  rm -rf "$logs"
  mkdir -p "$logs"
  # name -> "name <TAB> executable <TAB> package directory", and the names in cargo's order.
  local -A binary=()
  local -a names=() queue=()
  while IFS= read -r line; do
    name=${line%%$'\t'*}
    binary[$name]=$line
    names+=("$name")
  done < <(cargo test --release --workspace --no-run --message-format=json | python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        t = m["target"]
        name = t["name"] if "test" in t["kind"] else t["name"] + "-unit-" + t["kind"][0]
        print(name, m["executable"], os.path.dirname(m["manifest_path"]), sep="\t")
')
  ((${#names[@]})) || { echo "==> no test binaries found" >&2; return 1; }
  for name in "${TESTS_FIRST[@]}"; do
    if [[ -v binary[$name] ]]; then queue+=("${binary[$name]}"); fi
  done
  for name in "${names[@]}"; do
    [[ " ${TESTS_FIRST[*]} ${TESTS_ALONE[*]} " == *" $name "* ]] || queue+=("${binary[$name]}")
  done
  pool run_test_binary "${queue[@]}" || status=1
  for name in "${TESTS_ALONE[@]}"; do
    if [[ -v binary[$name] ]]; then run_test_binary "${binary[$name]}" || status=1; fi
  done
  run_logged doc-tests "$PWD" cargo test --release --workspace --doc || status=1
  cat "$logs"/*.log > "$log"
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
  # Each file drives its own Chromium (and flint web or flint serve on a port of its own); the
  # longest, package.test.mjs, starts first.
  logs="$target_dir/browser-logs"
  rm -rf "$logs"
  mkdir -p "$logs"
  local -a files=(tests/web/package.test.mjs)
  local f
  for f in tests/web/*.test.mjs; do
    [[ $f == tests/web/package.test.mjs ]] || files+=("$f")
  done
  pool run_browser_file "${files[@]}"
}

run_browser_file() {
  run_logged "$(basename "$1" .test.mjs)" "$PWD" node --test "$1"
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

