"""torch.distributed on npu against Gloo on the CPU, 2 ranks on loopback, in one run.

1. allreduce bus bandwidth (nccl-tests' busbw = 2 (n-1)/n * bytes / time), fp32, 1 KB .. 256 MB:
   the "npu" backend on npu tensors against Gloo on CPU tensors, the two interleaved sample by sample
   so that the machine's noise falls on both; the ratio npu/gloo per size (target >= 0.8 from 1 MB).
2. DDP step time of train_demo.py's model family, widened (see `wide_model`): 1 rank on the whole
   batch against 2 ranks on half of it each (same global batch), and DDP's bucketed allreduce
   during backward against a baseline that waits for all communication at the end (backward under
   no_sync(), then one allreduce of all gradients flattened into one buffer, then the step): the
   overlap fraction is the part of that allreduce's time DDP hides behind the backward.

Usage: bench_dist.py [OUT.json] [--quick]. Each rank is a process started with the "spawn" method,
one compute thread per rank (torch.set_num_threads(1), NPUB_SIM_THREADS=1), GLOO_SOCKET_IFNAME=lo.
Nothing is asserted on speed: misses are reported.
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time

WORLD = 2
TARGET_RATIO = 0.8  # npu busbw / gloo busbw, from 1 MB up (issue #17)
TARGET_FROM = 1 << 20
FULL_SIZES = [1 << k for k in range(10, 29, 2)]  # 1 KB, 4 KB, ..., 256 MB
QUICK_SIZES = [4 << 10, 1 << 20, 4 << 20]
HIDDEN, DEPTH, GLOBAL_BATCH, BUCKET_MB = 1024, 3, 512, 4


def wide_model(hidden=HIDDEN, depth=DEPTH):
    """train_demo.py's Linear(16, h) - LayerNorm - GELU - Linear(h, 4), widened to h = 1024 with
    `depth` Linear(h, h) - LayerNorm - GELU blocks in the middle, so that the gradients (12.1 MB)
    fill several DDP buckets and their allreduce takes visible time."""
    import torch
    layers = [torch.nn.Linear(16, hidden), torch.nn.LayerNorm(hidden), torch.nn.GELU()]
    for _ in range(depth):
        layers += [torch.nn.Linear(hidden, hidden), torch.nn.LayerNorm(hidden), torch.nn.GELU()]
    layers.append(torch.nn.Linear(hidden, 4))
    return torch.nn.Sequential(*layers)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Ranks:
    """What every measurement needs: the control group (plain Gloo, for barriers and for
    gathering the samples, so that the backend under test carries only what is measured),
    the device, and a device sync."""

    def __init__(self, rank, have_npu):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.rank, self.have_npu = torch, dist, rank, have_npu
        self.ctrl = dist.new_group(backend="gloo")
        self.device = f"npu:{torch.npu.current_device()}" if have_npu else "cpu"
        self.nocheck = None
        if have_npu:
            # NPUB_DIST_CHECK is read when a group's backend is built.
            saved = os.environ.get("NPUB_DIST_CHECK")
            os.environ["NPUB_DIST_CHECK"] = "0"
            self.nocheck = dist.new_group(backend="npu")
            if saved is None:
                del os.environ["NPUB_DIST_CHECK"]
            else:
                os.environ["NPUB_DIST_CHECK"] = saved

    def sync(self, device):
        if device != "cpu":
            self.torch.npu.synchronize()

    def barrier(self):
        self.dist.barrier(group=self.ctrl)

    def slowest(self, samples):
        """Per sample, the slowest rank's time (a collective ends when its last rank does)."""
        t = self.torch.tensor(samples, dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.ctrl)
        return t.tolist()

    def timed(self, fn, device):
        """One sample: ranks aligned by a barrier, then fn until its work is done on the device."""
        self.barrier()
        t = time.perf_counter()
        fn()
        self.sync(device)
        return time.perf_counter() - t


def _reps_per_sample(nbytes):
    # Small messages are latency-bound (tens of microseconds): several per sample keep the
    # barrier's skew and the timer's resolution out of the figure.
    return max(1, min(32, (1 << 20) // nbytes))


def _iters(nbytes, quick):
    if quick:
        return 3
    return 21 if nbytes <= (1 << 20) else 15 if nbytes <= (16 << 20) else 9


def bench_allreduce(r, sizes, quick):
    """Per size: Gloo on CPU tensors (the default group's cpu:gloo), the npu backend on npu tensors
    (the default group's npu:npu, as users get it), and the npu backend on a group made with
    NPUB_DIST_CHECK=0 (no cross-rank signature check: what that check costs)."""
    torch, dist = r.torch, r.dist
    backends = [("gloo", "cpu", None)]
    if r.have_npu:
        backends += [("npu", r.device, None), ("npu_nocheck", r.device, r.nocheck)]
    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        bufs = {name: torch.zeros(n, device=dev) for name, dev, _ in backends}
        reps, iters = _reps_per_sample(nbytes), _iters(nbytes, quick)

        def run(name, group):
            for _ in range(reps):
                dist.all_reduce(bufs[name], group=group)
        samples = {name: [] for name, _, _ in backends}
        for name, dev, group in backends:  # warm-up: first-call set-up, staging buffers
            r.timed(lambda: run(name, group), dev)
        for it in range(iters):
            # Interleaved, and the order turns every sample, so that no side always runs right
            # after the same other one (caches, the scheduler) or always first.
            k = it % len(backends)
            for name, dev, group in backends[k:] + backends[:k]:
                samples[name].append(r.timed(lambda: run(name, group), dev) / reps)
        row = {"bytes": nbytes, "reps_per_sample": reps, "samples": iters}
        for name, dev, group in backends:
            # Correctness on the side: rank + 1 summed over the ranks is exact in fp32.
            bufs[name].fill_(r.rank + 1)
            dist.all_reduce(bufs[name], group=group)
            got = bufs[name][[0, n // 2, n - 1]].cpu().tolist()
            want = WORLD * (WORLD + 1) / 2
            if got != [want] * 3:
                raise AssertionError(f"allreduce {name} {nbytes} B: got {got}, expected {want}")
            samples[name] = r.slowest(samples[name])
            t = statistics.median(samples[name])
            row[f"{name}_us"] = t * 1e6
            row[f"{name}_busbw_GBps"] = 2 * (WORLD - 1) / WORLD * nbytes / t / 1e9
        if r.have_npu:
            # The ratio of busbw is gloo's time over npu's; taken per sample (the two ran next to
            # each other) and then the median, so that the load's drift over the run cancels.
            for name, key in (("npu", "ratio"), ("npu_nocheck", "ratio_nocheck")):
                row[key] = statistics.median(g / t for g, t in zip(samples["gloo"], samples[name]))
            row["target"] = TARGET_RATIO if nbytes >= TARGET_FROM else None
            row["verdict"] = ("pass" if row["ratio"] >= TARGET_RATIO else "miss") if row["target"] else "n/a"
        rows.append(row)
        del bufs
    return rows


class _Trainer:
    """One model (DDP-wrapped when ddp) and its data on one device; the step variants time the
    same forward, loss, backward and AdamW step."""

    def __init__(self, r, device, batch, ddp):
        torch = r.torch
        self.r, self.device, self.torch = r, device, torch
        torch.manual_seed(0)
        model = wide_model().to(device)
        if ddp:
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, bucket_cap_mb=BUCKET_MB)
        self.model = model
        self.params = [p for p in model.parameters()]
        self.opt = torch.optim.AdamW(self.params, lr=1e-3)
        g = torch.Generator().manual_seed(1 + r.rank)
        self.x = torch.randn(batch, 16, generator=g).to(device)
        self.y = torch.randint(0, 4, (batch,), generator=g).to(device)

    def _forward_backward(self):
        loss = self.torch.nn.functional.cross_entropy(self.model(self.x), self.y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()

    def step(self):
        """Plain step; under DDP its buckets are allreduced while backward runs."""
        self._forward_backward()
        self.opt.step()

    def compute_only(self):
        """No communication at all: what the 2-rank step would cost on a free network."""
        with self.model.no_sync():
            self._forward_backward()
        self.opt.step()

    def step_comm_at_end(self, comm_times):
        """Backward under no_sync(), then every gradient in one flat buffer, one allreduce, the
        average copied back, then the step: all communication exposed. The allreduce's own time
        (cat, collective, copy-back, from a synced device) goes to comm_times."""
        torch, dist = self.torch, self.r.dist
        with self.model.no_sync():
            self._forward_backward()
        self.r.sync(self.device)
        t = time.perf_counter()
        grads = [p.grad for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat.div_(WORLD)
        for g, v in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(v.view_as(g))
        self.r.sync(self.device)
        comm_times.append(time.perf_counter() - t)
        self.opt.step()


def bench_ddp(r, device, quick):
    """Times on rank 0's clock of the slowest rank. The 1-rank step runs on rank 0 alone while
    rank 1 waits in a barrier (blocked on a socket, not computing), interleaved with the 2-rank
    variants."""
    one = _Trainer(r, device, GLOBAL_BATCH, ddp=False) if r.rank == 0 else None
    two = _Trainer(r, device, GLOBAL_BATCH // WORLD, ddp=True)
    warm, iters = (2, 3) if quick else (3, 21)
    comm = []
    variants = {
        "ddp": two.step,
        "comm_at_end": lambda: two.step_comm_at_end(comm),
        "compute_only": two.compute_only,
    }
    samples = {k: [] for k in ["one_rank", *variants]}

    def one_rank():
        if one is not None:
            t = time.perf_counter()
            one.step()
            r.sync(device)
            samples["one_rank"].append(time.perf_counter() - t)
        r.barrier()
    for it in range(warm + iters):
        one_rank()
        keep = []
        names = list(variants) if it % 2 == 0 else list(variants)[::-1]
        for name in names:
            keep.append((name, r.timed(variants[name], device)))
        if it >= warm:
            for name, t in keep:
                samples[name].append(t)
        else:
            comm.clear()
            samples["one_rank"].clear()
    # one_rank samples exist on rank 0 only: broadcast them through the MAX (rank 1 sends zeros).
    res = {"device": device, "backend": "npu" if device != "cpu" else "gloo"}
    ones = samples["one_rank"] if r.rank == 0 else [0.0] * iters
    res["one_rank_ms"] = statistics.median(r.slowest(ones)) * 1e3
    for name in variants:
        res[f"{name}_ms"] = statistics.median(r.slowest(samples[name])) * 1e3
    res["comm_at_end_allreduce_ms"] = statistics.median(r.slowest(comm)) * 1e3
    hidden = res["comm_at_end_ms"] - res["ddp_ms"]
    res["overlap_fraction"] = hidden / res["comm_at_end_allreduce_ms"]
    res["ddp_exposed_comm_ms"] = res["ddp_ms"] - res["compute_only_ms"]
    res["speedup_2_over_1"] = res["one_rank_ms"] / res["ddp_ms"]
    # What the 2 ranks' compute alone gains over 1 rank (2.0 on 2 free cores): the ceiling of the
    # speedup, which the ranks' competition for the cores (with each other, with their
    # communication threads, with the rest of the machine) lowers before any communication does.
    res["compute_scaling_2_over_1"] = res["one_rank_ms"] / res["compute_only_ms"]
    res["gradient_bytes"] = sum(p.numel() * p.element_size() for p in two.params)
    res["buckets_mb"] = BUCKET_MB
    return res


def _rank_main(rank, port, quick, sizes, ddp, out_path):
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(1)
    import npubridge  # noqa: F401  (registers the "npu" device, and the "npu" backend where built)
    import torch.distributed as dist
    have_npu = "npu" in dist.Backend.backend_list
    if have_npu:
        torch.npu.set_device(rank % torch.npu.device_count())
    dist.init_process_group("cpu:gloo,npu:npu" if have_npu else "gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=120))
    r = _Ranks(rank, have_npu)
    out = {"allreduce": bench_allreduce(r, sizes or (QUICK_SIZES if quick else FULL_SIZES), quick), "ddp": []}
    if have_npu and ddp:
        out["ddp"].append(bench_ddp(r, r.device, quick))
    if ddp and (not quick or not have_npu):
        out["ddp"].append(bench_ddp(r, "cpu", quick))  # the same on CPU tensors with Gloo, for reference
    dist.destroy_process_group()
    if rank == 0:
        out["have_npu_backend"] = have_npu
        with open(out_path, "w") as f:
            json.dump(out, f)


def _print_table(res):
    c = res["config"]
    print(f"{c['world_size']} ranks on loopback (GLOO_SOCKET_IFNAME=lo), spawn, one compute thread per rank "
          f"(torch.set_num_threads(1), NPUB_SIM_THREADS=1), fp32; {c['machine_cpus']} CPUs; "
          f"median of the slowest rank's time per sample")
    if not res["have_npu_backend"]:
        print("the npu backend is not built/registered: Gloo on CPU tensors only")
    print("\nallreduce (busbw = 2(n-1)/n * bytes / time): gloo = Gloo on CPU tensors; npu = the npu backend on npu"
          "\ntensors (the default group, with its cross-rank signature check); no-check = a group made with"
          " NPUB_DIST_CHECK=0;\nnpu/gloo = the median of the per-sample ratios of busbw (samples taken side by side)")
    print(f"{'size':>8} {'gloo us':>10} {'gloo GB/s':>10} {'npu us':>10} {'npu GB/s':>9} {'npu/gloo':>9}  "
          f"{'target':16} {'no-check us':>11} {'npu/gloo':>9}")
    for row in res["allreduce"]:
        b = row["bytes"]
        size = f"{b >> 20} MB" if b >= 1 << 20 else f"{b >> 10} KB"
        line = f"{size:>8} {row['gloo_us']:10.1f} {row['gloo_busbw_GBps']:10.3f}"
        if "npu_us" in row:
            tgt = f">= {row['target']}: {row['verdict']}" if row["target"] else "-"
            line += (f" {row['npu_us']:10.1f} {row['npu_busbw_GBps']:9.3f} {row['ratio']:9.2f}  {tgt:16}"
                     f" {row['npu_nocheck_us']:11.1f} {row['ratio_nocheck']:9.2f}")
        print(line)
    for d in res["ddp"]:
        print(f"\nDDP step, {d['backend']} on {d['device']}: wide_model(hidden {HIDDEN}, {DEPTH} hidden blocks), "
              f"{d['gradient_bytes'] / 2**20:.1f} MB of fp32 gradients, AdamW, global batch {GLOBAL_BATCH} "
              f"(2 ranks x {GLOBAL_BATCH // WORLD}), bucket_cap_mb={d['buckets_mb']}")
        rows = [(f"1 rank, batch {GLOBAL_BATCH}", d["one_rank_ms"], ""),
                ("2 ranks, DDP (allreduce overlapped with backward)", d["ddp_ms"],
                 f"speedup over 1 rank {d['speedup_2_over_1']:.2f}x"),
                ("2 ranks, comm at end (no_sync, 1 flat allreduce)", d["comm_at_end_ms"],
                 f"of which the allreduce {d['comm_at_end_allreduce_ms']:.1f} ms"),
                ("2 ranks, compute only (no communication)", d["compute_only_ms"],
                 f"1 rank / this {d['compute_scaling_2_over_1']:.2f}x (2.0 on 2 free cores)")]
        for label, ms, note in rows:
            print(f"  {label:50} {ms:8.1f} ms   {note}")
        print(f"  overlap: DDP hides {d['overlap_fraction'] * 100:.0f}% of the allreduce time "
              f"((comm at end - DDP) / its allreduce, which counts the flattening and copy-back);\n"
              f"  DDP's exposed communication {d['ddp_exposed_comm_ms']:.1f} ms (DDP - compute only)")


def _parse_sizes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = []
    for item in text.split(","):
        item = item.strip().upper().removesuffix("B")
        n = int(item[:-1]) * units[item[-1]] if item and item[-1] in units else int(item)
        if n < 4 or n % 4:
            raise argparse.ArgumentTypeError(f"--sizes: {item}: expected a multiple of 4 bytes (fp32)")
        out.append(n)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", default="dist.json", help="JSON file to write")
    ap.add_argument("--quick", action="store_true", help="a few sizes, few iterations (smoke run)")
    ap.add_argument("--sizes", type=_parse_sizes, default=None,
                    help="allreduce sizes instead of the default ones, e.g. 64K,1M,256M")
    ap.add_argument("--no-ddp", dest="ddp", action="store_false", help="allreduce only")
    args = ap.parse_args()
    # Inherited by the spawned ranks, read at their imports.
    os.environ.update({"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "NPUB_SIM_THREADS": "1",
                       "TORCH_CPP_LOG_LEVEL": "ERROR"})  # DDP warns that it times only CPU and CUDA
    import torch.multiprocessing as mp
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        part = os.path.join(tmp, "rank0.json")
        mp.start_processes(_rank_main, args=(_free_port(), args.quick, args.sizes, args.ddp, part), nprocs=WORLD, join=True,
                           start_method="spawn")
        with open(part) as f:
            res = json.load(f)
    import torch
    res["config"] = {"world_size": WORLD, "dtype": "float32", "quick": args.quick, "threads_per_rank": 1,
                     "transport": "loopback (GLOO_SOCKET_IFNAME=lo)", "launch": "torch.multiprocessing spawn",
                     "machine_cpus": os.cpu_count(), "torch": torch.__version__,
                     "target": f"npu/gloo busbw >= {TARGET_RATIO} from {TARGET_FROM >> 20} MB",
                     "model": f"wide_model(hidden={HIDDEN}, depth={DEPTH}), AdamW, global batch {GLOBAL_BATCH}",
                     "baseline": "no_sync() backward, then one allreduce of all gradients flattened, then step",
                     "NPUB_DIST_CHECK": os.environ.get("NPUB_DIST_CHECK"),
                     "NPUB_DIST_CHUNK_BYTES": os.environ.get("NPUB_DIST_CHUNK_BYTES"), "wall_s": None}
    res["config"]["wall_s"] = round(time.perf_counter() - t0, 1)
    _print_table(res)
    print(f"\n({res['config']['wall_s']} s)")
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
