#!/usr/bin/env bash
# Installs the Debian packages zinf builds and tests with.
#   scripts/deps.sh           install what is missing (apt-get; sudo when not root)
#   scripts/deps.sh --check   exit 0 when everything is installed, 1 otherwise, and
#                             name what is missing on stderr
# The list is everything a documented make target needs on a fresh Debian 12
# (make, make test, make demo, make fuzz, make crash-trials, make install):
# scripts/fresh-check.sh proves it in a minimal root, and CI runs that.
# CUDA and NCCL are not Debian packages: they come with the CUDA toolkit in
# /usr/local/cuda, and the build works without them.
set -euo pipefail

packages=(
  build-essential pkg-config
  clang              # the tests' and the programs' option files (the Makefile's FAST_CXX): half GCC's CPU at -O0
  libomp-dev         # clang's OpenMP: make test's ThreadSanitizer subset is clang's where this is installed
  libclang-rt-dev    # clang's sanitizer runtimes (that ThreadSanitizer subset) and libFuzzer (make fuzz, and
                     # make test's link of the fuzz targets)
  liburing-dev       # io engine
  libxxhash-dev      # checksums
  librandom123-dev   # Philox, the counter-based generator of initial values
  libcli11-dev       # command-line options
  nlohmann-json3-dev # JSON
  libboost-test-dev  # unit tests
  libopenmpi-dev openmpi-bin  # launch and CPU collectives
  libopenblas-dev    # CPU GEMM
  libsentencepiece-dev  # zinf-sample --tokenizer tokenizer.model (Llama 2, TinyLlama, Mistral)
  libpcre2-dev       # tokenizer.json's split regexes (Unicode properties, JIT): the text module
  libutf8proc-dev    # tokenizer.json's normalizers (NFC, NFKC, ...): the text module
  python3-numpy      # the independent references of the end-to-end tests (weights, llama_weights)
  fio                # the peer in scripts/bench-vs-fio.sh
  jq                 # JSON checks in the end-to-end tests, reshaping for plots
  strace             # SIGKILL inside a commit (tests/crash/), injected faults (hostile.sh)
  time               # GNU time: peak memory of a pipeline (e2e/round2's 100 MiB header checks)
  procps             # pkill, ps: ending a hung MPI case (e2e/commbench)
  gnuplot-nox        # scripts/plot.sh
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

if [[ ${1:-} == --check ]]; then
  if ((${#missing[@]})); then
    echo "zinf: missing packages: ${missing[*]}" >&2
    exit 1
  fi
  exit 0
fi

if ((${#missing[@]} == 0)); then
  echo "zinf: all build packages are installed" >&2
  exit 0
fi

if [[ $(id -u) -eq 0 ]]; then
  sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo=(sudo)
else
  echo "zinf: cannot install packages: not root and no password-less sudo." >&2
  echo "zinf: ask an administrator to run:" >&2
  echo "  apt-get install -y ${missing[*]}" >&2
  exit 1
fi

echo "zinf: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh machine has no package lists; refresh once, and again if a package
# is not found (stale lists).
if [[ ! -d /var/lib/apt/lists ]] || [[ -z $(ls /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial) ]]; then
  "${sudo[@]}" apt-get update -q
fi
if ! "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" || {
    echo "zinf: apt-get could not install: ${missing[*]}" >&2
    exit 1
  }
fi
