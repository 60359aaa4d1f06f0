#!/usr/bin/env bash
# Fails when a C or C++ file of the project differs from what clang-format
# (Debian's clang-format 14, the root .clang-format) makes of it; prints the
# files and the first lines of the difference. `--fix` rewrites them instead.
# tests/abi/frozen/ is a released header kept byte for byte and is skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Other clang-format releases lay some constructs out differently: the
# format is what 14 (Debian 12's) makes. Any other release, or none, fails:
# a check that cannot run is no pass.
if ! command -v clang-format >/dev/null; then
  echo "clang-format: not found; the format is defined by release 14: on Debian 12, apt-get install clang-format (scripts/lib.sh installs it)" >&2
  exit 1
fi
major="$(clang-format --version | sed -n 's/.*version \([0-9]*\).*/\1/p')"
if [ "$major" != "14" ]; then
  echo "clang-format: found release ${major:-unknown} ($(command -v clang-format)), but the format is defined by release 14:" >&2
  echo "  on Debian 12, Debian's clang-format package is release 14 (apt-get install clang-format);" >&2
  echo "  elsewhere, put a clang-format of release 14 first on PATH (e.g. Debian/Ubuntu's clang-format-14 package, as clang-format)" >&2
  exit 1
fi

mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.c' '*.cpp' '*.h' '*.hpp' | grep -v '^tests/abi/frozen/')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "clang-format: ${#bad[@]} file(s) not formatted (fix with scripts/check_format.sh --fix):" >&2
  for f in "${bad[@]}"; do
    echo "  $f" >&2
    diff -u "$f" <(clang-format "$f") | sed -n '3,14p' >&2 || true
  done
  exit 1
fi
echo "clang-format: ${#files[@]} files formatted"
