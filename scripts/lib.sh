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

# The clients the tests drive, pinned (README "Version matrix"): releases
# whose requirements keep torch 2.13.0. vLLM 0.32.0 is the newest release
# that pins torch==2.13.0 (0.33 pins 2.14.0) and takes transformers
# >=5.16.1,<5.20.0, so transformers is 5.19.0 (a new release may also call
# new torch.npu functions, which test_npu_client_api checks). TRL brings
# datasets, whose pandas and pyarrow are pinned with it (their wheels keep
# torch too). All go to pip in one command with torch==2.13.0, so that pip
# resolves them together and can never pick another torch (checked after).
NPUB_VLLM_VERSION=0.32.0
NPUB_TRANSFORMERS_VERSION=5.19.0
NPUB_ACCELERATE_VERSION=1.15.0
NPUB_PEFT_VERSION=0.21.2
NPUB_TRL_VERSION=1.16.0
NPUB_DATASETS_VERSION=5.2.0
# MindSpore, the second host framework (npubridge.mindspore): its CPU wheel
# (about 800 MB) requires neither torch nor a numpy<2, so it is installed on
# its own after the clients above and leaves their versions as they are.
NPUB_MINDSPORE_VERSION=2.10.0

# vLLM 0.32.0 requires torchvision==0.28.0, torchaudio==2.11.0 and
# torchcodec. PyPI has only CUDA builds of them: with the CPU torch their
# native libraries do not load (libc10_cuda.so is missing), and a
# torchvision that fails to import breaks transformers' imports ("operator
# torchvision::nms does not exist"). Neither vLLM's text generation nor
# transformers needs them (transformers checks whether they are installed),
# so set-up removes the three after the install (README "Version matrix").
NPUB_CUDA_ONLY_WHEELS=(torchvision torchaudio torchcodec)

# npub_pip_has <distribution> <version>: whether exactly that version is installed.
npub_pip_has() {
  python3 -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('$1') == '$2' else 1)" 2>/dev/null
}

# npub_pip_installed <distribution>: whether any version is installed.
npub_pip_installed() {
  python3 -c "import importlib.metadata as m; m.version('$1')" 2>/dev/null
}

# npub_torch_is_pinned: whether torch 2.13.0 is installed and imports. The
# check keeps torch from autoloading an installed npubridge (its entry
# point): a broken or stale install of ours must not read as a missing
# torch, which would reinstall it.
npub_torch_is_pinned() {
  TORCH_DEVICE_BACKEND_AUTOLOAD=0 python3 -c \
    "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null
}

# PyPI packages: torch (CPU build, LibTorch for npub-conformance), pytest.
# Always the pinned torch: any other spelling pulls a multi-GB CUDA build.
npub_install_pip() {
  if ! npub_torch_is_pinned; then
    npub_log "installing torch==2.13.0"
    python3 -m pip install -q torch==2.13.0
  fi
  # pytest, what torch.testing._internal (PyTorch's OpInfo database)
  # imports, the clients (above), and what
  # `pip wheel/install --no-build-isolation .` builds with (scikit-build-core,
  # pybind11; packaging.pip_author_kit; setuptools for compat/torch_npu).
  if ! { TORCH_DEVICE_BACKEND_AUTOLOAD=0 python3 -c \
           "import pytest, expecttest, hypothesis, transformers, scikit_build_core, pybind11, setuptools" 2>/dev/null &&
         npub_pip_has vllm "$NPUB_VLLM_VERSION" && npub_pip_has transformers "$NPUB_TRANSFORMERS_VERSION" &&
         npub_pip_has accelerate "$NPUB_ACCELERATE_VERSION" && npub_pip_has peft "$NPUB_PEFT_VERSION" &&
         npub_pip_has trl "$NPUB_TRL_VERSION" && npub_pip_has datasets "$NPUB_DATASETS_VERSION"; }; then
    npub_log "installing the pinned Python packages (vllm==$NPUB_VLLM_VERSION and its requirements: a few minutes the first time)"
    python3 -m pip install -q --root-user-action=ignore torch==2.13.0 pytest expecttest hypothesis \
      "vllm==$NPUB_VLLM_VERSION" "transformers==$NPUB_TRANSFORMERS_VERSION" \
      "accelerate==$NPUB_ACCELERATE_VERSION" "peft==$NPUB_PEFT_VERSION" "setuptools>=61" \
      "trl==$NPUB_TRL_VERSION" "datasets==$NPUB_DATASETS_VERSION" pandas==3.1.1 pyarrow==26.0.1 \
      "scikit-build-core>=0.8" "pybind11>=2.10"
  fi
  if ! npub_pip_has mindspore "$NPUB_MINDSPORE_VERSION"; then
    npub_log "installing mindspore==$NPUB_MINDSPORE_VERSION (the second host framework; an 800 MB wheel)"
    python3 -m pip install -q --root-user-action=ignore "mindspore==$NPUB_MINDSPORE_VERSION"
  fi
  local w
  for w in "${NPUB_CUDA_ONLY_WHEELS[@]}"; do
    if npub_pip_installed "$w"; then
      npub_log "removing $w (a CUDA-only build on PyPI, which cannot load with the CPU torch)"
      python3 -m pip uninstall -y -q --root-user-action=ignore "$w"
    fi
  done
  npub_torch_is_pinned ||
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
  # One compiler name for every build: CMake's default is c++, and
  # scikit-build-core takes Python's sysconfig one (g++) when CXX is unset;
  # ccache keys the two apart.
  export CC="${CC:-cc}" CXX="${CXX:-c++}"
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
# sanitizer failing, not a finding. Only then the failed tests run once more:
# when every test that failed (ctest's "The following tests FAILED:" list)
# failed as "Failed" or "Subprocess aborted" (not a timeout, not "Not Run",
# not another signal), and its output holds the tracer's crash as the last
# thing it printed, and nothing that reports a failure (a sanitizer report,
# a GoogleTest failure, pytest's failed/errored tests, its -q summary or a
# collection error, a Python traceback). Anything else fails as it is.
npub_asan_ctest() {
  local dir="$1"
  shift
  local log="$dir/asan-ctest.log"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # --output-on-failure: the verdict below reads each failed test's output.
  if (cd "$dir" && ctest --output-on-failure "$@" 2>&1 | tee "$log"; exit "${PIPESTATUS[0]}"); then
    return 0
  fi
  if npub_asan_only_tracer_crashes "$log"; then
    npub_log "LeakSanitizer's tracer crashed in every failed test, and nothing else failed; re-running the failed tests once"
    (cd "$dir" && ctest --rerun-failed --output-on-failure --timeout 600)
    return
  fi
  return 1
}

# npub_asan_only_tracer_crashes <ctest log>: succeeds when the log (of ctest
# --output-on-failure) lists failed tests and every one of them died of
# LeakSanitizer's tracer crash alone (npub_asan_ctest); otherwise fails,
# saying on stderr why, when a tracer crash was in the log at all.
# tests/scripts/test_asan_retry.sh feeds it real ctest logs.
npub_asan_only_tracer_crashes() {
  # What reports a failure, in any failed test's output: a sanitizer report;
  # GoogleTest ("file.cpp:42: Failure": a test's name may end in "Failure",
  # so the line number is part of the pattern; "[  FAILED  ]"); pytest (the
  # short summary's "FAILED x::y"/"ERROR x", "ERROR collecting",
  # "Interrupted: 1 error during collection", the -q summary "3 failed, 10
  # passed in 5s" / "1 error in 0.5s", assertion lines "E   ...", "no tests
  # ran"); a Python traceback or fatal error.
  local finding='ERROR: [A-Za-z]*Sanitizer|SUMMARY: [A-Za-z]*Sanitizer|runtime error:'
  finding+='|:[0-9]+: Failure$|\[  FAILED  \]'
  finding+='|^(FAILED|ERROR)( |$)|ERROR collecting|Interrupted: |(^|[^0-9])[0-9]+ (failed|errors?)([ ,]|$)|^E  |no tests ran'
  finding+='|Traceback \(most recent call last\)|Fatal Python error'
  awk -v finding="$finding" '
    function close_section() {
      if (cur != "") {
        ok[cur] = (tracer && fatal && !found && !after) ? "" : \
          (!fatal ? "no LeakSanitizer tracer crash in its output" : \
           !tracer ? "a LeakSanitizer fatal error without the tracer'"'"'s crash" : \
           found ? "its output reports a failure: " first_found : \
                   "it printed more after the LeakSanitizer fatal error: " first_after)
        seen[cur] = 1
      }
      cur = ""
    }
    /^ *[0-9]+\/[0-9]+ Test +#[0-9]+: / {
      close_section()
      line = $0
      sub(/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: /, "", line)
      split(line, parts, " ")
      cur = parts[1]; tracer = 0; fatal = 0; found = 0; after = 0; first_found = ""; first_after = ""
      next
    }
    /^ +Start +[0-9]+: / { next }
    /^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+/ {
      close_section()
      summary = 1
      nfailed = $4
      next
    }
    /^The following tests FAILED:/ { close_section(); listing = 1; next }
    listing && /^[ \t]+[0-9]+ - .* \([^()]*\)$/ {
      line = $0
      sub(/^[ \t]+[0-9]+ - /, "", line)
      reason = line; sub(/.* \(/, "", reason); sub(/\)$/, "", reason)
      name = line; sub(/ \([^()]*\)$/, "", name)
      failed[++nlisted] = name; why[name] = reason
      next
    }
    listing { listing = 0 }
    cur != "" {
      if ($0 ~ /LeakSanitizer has encountered a fatal error/) { fatal = 1; anyfatal = 1; next }
      if ($0 ~ /^Tracer caught signal [0-9]+/) { if (!fatal) tracer = 1; next }
      if (fatal && $0 !~ /^[ \t]*$/ && $0 !~ /^==[0-9]+==/ && !after) { after = 1; first_after = $0 }
      if ($0 ~ finding && !found) { found = 1; first_found = $0 }
    }
    END {
      close_section()
      verdict = 0
      if (!summary || nlisted == 0 || nlisted != nfailed) {
        msg[++nmsg] = "no complete list of failed tests in the log"
        verdict = 1
      }
      for (i = 1; i <= nlisted; i++) {
        t = failed[i]
        if (why[t] != "Failed" && why[t] != "Subprocess aborted") {
          msg[++nmsg] = t " (" why[t] "): not a crash at exit"
          verdict = 1
        } else if (!(t in seen)) {
          msg[++nmsg] = t " (" why[t] "): its output is not in the log"
          verdict = 1
        } else if (ok[t] != "") {
          msg[++nmsg] = t " (" why[t] "): " ok[t]
          verdict = 1
        }
      }
      if (verdict && anyfatal) {
        print "not retried: a LeakSanitizer tracer crash is not the only failure:" > "/dev/stderr"
        for (i = 1; i <= nmsg; i++) print "  " msg[i] > "/dev/stderr"
      }
      exit verdict
    }
  ' "$1"
}
