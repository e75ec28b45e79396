#!/usr/bin/env python3
"""PyTorch 1.13 baseline for gradwire-bench's ddp.step_ms (bench/ddp_bench.cc).

Two processes join a gloo process group through a TCPStore on 127.0.0.1 and train the
same model the same way as gradwire's side: a 784-1024-1024-1024-10 ReLU MLP
(torch.nn.Sequential of Linear/ReLU) wrapped in torch.nn.parallel.DistributedDataParallel
(bucket_cap_mb BUCKET_MB, otherwise its defaults), batch 64 per rank in float32, seeded
random inputs and labels (different on each rank); each step is
zero_grad(set_to_none=True), forward, cross-entropy, backward (DDP's overlapped
all-reduce), SGD(lr=0.01) step. Rank 0 times every step after WARMUP untimed ones.

  ddp_peer.py THREADS WARMUP STEPS BUCKET_MB

Each rank sets torch.set_num_threads(THREADS) (the caller also sets OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS). Prints one JSON object:
{"torch": version, "seconds": [rank 0's per-step wall times]}, or {"error": "..."}.
"""
import json
import os
import sys
import time
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from two_ranks import run_two_ranks
except Exception as e:  # noqa: BLE001 - any import failure means "unavailable"
    print(json.dumps({"error": "torch unavailable: %s" % e}))
    sys.exit(0)


def worker(rank, port, threads, warmup, steps, bucket_mb, queue):
    world = 2  # run_two_ranks
    torch.set_num_threads(threads)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    sizes = [784, 1024, 1024, 1024, 10]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    model = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=bucket_mb)
    torch.manual_seed(1 + rank)
    x = torch.randn(64, 784)
    y = torch.randint(0, 10, (64,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    dist.barrier()
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    dist.barrier()
    if rank == 0:
        queue.put(seconds)
    dist.destroy_process_group()


def main():
    threads, warmup, steps = (int(a) for a in sys.argv[1:4])
    bucket_mb = float(sys.argv[4])
    run_two_ranks(worker, threads, warmup, steps, bucket_mb)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
