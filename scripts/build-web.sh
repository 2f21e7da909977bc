#!/usr/bin/env bash
# Builds the browser side: the engine for wasm32, its JS bindings (wasm-bindgen), wasm-opt,
# the npm package `flint-llm` (npm pack) and the chat page's site. Installs wasm-bindgen-cli
# (at the wasm-bindgen version in Cargo.lock) and binaryen (npm) when missing.
#
# Outputs, under $CARGO_TARGET_DIR (default target)/web:
#   flint-llm-<version>.tgz   the npm package
#   site/                     the chat page + pkg/ (the package's files): `flint web` serves it
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d "$HOME/.cargo/bin" ]] && export PATH="$HOME/.cargo/bin:$PATH"

target_dir=${CARGO_TARGET_DIR:-target}
out="$(realpath -m "$target_dir/web")"
wasm_out=web/src/wasm
log() { echo "[build-web] $*" >&2; }

# wasm-bindgen-cli must match the crate exactly, or the generated glue does not fit.
want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
have=$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }' || true)
if [[ "$have" != "$want" ]]; then
  log "installing wasm-bindgen-cli $want (found: ${have:-none})"
  # Not --locked: its lock file names a crate version the registry mirror may lack.
  cargo install wasm-bindgen-cli --version "$want"
fi
# binaryen from npm: Debian's wasm-opt is too old and breaks externref tables.
if [[ ! -x web/node_modules/.bin/wasm-opt ]]; then
  log "installing binaryen (npm)"
  (cd web && npm ci --no-audit --no-fund)
fi

cargo build --release -p flint-wasm --target wasm32-unknown-unknown
rm -rf "$wasm_out"
wasm-bindgen --target web --no-typescript --out-dir "$wasm_out" \
  "$target_dir/wasm32-unknown-unknown/release/flint_wasm.wasm"
raw=$(stat -c %s "$wasm_out/flint_wasm_bg.wasm")
web/node_modules/.bin/wasm-opt -O3 --enable-bulk-memory --enable-reference-types --enable-nontrapping-float-to-int \
  --enable-sign-ext --enable-mutable-globals --enable-multivalue \
  "$wasm_out/flint_wasm_bg.wasm" -o "$wasm_out/flint_wasm_bg.opt.wasm"
mv "$wasm_out/flint_wasm_bg.opt.wasm" "$wasm_out/flint_wasm_bg.wasm"
opt=$(stat -c %s "$wasm_out/flint_wasm_bg.wasm")
gz=$(gzip -9 -c "$wasm_out/flint_wasm_bg.wasm" | wc -c)
log "flint_wasm_bg.wasm: $raw bytes from rustc, $opt after wasm-opt, $gz gzipped"

mkdir -p "$out"
rm -f "$out"/flint-llm-*.tgz
(cd web && npm pack --silent --pack-destination "$out" >/dev/null)
log "package: $(ls "$out"/flint-llm-*.tgz)"

# The site: the chat page plus the package's files under pkg/.
rm -rf "$out/site"
mkdir -p "$out/site/pkg"
cp web/app/* "$out/site/" 2>/dev/null || log "web/app is empty: the site has only pkg/"
tar -xzf "$out"/flint-llm-*.tgz -C "$out/site/pkg" --strip-components=2 package/src
log "site: $out/site"
