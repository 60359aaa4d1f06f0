#!/usr/bin/env bash
# scripts/lib.sh's npub_asan_ctest re-runs the failed tests once only when
# every one of them died of LeakSanitizer's tracer crash (and nothing else
# failed). Checked against real ctest: a throw-away CTest project whose tests
# print what the real ones print (GoogleTest, pytest -q, plain scripts) and
# fail the way they fail (exit status, abort, timeout).
#   tests/scripts/test_asan_retry.sh [<cmake> [<ctest>]]
set -uo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cmake="${1:-cmake}"
ctest_bin="${2:-$(command -v ctest)}"
# npub_asan_ctest runs `ctest`: the one given first on PATH.
PATH="$(dirname "$ctest_bin"):$PATH"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# --- the throw-away project ---
p="$work/project"
mkdir -p "$p"
cat >"$p/lsan.inc" <<'LSAN'
echo "Tracer caught signal 11: addr=0x7f3a2c1ff000 pc=0x55d0c3a1b2c4 sp=0x7f3a2bffed40"
echo "==4242==LeakSanitizer has encountered a fatal error."
echo "==4242==HINT: For debugging, try setting environment variable LSAN_OPTIONS=verbosity=1:log_threads=1"
echo "==4242==HINT: LeakSanitizer does not work under ptrace (strace, gdb, etc)"
LSAN
gtest_pass='echo "[==========] Running 3 tests from 1 test suite."
echo "[ RUN      ] Loader.ReportsFailure"
echo "[       OK ] Loader.ReportsFailure (0 ms)"
echo "[==========] 3 tests from 1 test suite ran. (5 ms total)"
echo "[  PASSED  ] 3 tests."'
# Every test counts its runs (<name>.runs), to see whether it was re-run.
declare -A body
# The tests passed, then the tracer crashed at exit (abort_on_error=1): on the
# first run only, as the real crash (about 1 run in 100).
body[tracer_crash]="$gtest_pass
[ -e \"\$0.crashed\" ] && exit 0
touch \"\$0.crashed\"
. $p/lsan.inc
kill -ABRT \$\$"
# The same, every time: the re-run fails too.
body[tracer_crash_always]="$gtest_pass
. $p/lsan.inc
kill -ABRT \$\$"
body[gtest_failure]='echo "[ RUN      ] Dispatcher.Routes"
echo "/src/tests/unit/test_dispatcher.cpp:42: Failure"
echo "[  FAILED  ] Dispatcher.Routes (1 ms)"
exit 1'
body[asan_report]='echo "[ RUN      ] Dispatcher.Routes"
echo "==77==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x602000000018"
echo "SUMMARY: AddressSanitizer: heap-buffer-overflow test_dispatcher.cpp:42"
kill -ABRT $$'
body[pytest_q_failed]='echo "..F.F.F......                                                            [100%]"
echo "3 failed, 10 passed in 5.01s"
exit 1'
body[pytest_q_error]='echo "....E                                                                    [100%]"
echo "4 passed, 1 error in 2.00s"
exit 1'
body[pytest_collection_error]='echo "_______________ ERROR collecting tests/python/test_llama.py _______________"
echo "ModuleNotFoundError: No module named '"'transformers'"'"
echo "!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!"
echo "1 error in 0.50s"
exit 2'
# The tracer crash in a child, then pytest reports a failed test.
body[tracer_crash_then_pytest_failed]=". $p/lsan.inc
echo \"..F                                                                      [100%]\"
echo \"1 failed, 2 passed in 1.00s\"
exit 1"
body[timeout]='echo "[==========] Running 1 test from 1 test suite."
sleep 30'
body[script_failed]='echo "building the out-of-tree plugin"
echo "FAIL: the helper was not reported as skipped" >&2
exit 1'
body[script_aborted]='echo "checking the exports"
kill -ABRT $$'
# The tracer crash in a child, then the script fails on its own account.
body[tracer_crash_then_script_failed]="echo \"running npub-plugins --check\"
. $p/lsan.inc
echo \"FAIL: npub-plugins did not print ok\" >&2
exit 1"
body[passes]='echo "10 passed in 1.00s"'
{
  echo "cmake_minimum_required(VERSION 3.22)"
  echo "project(asan_retry NONE)"
  echo "enable_testing()"
  for t in "${!body[@]}"; do
    printf 'echo "run" >>"$0.runs"\n%s\n' "${body[$t]}" >"$p/$t.sh"
    echo "add_test(NAME $t COMMAND sh \${CMAKE_SOURCE_DIR}/$t.sh)"
  done
  echo "set_tests_properties(timeout PROPERTIES TIMEOUT 2)"
} >"$p/CMakeLists.txt"
"$cmake" -S "$p" -B "$work/build" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }

# shellcheck source=../../scripts/lib.sh
source "$src/scripts/lib.sh"
set +e  # lib.sh sets -e; the cases below look at each status themselves

runs() { cat "$p/$1.sh.runs" 2>/dev/null | wc -l; }

# expect <retried|failed|passed> <tests...>: npub_asan_ctest on exactly those tests.
expect() {
  local want="$1"
  shift
  rm -f "$p"/*.runs "$p"/*.crashed
  local regex
  regex="^($(IFS='|'; echo "$*"))\$"
  # As scripts/test.sh calls it.
  npub_asan_ctest "$work/build" --output-on-failure -j 2 --timeout 600 -R "$regex" >"$work/out.log" 2>&1
  local status=$? rerun=0 before=$failures
  for t in "$@"; do [ "$(runs "$t")" -gt 1 ] && rerun=1; done
  case "$want" in
    retried) [ $status -eq 0 ] && [ $rerun -eq 1 ] || fail "$*: expected a re-run that passes (status $status, re-run $rerun)" ;;
    failed) [ $status -ne 0 ] && [ $rerun -eq 0 ] || fail "$*: expected a failure without re-run (status $status, re-run $rerun)" ;;
    failed_after_rerun) [ $status -ne 0 ] && [ $rerun -eq 1 ] || fail "$*: expected a re-run that fails again (status $status, re-run $rerun)" ;;
    passed) [ $status -eq 0 ] && [ $rerun -eq 0 ] || fail "$*: expected a pass without re-run (status $status, re-run $rerun)" ;;
  esac
  if [ $failures -gt $before ]; then
    sed 's/^/    | /' "$work/out.log" >&2
  else
    echo "ok: $want: $*"
  fi
}

# The tracer crash alone (beside tests that pass): re-run once.
expect passed passes
expect retried tracer_crash
expect retried tracer_crash passes
# ...and when the re-run fails again, that fails.
expect failed_after_rerun tracer_crash_always
# Every other failure fails at once, alone or beside a tracer crash.
for other in gtest_failure asan_report pytest_q_failed pytest_q_error pytest_collection_error \
             tracer_crash_then_pytest_failed timeout script_failed script_aborted tracer_crash_then_script_failed; do
  expect failed "$other"
  expect failed tracer_crash "$other"
done

if [ $failures -gt 0 ]; then
  echo "$failures case(s) failed" >&2
  exit 1
fi
echo "npub_asan_ctest: every case as expected"
