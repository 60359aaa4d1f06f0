#!/usr/bin/env bash
# Regenerates the committed op-coverage reports docs/coverage/<plugin>.md
# (and .json) for every in-tree plugin: cann_like's ATen ops with
# npub-conformance (LibTorch), the plugin-only ops of mindspeed_like and
# vllm_like with `python3 -m npubridge conformance` and their samples and
# references (plugins/<plugin>/conformance/<plugin>_conformance.py).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
npub_setup
npub_build_release
mkdir -p "$NPUB_ROOT/docs/coverage"
plugins="$NPUB_ROOT/build/release/lib/npubridge/plugins"
status=0
"$NPUB_ROOT/build/release/bin/npub-conformance" --plugin "$plugins/libnpub_cann_like.so" \
  --md "$NPUB_ROOT/docs/coverage/cann_like.md" --json "$NPUB_ROOT/docs/coverage/cann_like.json" 2>/dev/null || status=1
# Paths relative to the repository: the reports name the plugin and its
# tests file alike on every machine.
for plugin in mindspeed_like vllm_like; do
  (cd "$NPUB_ROOT" && PYTHONPATH="$NPUB_ROOT/build/release/python" NPUB_LOG_LEVEL=error \
     python3 -m npubridge conformance --plugin "build/release/lib/npubridge/plugins/libnpub_${plugin}.so" \
       --tests "plugins/${plugin}/conformance/${plugin}_conformance.py" \
       --report "$NPUB_ROOT/docs/coverage/${plugin}.md" --json "$NPUB_ROOT/docs/coverage/${plugin}.json") || status=1
done
exit $status
