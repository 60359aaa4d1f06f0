#!/usr/bin/env bash
# Set up, check the format, build, and run every test: the release build, an ASan+UBSan build
# of the whole suite, and a ThreadSanitizer run of the stream and concurrency
# tests. Exits non-zero on any failure.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
npub_setup

npub_log "format (clang-format)"
"$NPUB_ROOT/scripts/check_format.sh"

npub_build_release
npub_log "tests (release)"
(cd "$NPUB_ROOT/build/release" && ctest --output-on-failure -j "$NPUB_JOBS" --timeout 300)

npub_log "demo (release)"
"$NPUB_ROOT/build/release/bin/npub-demo" >/dev/null

if [ "${NPUB_SKIP_SANITIZERS:-0}" != "1" ]; then
  # Debug with line tables only (-g1): the sanitizers' reports keep their
  # function, file and line frames, and the trees take about 30% less CPU
  # to compile than with full debug info (for the torch extension's files,
  # 25 s against 35 s each; the torch headers' types are most of the
  # difference). The checkout's path is mapped to "." in the debug info:
  # ccache hashes the working directory of a build with debug info, so
  # without the map a clone in another folder (CI's) missed the cache for
  # every object of both trees, about ten minutes of compiling.
  dbg="-g1 -fdebug-prefix-map=$NPUB_ROOT=."
  san=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=$dbg" "-DCMAKE_CXX_FLAGS_DEBUG=$dbg"
       -DNPUB_BUILD_BENCH=OFF -DNPUB_BUILD_CONFORMANCE=OFF)
  npub_build "$NPUB_ROOT/build/asan" -DNPUB_SANITIZE=address -DNPUB_BUILD_PYTHON=ON "${san[@]}"
  npub_log "tests (ASan + UBSan)"
  npub_asan_ctest "$NPUB_ROOT/build/asan" --output-on-failure -j "$NPUB_JOBS" --timeout 600

  npub_build "$NPUB_ROOT/build/tsan" -DNPUB_SANITIZE=thread -DNPUB_BUILD_PYTHON=OFF "${san[@]}"
  npub_log "stream and concurrency tests (ThreadSanitizer)"
  (cd "$NPUB_ROOT/build/tsan" &&
   TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
   ctest --output-on-failure --timeout 900 -R 'Streams|Events|ComputePool|Concurrency|Devices|DispatcherTest|Loader.Concurrent')
fi

npub_log "all tests passed"
