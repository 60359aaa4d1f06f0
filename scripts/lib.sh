# Shared by demo.sh, test.sh and bench.sh: set-up and build. Idempotent, and
# fast when nothing changed (package checks only, incremental ccache build).
set -euo pipefail

NPUB_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NPUB_JOBS="${NPUB_JOBS:-2}"

npub_log() { printf '\n==> %s\n' "$*"; }

# Debian packages the build needs.
NPUB_APT_PACKAGES=(g++ cmake ninja-build ccache pkg-config libdlpack-dev libboost-dev
                   libspdlog-dev libgtest-dev libbenchmark-dev libdnnl-dev binutils
                   clang-format)

npub_install_apt() {
  local missing=()
  for p in "${NPUB_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # cmake and ninja may come from pip instead; that is fine.
  local needed=()
  for p in "${missing[@]}"; do
    case "$p" in
      cmake) command -v cmake >/dev/null || needed+=("$p") ;;
      ninja-build) command -v ninja >/dev/null || needed+=("$p") ;;
      *) needed+=("$p") ;;
    esac
  done
  [ ${#needed[@]} -eq 0 ] && return 0
  npub_log "installing Debian packages: ${needed[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${needed[@]}"
}

# Configure and build one tree: npub_build <build-dir> [cmake args...]
npub_build() {
  local dir="$1"
  shift
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  # Configured every time (a second or two) so that changed options apply.
  [ -f "$dir/CMakeCache.txt" ] && gen=()
  npub_log "configuring $dir"
  mkdir -p "$(dirname "$dir")"
  cmake -S "$NPUB_ROOT" -B "$dir" "${gen[@]}" -DNPUB_WERROR=ON "$@" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
  npub_log "building $dir"
  cmake --build "$dir" -j "$NPUB_JOBS"
}

# PyPI packages: torch (CPU build, LibTorch for npub-conformance), pytest.
# Always the pinned torch: any other spelling pulls a multi-GB CUDA build.
npub_install_pip() {
  if ! python3 -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
    npub_log "installing torch==2.13.0"
    python3 -m pip install -q torch==2.13.0
  fi
  # pytest, what torch.testing._internal (PyTorch's OpInfo database)
  # imports, transformers for the real-model test, and what
  # `pip wheel/install --no-build-isolation .` builds with (scikit-build-core,
  # pybind11; packaging.pip_author_kit). torch==2.13.0 is named with them so
  # that pip can never resolve another torch for them (checked after).
  python3 -c "import pytest, expecttest, hypothesis, transformers, scikit_build_core, pybind11" 2>/dev/null ||
    python3 -m pip install -q --root-user-action=ignore torch==2.13.0 pytest expecttest hypothesis transformers \
      "scikit-build-core>=0.8" "pybind11>=2.10"
  python3 -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" ||
    { echo "torch is no longer 2.13.0 after installing Python packages" >&2; return 1; }
}

npub_setup() {
  npub_install_apt
  npub_install_pip
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
  # Paths below the checkout hashed relative to the build folder: the
  # wheel's build (build/wheel, demo.sh) and the release build
  # (build/release, test.sh), compiled with the same flags, share their
  # objects, and so do two clones of the repository.
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$NPUB_ROOT}"
  mkdir -p "$NPUB_ROOT/build"
}

# The release build tree (tests, benchmarks, tools): Release, the wheel's
# build type, so that ccache serves one from the other.
npub_build_release() {
  npub_build "$NPUB_ROOT/build/release" -DCMAKE_BUILD_TYPE=Release "$@"
}

# Builds and installs the Python package (the core, the plugins, the
# extension and the C++ tools, once, in build/wheel; incremental), as
# `pip install --no-build-isolation .` does, with warnings as errors.
npub_install_package() {
  (cd "$NPUB_ROOT" && CMAKE_BUILD_PARALLEL_LEVEL="$NPUB_JOBS" python3 -m pip install -q --no-build-isolation \
     --root-user-action=ignore -C cmake.define.NPUB_WERROR=ON .)
}

# ctest under ASan+UBSan+LSan in <build-dir>. LeakSanitizer's own tracer
# (the thread that stops the process at exit to scan it) now and then
# crashes ("Tracer caught signal 11 ... LeakSanitizer has encountered a
# fatal error", about 1 run in 100 here, in a test that passed): that is the
# sanitizer failing, not a finding. Only then, and only when the output holds
# no sanitizer report and no failed assertion, the failed tests run once
# more; anything else fails as it is.
npub_asan_ctest() {
  local dir="$1"
  shift
  local log="$dir/asan-ctest.log"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  if (cd "$dir" && ctest "$@" 2>&1 | tee "$log"; exit "${PIPESTATUS[0]}"); then
    return 0
  fi
  # A finding: a sanitizer report, a GoogleTest assertion ("file.cpp:42: Failure"; a
  # test's name may end in "Failure", so the line number is part of the pattern) or a
  # failed test, or pytest's failed/errored test or summary.
  local finding='ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer)|runtime error:'
  finding+='|:[0-9]+: Failure$|\[  FAILED  \]|^(FAILED|ERROR) [^ ]+::|=+ .*[0-9]+ (failed|errors?)\b'
  if grep -q "LeakSanitizer has encountered a fatal error" "$log" && ! grep -qE "$finding" "$log"; then
    npub_log "LeakSanitizer's tracer crashed (no sanitizer finding, no failed test); re-running the failed tests once"
    (cd "$dir" && ctest --rerun-failed --output-on-failure --timeout 600)
    return
  fi
  return 1
}
