#!/usr/bin/env python3
"""PyTorch 1.13 baseline for gradwire-bench's store figures.

Runs one workload against torch.distributed.TCPStore, shaped exactly like gradwire's
(bench/store_bench.cc), and prints one JSON object: {"torch": version, "seconds": [...]}
with the wall time of each round, or {"error": "..."} when torch is unavailable.

  store_peer.py set_get ITERS ROUNDS          one client, ITERS sequential set+get
  store_peer.py clients PROCS ITERS ROUNDS    PROCS client processes, ITERS set+get each
  store_peer.py add PROCS ITERS ROUNDS        PROCS processes, ITERS add(key, 1) each
  store_peer.py barrier CLIENTS ROUNDS        CLIENTS clients (threads) connect + barrier
"""
import json
import multiprocessing as mp
import sys
import threading
import time
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
except Exception as e:  # noqa: BLE001 - any import failure means "unavailable"
    print(json.dumps({"error": "torch unavailable: %s" % e}))
    sys.exit(0)

HOST = "127.0.0.1"
TIMEOUT = timedelta(seconds=120)


def master():
    store = dist.TCPStore(HOST, 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
    return store, store.port


def client(port):
    return dist.TCPStore(HOST, port, is_master=False, timeout=TIMEOUT)


def store_barrier(store, key, n):
    # The same barrier gradwire's barrier() runs: count in, the last one marks done.
    if store.add(key, 1) == n:
        store.set(key + "/done", "1")
    store.wait([key + "/done"])


def set_get(iters, rounds):
    _server, port = master()
    c = client(port)
    value = b"x" * 16
    seconds = []
    for r in range(rounds + 1):  # round 0 warms up
        start = time.perf_counter()
        for i in range(iters):
            key = "k%d" % (i % 64)
            c.set(key, value)
            c.get(key)
        if r > 0:
            seconds.append(time.perf_counter() - start)
    return seconds


def _worker(port, tag, procs, iters, kind, rank):
    s = client(port)
    store_barrier(s, tag + "/start", procs + 1)
    if kind == "clients":
        value = b"x" * 16
        for i in range(iters):
            key = "r%d/k%d" % (rank, i % 64)
            s.set(key, value)
            s.get(key)
    else:
        for _ in range(iters):
            s.add(tag + "/counter", 1)
    if s.add(tag + "/finished", 1) == procs:
        s.set(tag + "/all_finished", "1")


def multi(kind, procs, iters, rounds):
    server, port = master()
    ctx = mp.get_context("fork")
    seconds = []
    for r in range(rounds + 1):
        tag = "round%d" % r
        ps = [ctx.Process(target=_worker, args=(port, tag, procs, iters, kind, i))
              for i in range(procs)]
        for p in ps:
            p.start()
        # The clock starts when the last worker has connected and the barrier opens.
        if server.add(tag + "/start", 1) == procs + 1:
            server.set(tag + "/start/done", "1")
        server.wait([tag + "/start/done"])
        start = time.perf_counter()
        server.wait([tag + "/all_finished"])
        elapsed = time.perf_counter() - start
        for p in ps:
            p.join()
        if kind == "add" and int(server.get(tag + "/counter")) != procs * iters:
            raise RuntimeError("lost adds")
        if r > 0:
            seconds.append(elapsed)
    return seconds


def barrier(clients, rounds):
    seconds = []
    for r in range(rounds + 1):
        server, port = master()
        errors = []

        def run():
            try:
                s = client(port)
                store_barrier(s, "b", clients)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(str(e))

        threads = [threading.Thread(target=run) for _ in range(clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        if errors:
            raise RuntimeError(errors[0])
        if r > 0:
            seconds.append(elapsed)
        del server
    return seconds


def main(argv):
    kind = argv[1]
    if kind == "set_get":
        seconds = set_get(int(argv[2]), int(argv[3]))
    elif kind in ("clients", "add"):
        seconds = multi(kind, int(argv[2]), int(argv[3]), int(argv[4]))
    elif kind == "barrier":
        seconds = barrier(int(argv[2]), int(argv[3]))
    else:
        raise SystemExit("unknown workload " + kind)
    print(json.dumps({"torch": torch.__version__, "seconds": seconds}))


if __name__ == "__main__":
    try:
        main(sys.argv)
    except Exception as e:  # noqa: BLE001 - the bench reports it as unavailable
        print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}))
