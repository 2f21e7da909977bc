#!/usr/bin/env bash
# The main job on a fresh machine: installs what is missing, builds flint, fetches the model and
# completes a prompt. Arguments, if any, replace the default `flint run` arguments.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
[[ -d "$HOME/.cargo/bin" ]] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -p flint-cli
if (($# == 0)); then
  set -- -m gemma-3-270m -n 32 "The capital of France is"
fi
exec "${CARGO_TARGET_DIR:-target}/release/flint" run "$@"
