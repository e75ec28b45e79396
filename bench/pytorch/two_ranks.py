"""Shared by the two-process PyTorch peers (allreduce_peer.py, rpc_peer.py,
rref_peer.py, ddp_peer.py, dist_autograd_peer.py); ps_peer.py, which starts 1 + T
processes itself, uses only free_port().

run_two_ranks(worker, *args) forks two processes that run
worker(rank, port, *args, queue), where port is a free 127.0.0.1 port for them to meet on
and rank 0 puts its list of timings on queue, then prints the JSON object gradwire-bench
reads: {"torch": version, "seconds": [...]}. Import it only once torch has imported.
"""
import json
import socket

import torch
import torch.multiprocessing as mp


def free_port():
    # Bind port 0 and release it; the peers' store binds it again at once.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run_two_ranks(worker, *args):
    port = free_port()
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(rank, port) + args + (queue,))
             for rank in range(2)]
    for p in procs:
        p.start()
    results = queue.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
    print(json.dumps({"torch": torch.__version__, "seconds": results}))
