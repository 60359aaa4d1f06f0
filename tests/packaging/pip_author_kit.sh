#!/usr/bin/env bash
# packaging.pip_author_kit: a third-party plugin author who has only
# `pip install`ed npubridge can build, load and test a plugin.
#
# Builds the wheel (scikit-build-core, incremental in <source>/build/wheel
# and through ccache), installs it into a fresh venv that sees the system's
# torch==2.13.0 (--system-site-packages; pip never resolves torch here:
# --no-deps, --no-index), and then, in a temporary folder outside the
# repository with nothing of it on PYTHONPATH or CMAKE_PREFIX_PATH:
#  - builds docs/examples/out_of_tree_plugin (C++ SDK, found through
#    CMAKE_PREFIX_PATH=$(python3 -m npubridge --cmake-dir)) and
#    docs/examples/c_plugin (C99, through npubridge_DIR, with the system's
#    dlpack CMake package disabled so the wheel's dlpack.h serves);
#  - checks that each exports exactly npub_plugin_init_v1;
#  - loads each through NPUB_PLUGIN_PATH with `python3 -m npubridge plugins`,
#    and a directory holding both plus a helper library without the entry
#    symbol (skipped, exit 0), and that helper named explicitly (rejected,
#    exit 1);
#  - calls each plugin's op from PyTorch on npu against a float64 CPU
#    reference computed with torch, and checks the plugin served the call;
#  - runs `python3 -m npubridge conformance --plugin` on both (each passes,
#    with its <library>_conformance.py beside it);
#  - builds the test plugins with deliberate mistakes the same way and
#    checks that each is now an error naming the op and plugin
#    (tests/python/test_author_mistakes.py) or a conformance failure.
# Needs no network: setup (scripts/lib.sh) installed scikit-build-core and
# pybind11.
#
# usage: pip_author_kit.sh <source-dir> [<python3>]
set -euo pipefail
src="$(cd "$1" && pwd)"
python="${2:-python3}"
work="$(mktemp -d "${TMPDIR:-/tmp}/npub-author-kit.XXXXXX")"
case "$work" in "$src"/*) echo "the work folder $work is inside the repository" >&2; exit 1 ;; esac
trap 'rm -rf "$work"' EXIT

now_ms() { local t="${EPOCHREALTIME/./}"; echo $((t / 1000)); }
elapsed() { local ms=$(($(now_ms) - $1)); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }  # s since <now_ms>
t_start=$(now_ms)
step() { printf '\n--- %s\n' "$*"; }
fail() { echo "FAILED: $*" >&2; exit 1; }

step "wheel (pip wheel --no-build-isolation --no-deps, build-dir $src/build/wheel)"
t=$(now_ms)
(cd "$src" && CMAKE_BUILD_PARALLEL_LEVEL="${NPUB_JOBS:-2}" "$python" -m pip wheel -q --no-build-isolation \
   --no-deps --no-index . -w "$work/dist") >"$work/wheel.log" 2>&1 || { cat "$work/wheel.log"; fail "pip wheel"; }
wheel="$(ls "$work"/dist/npubridge-*.whl)"
t_wheel=$(elapsed "$t")
echo "built $(basename "$wheel") in ${t_wheel} s"
# What a plugin author needs is in it.
kit_files="$("$python" -m zipfile -l "$wheel" | awk '{print $1}')"
for f in npubridge/include/npubridge/plugin_api.h npubridge/include/npubridge/plugin_sdk.hpp \
         npubridge/include/npubridge/half.hpp npubridge/include/npubridge/philox.hpp \
         npubridge/include/dlpack/dlpack.h npubridge/lib/cmake/npubridge/npubridgeConfig.cmake \
         npubridge/lib/cmake/npubridge/npubridgeConfigVersion.cmake \
         npubridge/lib/cmake/npubridge/npubridgeTargets.cmake \
         npubridge/lib/cmake/npubridge/npubridge_plugin.cmake npubridge/lib/cmake/npubridge/plugin.map; do
  grep -qx "$f" <<<"$kit_files" || fail "the wheel has no $f"
done

step "fresh venv (--system-site-packages: the installed torch==2.13.0), wheel installed offline"
t=$(now_ms)
# --without-pip: ensurepip (Debian's python3-venv) is not needed; the system's pip serves.
"$python" -m venv --without-pip --system-site-packages "$work/venv"
py="$work/venv/bin/python3"
"$py" -m pip install -q --no-deps --no-index --force-reinstall "$wheel" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "pip install of the wheel"; }
echo "installed in $(elapsed "$t") s"

# From here on: in the work folder, nothing of the repository in the environment.
cd "$work"
unset PYTHONPATH CMAKE_PREFIX_PATH NPUB_PLUGIN_PATH npubridge_DIR
export NPUB_LOG_LEVEL=warn
pkg="$("$py" -c 'import os, npubridge; print(os.path.dirname(npubridge.__file__))' 2>/dev/null)"
[[ "$pkg" == "$work/venv/"* ]] || fail "npubridge imported from $pkg, not from the venv"
cmake_dir="$("$py" -m npubridge --cmake-dir 2>/dev/null)"
include_dir="$("$py" -m npubridge --include-dir 2>/dev/null)"
echo "--cmake-dir   $cmake_dir"
echo "--include-dir $include_dir"
[ "$cmake_dir" = "$pkg/lib/cmake/npubridge" ] && [ -f "$cmake_dir/npubridgeConfig.cmake" ] ||
  fail "--cmake-dir printed '$cmake_dir'"
[ "$include_dir" = "$pkg/include" ] && [ -f "$include_dir/npubridge/plugin_api.h" ] ||
  fail "--include-dir printed '$include_dir'"

step "configure and build both example plugins against the wheel"
t=$(now_ms)
cp -r "$src/docs/examples/out_of_tree_plugin" "$work/sdk_plugin"
cp -r "$src/docs/examples/c_plugin" "$work/c_plugin"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
build_plugin() {  # <name> <cmake args...>
  local name="$1"
  shift
  cmake -S "$work/$name" -B "$work/$name/build" "${gen[@]}" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "$@" \
    >"$work/$name.configure.log" 2>&1 || { cat "$work/$name.configure.log"; fail "configuring $name"; }
  cmake --build "$work/$name/build" >"$work/$name.build.log" 2>&1 ||
    { cat "$work/$name.build.log"; fail "building $name"; }
  ! grep -q "$src" "$work/$name/build/compile_commands.json" || fail "$name was compiled with paths into $src"
  grep -q -- "-I$include_dir\|-isystem $include_dir" "$work/$name/build/compile_commands.json" ||
    fail "$name was not compiled against $include_dir"
}
build_plugin sdk_plugin -DCMAKE_PREFIX_PATH="$cmake_dir"
# The C plugin finds npubridge through npubridge_DIR, and, with the system's
# dlpack package out of reach, the dlpack.h in the wheel.
build_plugin c_plugin -Dnpubridge_DIR="$cmake_dir" -DCMAKE_DISABLE_FIND_PACKAGE_dlpack=ON
sdk_so="$work/sdk_plugin/build/libmy_npu_plugin.so"
c_so="$work/c_plugin/build/libc_npu_plugin.so"
echo "built both in $(elapsed "$t") s"

step "each exports exactly one symbol"
for so in "$sdk_so" "$c_so"; do
  syms="$(nm -D --defined-only "$so")"
  [ "$(wc -l <<<"$syms")" -eq 1 ] && grep -q " T npub_plugin_init_v1$" <<<"$syms" ||
    fail "$(basename "$so") exports: $syms"
  echo "$(basename "$so"): $syms"
done

step "python3 -m npubridge plugins"
expect_listed() {  # <output> <plugin name> <file>
  grep -qE "^  $2 +1\.0\.0 +1\.[0-9]+ +1 +enabled +$3\$" <<<"$1" || { echo "$1"; fail "$2 not listed as loaded from $3"; }
}
for so in "$sdk_so" "$c_so"; do
  out="$(NPUB_PLUGIN_PATH="$so" "$py" -m npubridge plugins)" || { echo "$out"; fail "plugins exited non-zero for $so"; }
  echo "$out"
  case "$so" in "$sdk_so") expect_listed "$out" myplug "$so" ;; *) expect_listed "$out" cplug "$so" ;; esac
  grep -q "^rejected (0):" <<<"$out" || fail "a plugin was rejected"
done
# A directory with both plugins and a helper library that is not a plugin.
mkdir "$work/plugins"
cp "$sdk_so" "$c_so" "$work/plugins/"
printf 'int npub_example_helper(int x) { return x + 1; }\n' >"$work/helper.c"
cc -shared -fPIC -o "$work/plugins/libhelper.so" "$work/helper.c"
out="$(NPUB_PLUGIN_PATH="$work/plugins" "$py" -m npubridge plugins)" || { echo "$out"; fail "a helper .so in a plugin directory made plugins fail"; }
echo "$out"
expect_listed "$out" myplug "$work/plugins/libmy_npu_plugin.so"
expect_listed "$out" cplug "$work/plugins/libc_npu_plugin.so"
grep -qF "'$work/plugins/libhelper.so' skipped: not an npubridge plugin (no npub_plugin_init_v1)" <<<"$out" ||
  fail "the helper was not reported as skipped"
# Named explicitly, the helper must be a plugin: rejected, exit 1.
if out="$(NPUB_PLUGIN_PATH="$work/plugins/libhelper.so" "$py" -m npubridge plugins 2>/dev/null)"; then
  echo "$out"
  fail "plugins exited 0 although libhelper.so, named in NPUB_PLUGIN_PATH, was rejected"
fi
grep -qF "plugin '$work/plugins/libhelper.so' rejected: entry symbol 'npub_plugin_init_v1' not found" <<<"$out" ||
  { echo "$out"; fail "the explicitly named helper was not rejected with its reason"; }
echo "libhelper.so named explicitly: rejected, exit 1"

step "each plugin's op from PyTorch on npu against a float64 CPU reference"
t=$(now_ms)
cat >"$work/check_ops.py" <<'PY'
import torch
import npubridge

torch.manual_seed(0)
x, y = torch.randn(1000), torch.randn(1000)
got = torch.ops.myplug.axpy(x.to("npu"), y.to("npu"), 0.75).cpu()
want = 0.75 * x.double() + y.double()
torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
print(f"myplug::axpy: max |error| {(got.double() - want).abs().max().item():.2e} against float64")

z = torch.randn(64, 33) * 3
got = torch.ops.cplug.hardtanh(z.to("npu"), -0.5, 1.25).cpu()
want = torch.nn.functional.hardtanh(z.double(), -0.5, 1.25)
torch.testing.assert_close(got.double(), want, rtol=0, atol=0)
print(f"cplug::hardtanh: exact against float64, shape {tuple(got.shape)}, dtype {got.dtype}")

stats = npubridge.stats()
for op, plugin in (("myplug::axpy", "myplug"), ("cplug::hardtanh", "cplug")):
    served = stats[op]["native"].get(plugin, 0)
    assert served == 1 and stats[op]["fallbacks"] == 0, f"{op}: {stats[op]}"
print("both calls served by their plugin")
PY
NPUB_PLUGIN_PATH="$work/plugins" "$py" "$work/check_ops.py" || fail "the plugins' ops on npu"
echo "ops checked in $(elapsed "$t") s"

# --- conformance of both plugins ---------------------------------------------
# Each example ships its op's samples and ATen reference beside it
# (<library>_conformance.py); the command must find them and pass.
step "python3 -m npubridge conformance --plugin, both plugins"
t=$(now_ms)
cp "$work/sdk_plugin/my_npu_plugin_conformance.py" "$work/sdk_plugin/build/"
cp "$work/c_plugin/c_npu_plugin_conformance.py" "$work/c_plugin/build/"
for so in "$sdk_so" "$c_so"; do
  out="$("$py" -m npubridge conformance --plugin "$so" --report "$so.md" --json "$so.json" 2>&1)" ||
    { echo "$out"; fail "conformance --plugin $so"; }
  echo "$out" | tail -1
  grep -q "0 failed, 0 not covered" <<<"$out" || { echo "$out"; fail "conformance --plugin $so left something out"; }
done
echo "conformance in $(elapsed "$t") s"

# --- the mistakes authors make: each an error or a conformance failure --------
# Built out of tree against the wheel as the examples are: the in-tree test
# plugins with one mistake per op (tests/plugins/author_mistakes_plugin.cpp)
# and per library (tests/plugins/conformance_plugin.cpp, CONF_MODE).
step "each silent mistake is now an error or a conformance failure"
t=$(now_ms)
mkdir -p "$work/mistakes"
cp "$src/tests/plugins/author_mistakes_plugin.cpp" "$src/tests/plugins/conformance_plugin.cpp" "$work/mistakes/"
cat >"$work/mistakes/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.22)
project(mistakes LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(npubridge 0.1 REQUIRED)
npubridge_add_plugin(author_mistakes SOURCES author_mistakes_plugin.cpp)
# 2: numerically wrong aten::hardtanh.out; 3: float64 declared, read as float;
# 4: the overload typo aten::hardtanh.outt.
foreach(mode 2 3 4)
  npubridge_add_plugin(conf_mode_${mode} SOURCES conformance_plugin.cpp)
  target_compile_definitions(conf_mode_${mode} PRIVATE CONF_MODE=${mode})
endforeach()
CMAKE
build_plugin mistakes -DCMAKE_PREFIX_PATH="$cmake_dir"
# Wrong second-argument dtype, unset return, wrong output shape, the meta
# body without its guard, a plugin-only op's decline, the overload typo's
# warning: the dispatcher's errors, asserted verbatim.
NPUB_TEST_MISTAKES_PLUGIN="$work/mistakes/build/libauthor_mistakes.so" \
  "$py" -m pytest -q -p no:cacheprovider "$src/tests/python/test_author_mistakes.py" ||
  fail "the dispatcher's errors for the mistakes plugin"
expect_conformance_failure() {  # <mode> <text the output must hold>
  local so="$work/mistakes/build/libconf_mode_$1.so" out
  if out="$("$py" -m npubridge conformance --plugin "$so" --report "$so.md" --json "$so.json" 2>&1)"; then
    echo "$out"
    fail "conformance passed $(basename "$so")"
  fi
  grep -qF -- "$2" <<<"$out" || { echo "$out"; fail "conformance of $(basename "$so") did not say: $2"; }
  echo "$(basename "$so"): fails as it should: $2"
}
expect_conformance_failure 2 "FAIL conf_wrong aten::hardtanh.out float32"
expect_conformance_failure 3 "FAIL conf_f64 aten::hardtanh.out float64"
expect_conformance_failure 4 "unknown to ATen: aten::hardtanh has no overload 'outt'"
echo "mistakes checked in $(elapsed "$t") s"

printf '\npip author kit: ok (wheel %s s, whole test %s s)\n' "$t_wheel" "$(elapsed "$t_start")"
