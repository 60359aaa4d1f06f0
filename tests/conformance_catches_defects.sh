#!/usr/bin/env bash
# npub-conformance must fail a plugin whose kernels are numerically wrong, and
# say which bound each missed: tests/plugins/imprecise_plugin.cpp drops the
# last term of every mm dot product and is 4 ulp off in float16 add.
#   conformance_catches_defects.sh NPUB-CONFORMANCE PLUGIN.so
set -u
out=$("$1" --plugin "$2" --op '^aten::(mm|add)\.out$' 2>&1)
status=$?
echo "$out"
fail() { echo "conformance_catches_defects: $*" >&2; exit 1; }
[ "$status" -eq 1 ] || fail "expected exit status 1, got $status"
grep -q "^FAIL imprecise aten::mm.out float32: .*exceed their error bound.*K\*u\*m + 1 ulp, K = [0-9]* terms" <<<"$out" ||
  fail "the mm that drops a term was not reported against its K*u*m bound"
grep -q "^FAIL imprecise aten::add.out float16: .*exceed their error bound.*2 ulp of float16" <<<"$out" ||
  fail "the float16 add that is 4 ulp off was not reported against its 2-ulp bound"
echo "conformance_catches_defects: both defects caught"
