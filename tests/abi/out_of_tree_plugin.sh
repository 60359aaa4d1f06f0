#!/usr/bin/env bash
# Installs npubridge into a temporary prefix, builds docs/examples/
# out_of_tree_plugin against it with find_package(npubridge), checks that the
# plugin exports one symbol and that npubridge loads it from NPUB_PLUGIN_PATH.
set -euo pipefail
build_dir="$1"
source_dir="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$source_dir/docs/examples/out_of_tree_plugin" -B "$work/build" "${gen[@]}" \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
plugin="$work/build/libmy_npu_plugin.so"
syms="$(nm -D --defined-only "$plugin")"
[ "$(echo "$syms" | wc -l)" -eq 1 ] && echo "$syms" | grep -q " T npub_plugin_init_v1$" ||
  { echo "unexpected exports: $syms"; exit 1; }
out="$(NPUB_PLUGIN_PATH="$plugin" "$build_dir/bin/npub-demo")"
echo "$out" | grep -q "myplug .*1.0.0 .*libmy_npu_plugin.so" || { echo "$out"; exit 1; }
# The conformance an author runs on it, with the tests file the example ships
# (docs/plugin-authoring.md, "Testing your plugin: conformance"), where the
# PyTorch extension is built.
if ls "$build_dir"/python/npubridge/_C*.so >/dev/null 2>&1; then
  out="$(PYTHONPATH="$build_dir/python" NPUB_LOG_LEVEL=error python3 -m npubridge conformance --plugin "$plugin" \
         --tests "$source_dir/docs/examples/out_of_tree_plugin/my_npu_plugin_conformance.py" 2>&1)" ||
    { echo "$out"; echo "conformance of the example plugin failed"; exit 1; }
  echo "$out" | grep -q "^PASS myplug myplug::axpy float32 \[kernel p0 {float32}\]: 6/6 samples (forward, error case); no meta function" || { echo "$out"; exit 1; }
  echo "$out" | grep -v "^ \|Warning"
fi
echo "out-of-tree plugin built against the installed npubridge and loaded"
