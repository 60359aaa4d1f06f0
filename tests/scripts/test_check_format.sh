#!/usr/bin/env bash
# scripts/check_format.sh fails (exit 1, naming what it found and how to get
# release 14) when clang-format is another release or missing: a format
# check that cannot run is no pass. Checked with stand-ins on PATH.
set -uo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# A PATH with what the script needs besides clang-format.
mkdir -p "$work/bin"
for tool in bash env git sed grep dirname cat diff mkdir; do
  p="$(command -v "$tool")" || { echo "no $tool on PATH" >&2; exit 1; }
  ln -s "$p" "$work/bin/$tool"
done

# check <what> <expected status> <expected message part>: check_format.sh with $work/bin as PATH.
check() {
  local out status
  out="$(PATH="$work/bin" "$work/bin/bash" "$src/scripts/check_format.sh" 2>&1)"
  status=$?
  if [ "$status" -ne "$2" ] || ! grep -qF -- "$3" <<<"$out"; then
    fail "$1: expected status $2 and '$3', got status $status:"
    sed 's/^/    | /' <<<"$out" >&2
  else
    echo "ok: $1"
  fi
}

check "no clang-format" 1 "clang-format: not found"
printf '#!/bin/sh\necho "Ubuntu clang-format version 17.0.6 (1ubuntu1)"\n' >"$work/bin/clang-format"
chmod +x "$work/bin/clang-format"
check "clang-format 17" 1 "found release 17"
check "clang-format 17: how to get 14" 1 "Debian's clang-format package is release 14"
printf '#!/bin/sh\necho "no version here"\n' >"$work/bin/clang-format"
check "clang-format of no known release" 1 "found release unknown"

if [ $failures -gt 0 ]; then
  echo "$failures case(s) failed" >&2
  exit 1
fi
echo "check_format.sh: every case as expected"
