"""The timer the Python benchmarks share: median wall time of `reps` runs
after one warm-up run."""
import statistics
import time


def timed(fn, reps=5):
    fn()  # warm-up (and first-call checks)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
