#!/usr/bin/env bash
# Prepares one device run (bench/device/run.sh) on a machine with an NVIDIA GPU and Vulkan but
# no Rust, no network and no models: builds Flint's CLI, its GPU test binaries and the
# matmul_speed example, llama.cpp's
# Vulkan peer (portable: no -march=native, the device's CPU differs), the synthetic models'
# headers (bench/synth_gguf.py) and the golden files the tests read, into .dev/device/
# (git-ignored; under the 64 MiB a run may carry), and the Vulkan loader's packages into .gl/.
# Then: device run `bash bench/device/run.sh`, carrying .gl and .dev/device.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.dev/device target=${CARGO_TARGET_DIR:-target}
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo /.dev/ >> .git/info/exclude
grep -qx '/.gl/' .git/info/exclude || echo /.gl/ >> .git/info/exclude
if [[ -n $(git status --porcelain) ]]; then
  echo "pack.sh: the tree has uncommitted changes; commit them, so that results.json names what ran" >&2
  exit 1
fi
rm -rf "$out" && mkdir -p "$out"/stage/{bin,llama,skel} "$out"/shared/golden/families .gl
git rev-parse HEAD > "$out/commit"

cargo build --release -p flint-cli
cp "$target/release/flint" "$out/stage/bin/"
cargo test --release -p flint-gpu -p flint --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, re, shutil, sys
keep = re.compile(r"^(flint_gpu|context|shaders_validate|ops_\w+|families|seeded)$")
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and keep.match(m["target"]["name"]):
        shutil.copy(m["executable"], sys.argv[1] + "/" + m["target"]["name"])
' "$out/stage/bin"
cargo build --release -p flint-gpu --features testing --example matmul_speed
cp "$target/release/examples/matmul_speed" "$out/stage/bin/"
strip "$out"/stage/bin/*

# llama.cpp: the shared tool fetches, patches and builds it; a second, portable build for the device.
llama_bin=$(bash ../shared/tools/build-llama-cpp.sh | tail -1)
src=$(dirname "$(dirname "$llama_bin")")
# The portable build's options; the matrix-core build below takes the same, so that its Vulkan
# backend loads beside this build's other libraries.
portable=(-DGGML_VULKAN=ON -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release)
cmake -S "$src" -B "$src/build-portable" "${portable[@]}" >/dev/null
cmake --build "$src/build-portable" -j"$(nproc)" --target llama-bench llama-batched-bench >/dev/null
cp -a "$src"/build-portable/bin/{*.so*,llama-bench,llama-batched-bench} "$out/stage/llama/"
strip "$out"/stage/llama/llama-* "$out"/stage/llama/*.so.* 2>/dev/null || true
# The same llama.cpp with matrix cores (reported beside the peer, not gated): the same source and
# options built with a glslc that compiles cooperative-matrix and integer-dot shaders and with
# newer Vulkan headers (bench/device/glslc.sh). Only its Vulkan backend differs, so only that
# library is packed; run.sh puts it first on the library path. PEER_MATRIX=0 skips it.
packed="bin llama skel"
matrix_peer() { # set -e does not reach into a function called as a condition: each step is chained
  local glslc vk_include
  read -r glslc vk_include < <(bash bench/device/glslc.sh | tail -1) && [[ -x $glslc ]] &&
    cmake -S "$src" -B "$src/build-matrix" "${portable[@]}" -DVulkan_GLSLC_EXECUTABLE="$glslc" \
      -DVulkan_INCLUDE_DIR="$vk_include" > /tmp/matrix-peer.log 2>&1 &&
    grep -q "GL_NV_cooperative_matrix2 supported" /tmp/matrix-peer.log &&
    cmake --build "$src/build-matrix" -j"$(nproc)" --target ggml-vulkan >> /tmp/matrix-peer.log 2>&1 &&
    mkdir -p "$out/stage/llama-matrix" && cp -a "$src"/build-matrix/bin/libggml-vulkan.so* "$out/stage/llama-matrix/" &&
    strip "$out"/stage/llama-matrix/*.so.*
}
if [[ ${PEER_MATRIX:-1} == 0 ]]; then
  :
elif matrix_peer; then
  packed+=" llama-matrix"
else
  echo "pack.sh: no matrix-core llama.cpp (/tmp/matrix-peer.log); the run reports the peer without it" >&2
fi

# Synthetic models: the real headers (the test models, and Qwen2.5-7B's shapes in Q4_K_M).
for m in gemma-3-270m qwen2.5-coder-0.5b; do "$target/release/flint" pull "$m" >/dev/null; done
models=${FLINT_HOME:-$HOME/.cache/flint/models}
python3 bench/synth_gguf.py skeleton "$models/gemma-3-270m.gguf" "$out/stage/skel/gemma-3-270m.skel"
python3 bench/synth_gguf.py skeleton "$models/qwen2.5-coder-0.5b.gguf" "$out/stage/skel/qwen2.5-coder-0.5b.skel"
python3 bench/synth_gguf.py skeleton "$models/qwen2.5-coder-0.5b.gguf" "$out/stage/skel/qwen2.5-7b-q4km.skel" --scale-to qwen2.5-7b

# The golden files the carried tests read (the families' models, references and prompts).
cp -r ../shared/golden/prompts "$out/shared/golden/"
cp ../shared/golden/families/*.json "$out/shared/golden/families/"
for d in ../shared/golden/families/*/; do
  mkdir -p "$out/shared/golden/families/$(basename "$d")"
  find "$d" -maxdepth 1 -type f -exec cp {} "$out/shared/golden/families/$(basename "$d")/" \;
done

tar cJf "$out/pack.tar.xz" -C "$out/stage" $packed && rm -rf "$out/stage"

# NVIDIA's Vulkan driver needs the loader and libglvnd, which the device image lacks.
o="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64"
mkdir -p /tmp/amd64/partial && apt-get $o update >/dev/null
(cd .gl && apt-get $o download libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2 >/dev/null 2>&1)
du -sh "$out" .gl
