# Sourced by bench/device/run.sh and tune.sh on the lent GPU machine, with $root (the tree),
# $pack (.dev/device) and $out set: installs the Vulkan loader carried in .gl, unpacks
# bench/device/pack.sh's binaries, finds the NVIDIA driver (devices.txt), and starts writing the
# synthetic models into $M in the background ($synth: wait for it before a bench).
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
