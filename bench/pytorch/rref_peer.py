#!/usr/bin/env python3
"""PyTorch 1.13 baseline for gradwire-bench's rref figures (bench/rref_bench.cc).

Two processes on 127.0.0.1 join torch.distributed.rpc with the TensorPipe backend, and
rank 0 uses rank 1 exactly as gradwire's side does:
  - remote + to_here: rpc.remote("w1", make_small) (a 4-element float32 tensor kept on
    w1) followed by .to_here(), the RRef dropped each time; REMOTE_CALLS timed iterations
    after warm-up, each timed on its own: median and 99th percentile;
  - proxy calls: one Counter created on w1 with rpc.remote, then PROXY_CALLS
    rref.rpc_async().add(1) calls with 64 in flight (a sliding window, completed in issue
    order), total seconds / calls.

  rref_peer.py REMOTE_CALLS PROXY_CALLS

Rank 0 prints one JSON object:
{"torch": version, "seconds": [p50, p99, seconds per proxy call]}
or {"error": "..."} when torch is unavailable.

make_small and Counter live at module level: the callee finds them by name (pickled as
__main__.make_small / __main__.Counter; both ranks are forked from this script).
"""
import json
import os
import statistics
import sys
import threading
import time

try:
    import torch
    import torch.distributed.rpc as rpc
    from two_ranks import run_two_ranks
except Exception as e:  # noqa: BLE001 - any import failure means "unavailable"
    print(json.dumps({"error": "torch unavailable: %s" % e}))
    sys.exit(0)

WINDOW = 64


def make_small():
    return torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float32)


class Counter:
    """What gradwire's side registers: add(n) returns the new total. Calls run
    concurrently on the owner's RPC threads, so the update is locked."""

    def __init__(self, start):
        self.value = start
        self.lock = threading.Lock()

    def add(self, n):
        with self.lock:
            self.value += n
            return self.value

    def get(self):
        with self.lock:
            return self.value


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def worker(rank, port, remote_calls, proxy_calls, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=120,
                                           init_method="tcp://127.0.0.1:%d" % port)
    rpc.init_rpc("w%d" % rank, rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        expected = make_small()
        for _ in range(200):
            r = rpc.remote("w1", make_small)
            r.to_here()
            del r
        times = []
        for _ in range(remote_calls):
            start = time.perf_counter()
            r = rpc.remote("w1", make_small)
            r.to_here()
            del r
            times.append(time.perf_counter() - start)
        if not torch.equal(rpc.remote("w1", make_small).to_here(), expected):
            raise RuntimeError("rref peer: wrong value from to_here")
        out = [statistics.median(times), percentile(times, 0.99)]

        counter = rpc.remote("w1", Counter, args=(0,))
        for _ in range(200):
            counter.rpc_async().add(1).wait()
        start = time.perf_counter()
        window = []
        for _ in range(proxy_calls):
            if len(window) == WINDOW:
                window.pop(0).wait()
            window.append(counter.rpc_async().add(1))
        for f in window:
            f.wait()
        out.append((time.perf_counter() - start) / proxy_calls)
        if counter.rpc_sync().get() != 200 + proxy_calls:
            raise RuntimeError("rref peer: lost proxy calls")
        del counter
        queue.put(out)
    rpc.shutdown()


def main():
    remote_calls, proxy_calls = (int(x) for x in sys.argv[1:3])
    run_two_ranks(worker, remote_calls, proxy_calls)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
