#!/usr/bin/env bash
# Regenerates the committed op-coverage reports docs/coverage/<plugin>.md
# (and .json) with npub-conformance, for every in-tree plugin.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
npub_setup
npub_build "$NPUB_ROOT/build/release"
mkdir -p "$NPUB_ROOT/docs/coverage"
status=0
for plugin in cann_like mindspeed_like vllm_like; do
  "$NPUB_ROOT/build/release/bin/npub-conformance" \
    --plugin "$NPUB_ROOT/build/release/lib/npubridge/plugins/libnpub_${plugin}.so" \
    --md "$NPUB_ROOT/docs/coverage/${plugin}.md" --json "$NPUB_ROOT/docs/coverage/${plugin}.json" 2>/dev/null || status=1
done
exit $status
