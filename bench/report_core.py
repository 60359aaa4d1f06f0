#!/usr/bin/env python3
"""Summarises bench/results/core.json: dispatch overhead against the direct
call measured in the same run, and the other core figures, with targets."""
import json
import sys

path = sys.argv[1]
with open(path) as f:
    data = json.load(f)

median = {}
for b in data["benchmarks"]:
    if b.get("aggregate_name") == "median":
        median[b["run_name"].split("/")[0]] = b["real_time"] if b["time_unit"] == "ns" else b["real_time"] * {"us": 1e3, "ms": 1e6}[b["time_unit"]]
    elif "aggregate_name" not in b:
        median.setdefault(b["name"], b["real_time"])

direct = median["BM_DirectCall"]
handle = median["BM_DispatchByHandle"]
name = median["BM_DispatchByName"]
alloc = median["BM_AllocFreeCacheHit"]
stream = median["BM_StreamEnqueueToExecution"]
direct3 = median.get("BM_DirectCallThreeTensors")
handle3 = median.get("BM_DispatchThreeTensorsByHandle")
plan3 = median.get("BM_RunPlanThreeTensors")

rows = [
    ("dispatch overhead, cached op handle", handle - direct, 100.0),
    ("dispatch overhead, by op name", name - direct, 300.0),
    ("allocator alloc+free, cache hit", alloc, 100.0),
]
if direct3 is not None and handle3 is not None:
    rows.insert(1, ("dispatch overhead, 3 tensors, handle", handle3 - direct3, 100.0))
if direct3 is not None and plan3 is not None:
    rows.insert(2, ("dispatch overhead, 3 tensors, call plan", plan3 - direct3, 100.0))
print()
print(f"direct call of the kernel:            {direct:8.1f} ns (baseline, same run)")
print(f"dispatch by handle:                   {handle:8.1f} ns  ({handle / direct:5.1f}x the direct call)")
print(f"dispatch by name:                     {name:8.1f} ns  ({name / direct:5.1f}x the direct call)")
ok = True
for label, value, target in rows:
    verdict = "ok" if value <= target else "MISSED"
    ok = ok and value <= target
    print(f"{label:38s}{value:8.1f} ns  target <= {target:.0f} ns  {verdict}")
print(f"stream enqueue-to-execution latency:  {stream / 1e3:8.2f} us")
summary = {
    "direct_ns": direct,
    "dispatch_overhead_handle_ns": handle - direct,
    "dispatch_overhead_name_ns": name - direct,
    "alloc_free_cache_hit_ns": alloc,
    "dispatch_overhead_three_tensors_handle_ns": (handle3 - direct3) if handle3 is not None else None,
    "dispatch_overhead_three_tensors_plan_ns": (plan3 - direct3) if plan3 is not None else None,
    "stream_enqueue_to_execution_ns": stream,
}
data["npubridge_summary"] = summary
with open(path, "w") as f:
    json.dump(data, f, indent=1)
sys.exit(0)
