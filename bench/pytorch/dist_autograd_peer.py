#!/usr/bin/env python3
"""PyTorch 1.13 baseline for gradwire-bench's dist_autograd.step_ms and dist_optim.step_ms
(bench/dist_autograd_bench.cc).

Two processes on 127.0.0.1 join torch.distributed.rpc with the TensorPipe backend (8
worker threads). The trainer w0 holds x (NxN float32, requires grad); w1 holds a
weight W (NxN float32, requires grad). Rank 0 times, after WARMUP untimed steps of
each kind, STEPS steps of each kind in BLOCKS alternating blocks:
  - autograd: with dist_autograd.context() as ctx: y = rpc_sync("w1", mm, (x,)) (matmul
    of x with W on w1), loss = y.sum(), dist_autograd.backward(ctx, [loss]),
    dist_autograd.get_gradients(ctx) (the tutorial pattern);
  - optim: the same through rpc_sync("w1", mm_rref, (w_rref, x)), W_rref an RRef made
    with rpc.remote("w1", make_weight) and used through local_value(), plus
    DistributedOptimizer(optim.SGD, [w_rref], lr=0.01).step(ctx) inside the context;
  - rpc_mm: a plain rpc_sync("w1", mm, (x without grad,)), no context (a diagnostic).

  dist_autograd_peer.py THREADS WARMUP STEPS BLOCKS [N]

N (default 256) is the side of x and W.

Each rank sets torch.set_num_threads(THREADS) (the caller also sets OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS). Rank 0 checks x's gradient and, at the end, W against the SGD
steps taken. Prints one JSON object:
{"torch": version, "seconds": [median autograd step, median optim step, median rpc_mm]}
or {"error": "..."} when torch is unavailable.

mm, mm_rref and make_weight live at module level: the callee finds them by name (pickled
as __main__.*; both ranks are forked from this script).
"""
import json
import os
import statistics
import sys
import time

try:
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    from torch.distributed.optim import DistributedOptimizer
    from two_ranks import run_two_ranks
except Exception as e:  # noqa: BLE001 - any import failure means "unavailable"
    print(json.dumps({"error": "torch unavailable: %s" % e}))
    sys.exit(0)

N = 256
LR = 0.01
WEIGHT = None  # w1's weight for mm, set before init_rpc


def make_weight():
    gen = torch.Generator().manual_seed(2)
    return torch.randn(N, N, generator=gen).requires_grad_(True)


def mm(x):
    return torch.matmul(x, WEIGHT)


def mm_rref(w_rref, x):
    return torch.matmul(x, w_rref.local_value())


def worker(rank, port, threads, warmup, steps, blocks, queue):
    global WEIGHT
    torch.set_num_threads(threads)
    if rank == 1:
        WEIGHT = make_weight()
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=120,
                                           init_method="tcp://127.0.0.1:%d" % port)
    rpc.init_rpc("w%d" % rank, rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(N, N, generator=gen).requires_grad_(True)
        x_plain = x.detach()
        w_rref = rpc.remote("w1", make_weight)
        opt = DistributedOptimizer(torch.optim.SGD, [w_rref], lr=LR)
        optim_steps = [0]

        def autograd_step():
            with dist_autograd.context() as ctx:
                y = rpc.rpc_sync("w1", mm, args=(x,))
                loss = y.sum()
                dist_autograd.backward(ctx, [loss])
                return dist_autograd.get_gradients(ctx)[x]

        def optim_step():
            with dist_autograd.context() as ctx:
                y = rpc.rpc_sync("w1", mm_rref, args=(w_rref, x))
                loss = y.sum()
                dist_autograd.backward(ctx, [loss])
                g = dist_autograd.get_gradients(ctx)[x]
                opt.step(ctx)
                optim_steps[0] += 1
                return g

        def rpc_mm():
            return rpc.rpc_sync("w1", mm, args=(x_plain,))

        for _ in range(warmup):
            autograd_step()
            optim_step()
            rpc_mm()
        want = torch.ones(N, N) @ make_weight().detach().t()
        if not torch.allclose(autograd_step(), want, rtol=1e-4, atol=1e-3):
            raise RuntimeError("dist_autograd peer: wrong gradient of x")
        kinds = [autograd_step, optim_step, rpc_mm]
        times = [[] for _ in kinds]
        for _ in range(blocks):
            for k, fn in enumerate(kinds):
                for _ in range(steps // blocks):
                    start = time.perf_counter()
                    fn()
                    times[k].append(time.perf_counter() - start)
        # grad W = x^T 1 whatever W is, so plain SGD moved W by -lr * steps * x^T 1.
        moved = make_weight().detach() - LR * optim_steps[0] * (x_plain.t() @ torch.ones(N, N))
        if not torch.allclose(w_rref.to_here(), moved, rtol=1e-4, atol=1e-2):
            raise RuntimeError("dist_autograd peer: W is not where the SGD steps put it")
        queue.put([statistics.median(t) for t in times])
    rpc.shutdown()


def main():
    global N
    threads, warmup, steps, blocks = (int(a) for a in sys.argv[1:5])
    if len(sys.argv) > 5:
        N = int(sys.argv[5])  # before the ranks are forked: both see it
    run_two_ranks(worker, threads, warmup, steps, blocks)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
