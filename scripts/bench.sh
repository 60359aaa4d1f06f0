#!/usr/bin/env bash
# Benchmarks: ./scripts/bench.sh core|cann|torch|clients|models|mindspeed|mindspore|vllm|dist|graph [--quick]
# Prints the results and writes bench/results/<suite>.json.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
suite="${1:-core}"
npub_setup
npub_build_release
mkdir -p "$NPUB_ROOT/bench/results"
case "$suite" in
  core)
    "$NPUB_ROOT/build/release/bin/npub_bench_core" \
      --benchmark_repetitions="${NPUB_BENCH_REPS:-5}" \
      --benchmark_report_aggregates_only=true \
      --benchmark_out="$NPUB_ROOT/bench/results/core.json" --benchmark_out_format=json
    python3 "$NPUB_ROOT/bench/report_core.py" "$NPUB_ROOT/bench/results/core.json"
    ;;
  cann)
    "$NPUB_ROOT/build/release/bin/npub_bench_cann" "$NPUB_ROOT/bench/results/cann.json"
    ;;
  torch)
    (cd /tmp && PYTHONPATH="$NPUB_ROOT/build/release/python" NPUB_LOG_LEVEL=error \
       python3 "$NPUB_ROOT/bench/bench_torch.py" "$NPUB_ROOT/bench/results/torch.json")
    ;;
  clients)
    (cd /tmp && PYTHONPATH="$NPUB_ROOT/build/release/python:$NPUB_ROOT/compat/torch_npu" NPUB_LOG_LEVEL=error \
       python3 "$NPUB_ROOT/bench/bench_clients.py" "$NPUB_ROOT/bench/results/clients.json" "${@:2}")
    ;;
  models)
    (cd /tmp && PYTHONPATH="$NPUB_ROOT/build/release/python" NPUB_LOG_LEVEL=error \
       python3 "$NPUB_ROOT/bench/bench_models.py" "$NPUB_ROOT/bench/results/models.json" "${@:2}")
    ;;
  mindspeed)
    (cd /tmp && PYTHONPATH="$NPUB_ROOT/build/release/python" NPUB_LOG_LEVEL=error \
       python3 "$NPUB_ROOT/bench/bench_mindspeed.py" "$NPUB_ROOT/bench/results/mindspeed.json" "${@:2}")
    ;;
  vllm)
    (cd /tmp && PYTHONPATH="$NPUB_ROOT/build/release/python" NPUB_LOG_LEVEL=error \
       python3 "$NPUB_ROOT/bench/bench_vllm.py" --json "$NPUB_ROOT/bench/results/vllm.json" "${@:2}")
    ;;
  mindspore)
    (cd /tmp && PYTHONPATH="$NPUB_ROOT/build/release/python" NPUB_LOG_LEVEL=error \
       python3 "$NPUB_ROOT/bench/bench_mindspore.py" "$NPUB_ROOT/bench/results/mindspore.json" "${@:2}")
    ;;
  dist)
    (cd /tmp && PYTHONPATH="$NPUB_ROOT/build/release/python" NPUB_LOG_LEVEL=error GLOO_SOCKET_IFNAME=lo \
       python3 "$NPUB_ROOT/bench/bench_dist.py" "$NPUB_ROOT/bench/results/dist.json" "${@:2}")
    ;;
  graph)
    (cd /tmp && PYTHONPATH="$NPUB_ROOT/build/release/python" NPUB_LOG_LEVEL=error \
       python3 "$NPUB_ROOT/bench/bench_graph.py" "$NPUB_ROOT/bench/results/graph.json" "${@:2}")
    ;;
  *)
    echo "bench.sh: unknown suite '$suite' (known: core, cann, torch, clients, models, mindspeed, vllm, dist, graph)" >&2
    exit 2
    ;;
esac
# The published tables of README.md and docs/ come from the results files
# (tests/python/test_doc_figures.py fails when they differ).
npub_log "rewriting the benchmark tables of README.md and docs/ from bench/results"
python3 "$NPUB_ROOT/bench/tables.py"
