#!/usr/bin/env python3
"""PyTorch 1.13 baseline for gradwire-bench's c10d figures (bench/c10d_bench.cc).

Two processes join a gloo process group through a TCPStore on 127.0.0.1 and run
synchronous torch.distributed.all_reduce (sum) on float32 tensors, exactly as gradwire's
side does: for each size, warm-up calls, a barrier, then ITERS timed calls, each timed on
its own.

  allreduce_peer.py ITERS_SPEC

ITERS_SPEC is "bytes:iters,bytes:iters,...". Rank 0 prints one JSON object:
{"torch": version, "seconds": [median seconds per call, one per size, in order]}
or {"error": "..."} when torch is unavailable.
"""
import json
import os
import statistics
import sys
import time
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
    from two_ranks import run_two_ranks
except Exception as e:  # noqa: BLE001 - any import failure means "unavailable"
    print(json.dumps({"error": "torch unavailable: %s" % e}))
    sys.exit(0)


def worker(rank, port, spec, queue):
    world = 2  # run_two_ranks
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    results = []
    for nbytes, iters in spec:
        t = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32)
        for _ in range(max(3, iters // 10)):
            dist.all_reduce(t)
        dist.barrier()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - start)
        results.append(statistics.median(times))
    dist.barrier()
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def main():
    spec = [tuple(int(x) for x in item.split(":")) for item in sys.argv[1].split(",")]
    run_two_ranks(worker, spec)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
