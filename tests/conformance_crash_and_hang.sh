#!/usr/bin/env bash
# npub-conformance must report a kernel that crashes or hangs against its
# cell (plugin, op, dtype) and go on with the others:
# tests/plugins/conformance_plugin.cpp's conf_crash_aten segfaults in
# aten::relu_, never returns from aten::isnan and is correct in aten::relu.
#   conformance_crash_and_hang.sh NPUB-CONFORMANCE PLUGIN.so
set -u
start=$(date +%s)
out=$("$1" --plugin "$2" --timeout 3 2>&1)
status=$?
echo "$out"
echo "conformance_crash_and_hang: $(($(date +%s) - start)) s"
fail() { echo "conformance_crash_and_hang: $*" >&2; exit 1; }
[ "$status" -eq 1 ] || fail "expected exit status 1, got $status"
grep -q "^CRASHED conf_crash_aten aten::relu_ float32: crashed: the process died with signal 11 (SIGSEGV) in sample '\[5,7\]'; the run went on in a new process$" <<<"$out" ||
  fail "the segfault in aten::relu_ was not reported against it"
grep -q "^HUNG conf_crash_aten aten::isnan float32: hung: no result within 3 s in sample '\[5,7\]'; the run went on in a new process$" <<<"$out" ||
  fail "the hang in aten::isnan was not reported against it"
# The half types reach the float32 kernels through conversion: their own cells.
for d in float16 bfloat16; do
  grep -q "^CRASHED conf_crash_aten aten::relu_ $d: " <<<"$out" || fail "aten::relu_ $d not reported crashed"
  grep -q "^HUNG conf_crash_aten aten::isnan $d: " <<<"$out" || fail "aten::isnan $d not reported hung"
done
grep -q "passed, 0 failed, 3 crashed, 3 hung, " <<<"$out" || fail "the summary does not count 3 crashed and 3 hung"
! grep -q "^FAIL conf_crash_aten aten::relu " <<<"$out" || fail "aten::relu, correct, failed"
echo "conformance_crash_and_hang: the crash and the hang reported, the other op checked"
