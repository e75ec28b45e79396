#!/usr/bin/env python3
"""PyTorch 1.13 baseline for gradwire-bench's rpc figures (bench/rpc_bench.cc).

Two processes on 127.0.0.1 join torch.distributed.rpc with the TensorPipe backend, and
rank 0 calls rank 1 exactly as gradwire's side does:
  - latency: rpc_sync(torch.add) on two 2-element float32 tensors, LAT_CALLS timed calls
    (after warm-up), each timed on its own: median and 99th percentile;
  - bandwidth: rpc_sync(torch.sum) of a float32 tensor of each size in BW_SIZES (bytes),
    BW_CALLS timed calls per size, median;
  - throughput: ASYNC_CALLS rpc_async(torch.add) calls on 2-element tensors with 64 in
    flight (a sliding window, completed in issue order), total seconds / calls.

  rpc_peer.py LAT_CALLS BW_CALLS ASYNC_CALLS BW_SIZES(comma-separated)

Rank 0 prints one JSON object:
{"torch": version, "seconds": [p50, p99, bw seconds per size..., seconds per async call]}
or {"error": "..."} when torch is unavailable.
"""
import json
import os
import statistics
import sys
import time

try:
    import torch
    import torch.distributed.rpc as rpc
    from two_ranks import run_two_ranks
except Exception as e:  # noqa: BLE001 - any import failure means "unavailable"
    print(json.dumps({"error": "torch unavailable: %s" % e}))
    sys.exit(0)

WINDOW = 64


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def worker(rank, port, lat_calls, bw_calls, async_calls, sizes, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=120,
                                           init_method="tcp://127.0.0.1:%d" % port)
    rpc.init_rpc("w%d" % rank, rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        a = torch.tensor([1.5, -2.0])
        b = torch.tensor([0.25, 4.0])
        for _ in range(200):
            rpc.rpc_sync("w1", torch.add, args=(a, b))
        times = []
        for _ in range(lat_calls):
            start = time.perf_counter()
            rpc.rpc_sync("w1", torch.add, args=(a, b))
            times.append(time.perf_counter() - start)
        out = [statistics.median(times), percentile(times, 0.99)]
        for nbytes in sizes:
            t = torch.ones(nbytes // 4, dtype=torch.float32)
            for _ in range(2):
                rpc.rpc_sync("w1", torch.sum, args=(t,))
            times = []
            for _ in range(bw_calls):
                start = time.perf_counter()
                rpc.rpc_sync("w1", torch.sum, args=(t,))
                times.append(time.perf_counter() - start)
            out.append(statistics.median(times))
        start = time.perf_counter()
        window = []
        for _ in range(async_calls):
            if len(window) == WINDOW:
                window.pop(0).wait()
            window.append(rpc.rpc_async("w1", torch.add, args=(a, b)))
        for f in window:
            f.wait()
        out.append((time.perf_counter() - start) / async_calls)
        queue.put(out)
    rpc.shutdown()


def main():
    lat_calls, bw_calls, async_calls = (int(x) for x in sys.argv[1:4])
    sizes = [int(x) for x in sys.argv[4].split(",")]
    run_two_ranks(worker, lat_calls, bw_calls, async_calls, sizes)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
