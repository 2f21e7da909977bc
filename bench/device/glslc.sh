#!/usr/bin/env bash
# Builds a glslc that compiles cooperative-matrix and integer-dot shaders, for the llama.cpp peer
# with matrix cores (bench/device/pack.sh; issue 35 reports it beside the peer without them).
# Debian 12's glslc (shaderc 2023.2, glslang 12) lacks GL_KHR_cooperative_matrix,
# GL_NV_cooperative_matrix2 and GL_EXT_integer_dot_product, and its Vulkan headers (1.3.239) lack
# the structures llama.cpp's matrix-core code uses. Debian 13's source packages have both:
# shaderc 2025.2 with glslang 15.1, SPIRV-Tools and SPIRV-Headers (built together, as shaderc's
# third_party), and the Vulkan headers that vulkan-loader's source carries.
# Prints "GLSLC INCLUDE_DIR" on its last line. About 4.5 minutes on 2 cores, once: the result is
# kept in $PEER_DIR (default ~/.cache/flint-peer).
set -euo pipefail
dir=${PEER_DIR:-$HOME/.cache/flint-peer}/glslc-trixie
if [[ -x $dir/bin/glslc && -f $dir/include/vulkan/vulkan.hpp ]]; then echo "$dir/bin/glslc $dir/include"; exit 0; fi
rm -rf "$dir" && mkdir -p "$dir"/{apt/lists/partial,src,bin}
cd "$dir"
# Debian 13's sources from the mirror this machine's apt already uses.
mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -1 || true)
[[ -n $mirror ]] || mirror=$(awk '$1 == "deb" && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
[[ -n $mirror ]] || { echo "glslc.sh: no Debian mirror in this machine's apt sources" >&2; exit 1; }
echo "deb-src $mirror trixie main" > apt/sources.list
o="-oAPT::Sandbox::User=root -oDir::Etc::SourceList=$dir/apt/sources.list -oDir::Etc::SourceParts=/dev/null -oDir::State::Lists=$dir/apt/lists"
apt-get $o update >/dev/null
# Only the upstream tarballs are used (Debian's packaging builds against system libraries).
(cd src && apt-get $o source --download-only shaderc glslang spirv-tools spirv-headers vulkan-loader >/dev/null 2>&1 || true)
unpack() { # PACKAGE DEST: the package's upstream tarball, its top directory stripped
  local tarball
  tarball=$(ls src/"$1"_*.orig.tar.* 2>/dev/null | head -1)
  [[ -n $tarball ]] || { echo "glslc.sh: no source tarball of $1 was fetched" >&2; exit 1; }
  mkdir -p "$2" && tar xf "$tarball" -C "$2" --strip-components=1
  echo "$(basename "$tarball")" >> versions.txt
}
unpack shaderc shaderc
unpack glslang shaderc/third_party/glslang
unpack spirv-tools shaderc/third_party/spirv-tools
unpack spirv-headers shaderc/third_party/spirv-headers
unpack vulkan-loader loader
cmake -S shaderc -B build -DCMAKE_BUILD_TYPE=Release -DSHADERC_SKIP_TESTS=ON -DSHADERC_SKIP_EXAMPLES=ON \
  -DSHADERC_SKIP_COPYRIGHT_CHECK=ON -DSPIRV_SKIP_TESTS=ON -DSPIRV_SKIP_EXECUTABLES=ON \
  -DENABLE_GLSLANG_BINARIES=OFF >/dev/null
cmake --build build -j"$(nproc)" --target glslc_exe >/dev/null
cp build/glslc/glslc bin/ && strip bin/glslc
cp -r loader/vulkan-headers/include include
rm -rf build shaderc loader src apt
echo "$dir/bin/glslc $dir/include"
