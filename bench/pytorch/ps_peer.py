#!/usr/bin/env python3
"""PyTorch 1.13 baseline for gradwire-bench's ps.samples_per_s and
ps.samples_per_s_trainers (bench/ps_bench.cc): the RPC parameter-server tutorial pattern.

For each trainer count T in TRAINERS (comma-separated), 1 + T processes on 127.0.0.1 join
torch.distributed.rpc with the TensorPipe backend (POOL worker threads each): "ps" (rank
0) holds a ParameterServer, a 784-128-10 ReLU MLP (nn.Linear layers), and trainers
"trainer1".."trainerT" each:
  - get an RRef to it with rpc.remote("ps", get_parameter_server) and its parameters'
    RRefs with ps_rref.rpc_sync().parameter_rrefs();
  - build DistributedOptimizer(optim.SGD, param_rrefs, lr=0.01);
  - make BATCHES random batches of 64 (torch.randn inputs, random labels of 10 classes)
    and cycle through them; each step:
        with dist_autograd.context() as ctx:
            logits = ps_rref.rpc_sync().forward(x)
            loss = F.cross_entropy(logits, y)
            dist_autograd.backward(ctx, [loss])
            opt.step(ctx)
        loss.item()
  - run WARMUP untimed steps, meet the other trainers at a barrier, then time STEPS steps.
The server's forward computes with a copy of the parameters taken at its start (the
gradient reaches the parameters through the copy), exactly as gradwire's side does: with
several trainers an optimizer step may otherwise change a parameter between another
trainer's forward and its backward (docs/parameter-server.md).

  ps_peer.py THREADS POOL WARMUP STEPS BATCHES TRAINERS

Each process sets torch.set_num_threads(THREADS) (the caller also sets OMP_NUM_THREADS
and OPENBLAS_NUM_THREADS). Each trainer checks that its loss went down (the mean over the
last BATCHES timed steps below that over the first BATCHES warm-up steps). Prints one JSON
object:
{"torch": version, "seconds": [window for each T..., median step for each T...]}
in TRAINERS' order, where a window runs from the first trainer's start to the last one's
end (T * STEPS * 64 samples) and a median step is the median over the trainers of their
median timed step, or {"error": "..."} when torch is unavailable.

ParameterServer and get_parameter_server live at module level: the callee finds them by
name (pickled as __main__.*; every process is forked from this script).
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
    import torch.multiprocessing as mp
    import torch.nn.functional as F
    from torch.distributed.optim import DistributedOptimizer
    from two_ranks import free_port
except Exception as e:  # noqa: BLE001 - any import failure means "unavailable"
    print(json.dumps({"error": "torch unavailable: %s" % e}))
    sys.exit(0)

SIZES = (784, 128, 10)
BATCH = 64
LR = 0.01
SERVER = None  # the ps process's ParameterServer, made before init_rpc


class ParameterServer:
    def __init__(self, seed):
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(SIZES[0], SIZES[1]), torch.nn.ReLU(),
                                         torch.nn.Linear(SIZES[1], SIZES[2]))

    def forward(self, x):
        w1, b1, w2, b2 = (p.clone() for p in self.model.parameters())
        return F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.model.parameters()]


def get_parameter_server():
    return SERVER


def worker(rank, port, world, threads, pool, warmup, steps, batches, barrier, queue):
    try:
        train(rank, port, world, threads, pool, warmup, steps, batches, barrier, queue)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which prints it
        if rank > 0:
            barrier.abort()  # the other trainers stop waiting and report too
            queue.put("trainer%d: %s" % (rank, e))
        raise


def train(rank, port, world, threads, pool, warmup, steps, batches, barrier, queue):
    global SERVER
    torch.set_num_threads(threads)
    if rank == 0:
        SERVER = ParameterServer(1)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=pool, rpc_timeout=120,
                                           init_method="tcp://127.0.0.1:%d" % port)
    name = "ps" if rank == 0 else "trainer%d" % rank
    rpc.init_rpc(name, rank=rank, world_size=world, rpc_backend_options=opts)
    if rank > 0:
        gen = torch.Generator().manual_seed(100 + rank)
        xs = [torch.randn(BATCH, SIZES[0], generator=gen) for _ in range(batches)]
        ys = [torch.randint(0, SIZES[-1], (BATCH,), generator=gen) for _ in range(batches)]
        ps_rref = rpc.remote("ps", get_parameter_server)
        opt = DistributedOptimizer(torch.optim.SGD, ps_rref.rpc_sync().parameter_rrefs(), lr=LR)

        def step(i):
            with dist_autograd.context() as ctx:
                logits = ps_rref.rpc_sync().forward(xs[i % batches])
                loss = F.cross_entropy(logits, ys[i % batches])
                dist_autograd.backward(ctx, [loss])
                opt.step(ctx)
            return loss.item()

        first = [step(i) for i in range(warmup)][:batches]
        barrier.wait(timeout=120)
        losses, times = [], []
        start = time.perf_counter()
        for i in range(steps):
            t = time.perf_counter()
            losses.append(step(i))
            times.append(time.perf_counter() - t)
        end = time.perf_counter()
        if statistics.mean(losses[-batches:]) >= statistics.mean(first):
            raise RuntimeError("ps peer: trainer%d's loss did not go down (%g -> %g)" % (
                rank, statistics.mean(first), statistics.mean(losses[-batches:])))
        queue.put((start, end, statistics.median(times)))
    rpc.shutdown()


def run(trainers, threads, pool, warmup, steps, batches):
    ctx = mp.get_context("fork")
    port = free_port()
    world = 1 + trainers
    barrier = ctx.Barrier(trainers)
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(rank, port, world, threads, pool, warmup, steps,
                                              batches, barrier, queue))
             for rank in range(world)]
    for p in procs:
        p.start()
    spans = [queue.get(timeout=300) for _ in range(trainers)]
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.terminate()
    errors = [s for s in spans if isinstance(s, str)]
    if errors:
        raise RuntimeError("ps peer with %d trainers: %s" % (trainers, errors[0]))
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError("ps peer: a process failed with %d trainers" % trainers)
    window = max(e for _, e, _ in spans) - min(s for s, _, _ in spans)
    return window, statistics.median(m for _, _, m in spans)


def main():
    threads, pool, warmup, steps, batches = (int(a) for a in sys.argv[1:6])
    counts = [int(t) for t in sys.argv[6].split(",")]
    try:
        runs = [run(t, threads, pool, warmup, steps, batches) for t in counts]
    except Exception as e:  # noqa: BLE001 - the figure is still printed, with the reason
        print(json.dumps({"error": str(e).replace('"', "'")}))
        return
    seconds = [w for w, _ in runs] + [m for _, m in runs]
    print(json.dumps({"torch": torch.__version__, "seconds": seconds}))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
