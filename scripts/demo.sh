#!/usr/bin/env bash
# Set up (missing Debian packages), build, and run the demo.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
npub_setup
npub_build "$NPUB_ROOT/build/release"
npub_log "running the demo"
"$NPUB_ROOT/build/release/bin/npub-demo"
