#!/usr/bin/env bash
# Installs what building, running and testing Flint needs, where it is missing.
# Debian/Ubuntu (apt-get), as root or with sudo. Idempotent; a few seconds when all is there.
set -euo pipefail

WASM_TARGET=wasm32-unknown-unknown
apt_packages=()

log() { echo "[setup] $*" >&2; }

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else log "need root (or sudo) to run: $*"; exit 1
  fi
}

has_pip() {
  local cmd
  for cmd in "pip" "pip3" "python3 -m pip"; do
    $cmd --version >/dev/null 2>&1 && return 0
  done
  return 1
}

# Rust installed by rustup in an earlier run may not be on PATH yet.
[[ -d "$HOME/.cargo/bin" ]] && export PATH="$HOME/.cargo/bin:$PATH"

# --- system packages --------------------------------------------------------------------------
command -v cc >/dev/null || apt_packages+=(gcc libc6-dev)       # linker for cargo
has_pip || apt_packages+=(python3-pip)                          # `flint pull` fetches models with pip
command -v cargo >/dev/null || command -v curl >/dev/null || apt_packages+=(curl ca-certificates)
# `flint pull URL` speaks HTTPS through OpenSSL (the ureq crate's native-tls).
dpkg -s libssl-dev >/dev/null 2>&1 || apt_packages+=(libssl-dev)
command -v pkg-config >/dev/null || apt_packages+=(pkg-config)

# --- GPU and browser test dependencies ----------------------------------------------------------
# Mesa's lavapipe: a software Vulkan device, so the GPU tests run on machines without a GPU.
dpkg -s mesa-vulkan-drivers >/dev/null 2>&1 || apt_packages+=(mesa-vulkan-drivers)
dpkg -s libvulkan1 >/dev/null 2>&1 || apt_packages+=(libvulkan1)
# tmux drives `flint chat` under a pseudo-terminal in the Ctrl-C test.
command -v tmux >/dev/null || apt_packages+=(tmux)
# The browser tests: headless Chromium (WebGPU on its SwiftShader) driven by playwright-core
# from npm, under node.
[[ -x /usr/bin/chromium ]] || apt_packages+=(chromium)
command -v node >/dev/null || apt_packages+=(nodejs)
command -v npm >/dev/null || apt_packages+=(npm)
# --- end of GPU and browser test dependencies ----------------------------------------------------

if ((${#apt_packages[@]})); then
  if ! command -v apt-get >/dev/null; then
    log "missing: ${apt_packages[*]}; install them with your package manager"
    exit 1
  fi
  log "installing ${apt_packages[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null
fi

# --- Rust toolchain -----------------------------------------------------------------------------
if ! command -v cargo >/dev/null; then
  log "installing Rust with rustup"
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if command -v rustup >/dev/null; then
  # The lint stage of the tests: formatting and clippy.
  for component in rustfmt clippy; do
    if ! rustup component list --installed | grep -q "^$component"; then
      log "adding the Rust component $component"
      rustup component add "$component"
    fi
  done
  if ! rustup target list --installed | grep -qx "$WASM_TARGET"; then
    log "adding the Rust target $WASM_TARGET"
    rustup target add "$WASM_TARGET"
  fi
elif ! rustc --print sysroot >/dev/null 2>&1 || [[ ! -d "$(rustc --print sysroot)/lib/rustlib/$WASM_TARGET" ]]; then
  log "the Rust target $WASM_TARGET is missing and there is no rustup to add it"
  exit 1
fi
