#!/usr/bin/env bash
# Build llama-cpp-python from source for this machine's CPU, once, and install it into the venv.
#
# llama-cpp-python ships only a source archive. A "native" build (-march=native) lets the compiler
# enable every instruction CPUID reports, including AMX tiles that some kernels refuse (SIGILL at
# the first matrix product), so the instruction sets are chosen here from /proc/cpuinfo instead:
# the kernel lists only what it lets processes use. AMX stays off (see docs/benchmarks.md).
# The wheel is kept under $VOICE_AGENT_CACHE/wheels/, keyed by version and flags, so a second setup
# on the same machine installs it in seconds, and a different CPU gets its own build.
#   scripts/build-llama-cpp.sh [PYTHON]      PYTHON defaults to .venv/bin/python
# VOICE_AGENT_CPU_FLAGS="avx avx2 fma f16c" builds for those flags instead of this CPU's: a portable
# x86-64-v3 build for an image that runs on other machines (docker/Dockerfile), or an AVX2-only
# build on an AVX-512 machine, to measure what such a CPU would get.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${1:-.venv/bin/python}
version=0.3.36
cache=${VOICE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/voice-agent}  # as models/packs/cache.py finds it

args=(-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
      -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=ON)
arch=$(uname -m)
if [ "$arch" = "x86_64" ]; then
  flags=" ${VOICE_AGENT_CPU_FLAGS:-$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2)} "
  has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
  has avx && args+=(-DGGML_AVX=ON)
  has avx2 && args+=(-DGGML_AVX2=ON)
  has fma && args+=(-DGGML_FMA=ON)
  has f16c && args+=(-DGGML_F16C=ON)
  has avx_vnni && args+=(-DGGML_AVX_VNNI=ON)
  if has avx512f avx512cd avx512vl avx512dq avx512bw; then
    args+=(-DGGML_AVX512=ON)
    has avx512vbmi && args+=(-DGGML_AVX512_VBMI=ON)
    has avx512_vnni && args+=(-DGGML_AVX512_VNNI=ON)
    has avx512_bf16 && args+=(-DGGML_AVX512_BF16=ON)
  fi
else
  # Elsewhere (arm64: NEON, dotprod, i8mm) the compiler's native detection is safe.
  args[0]=-DGGML_NATIVE=ON
fi
cmake_args="${args[*]}"
tag=$(printf '%s %s %s' "$version" "$arch" "$cmake_args" | sha256sum | cut -c1-12)
wheels="$cache/wheels/llama-cpp-python-$version-$tag"

installed=$("$python" -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))" 2>/dev/null || true)
stamp="$("$python" -c 'import sys; print(sys.prefix)')/.llama-cpp-build-tag"
if [ "$installed" = "$version" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$tag" ]; then
  exit 0
fi

if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "==> building llama-cpp-python $version from source (about 5-8 minutes on 2 cores)"
  echo "    CMAKE_ARGS=$cmake_args"
  mkdir -p "$wheels.tmp"
  log="$wheels.log"
  start=$(date +%s)
  if ! CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      "$python" -m pip wheel --no-cache-dir --no-deps --no-binary llama-cpp-python -w "$wheels.tmp" \
      "llama-cpp-python==$version" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "error: building llama-cpp-python failed; the whole log is $log" >&2
    exit 1
  fi
  rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
  echo "    built in $(( $(date +%s) - start )) s; wheel kept in $wheels"
fi
echo "==> installing llama-cpp-python $version ($wheels)"
"$python" -m pip install -q --no-deps --force-reinstall "$wheels"/llama_cpp_python-*.whl
# llama-cpp-python's own Python dependencies (the wheel was installed without them).
"$python" -m pip install -q "typing-extensions>=4.5" "numpy>=1.20" "diskcache>=5.6.1" "jinja2>=2.11.3"
# Smoke test in a child process: an instruction the CPU or kernel refuses kills it with SIGILL.
if ! "$python" -c "import llama_cpp; llama_cpp.llama_backend_init(); print(llama_cpp.llama_print_system_info().decode())" \
    >"$wheels.sysinfo" 2>&1; then
  cat "$wheels.sysinfo"
  echo "error: the llama.cpp build does not run on this CPU; remove $wheels and report CMAKE_ARGS=$cmake_args" >&2
  exit 1
fi
# pip keys its own wheel cache by the source archive, not by CMAKE_ARGS (hence --no-cache-dir
# above): check that what runs is what was asked for.
if [[ "$cmake_args" != *"-DGGML_AVX512=ON"* ]] && grep -q "AVX512 = 1" "$wheels.sysinfo"; then
  echo "error: the installed llama.cpp uses AVX-512, which was not asked for; remove $wheels and run again" >&2
  exit 1
fi
echo "$tag" >"$stamp"
echo "    llama.cpp: $(head -c 300 "$wheels.sysinfo")"
