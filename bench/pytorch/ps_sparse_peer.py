#!/usr/bin/env python3
"""PyTorch 1.13 baseline for gradwire-bench's ps.sparse_vs_pytorch (bench/ps_sparse_bench.cc):
a parameter server holding a large embedding table with sparse gradients.

1 + TRAINERS processes on 127.0.0.1 join torch.distributed.rpc with the TensorPipe backend
(POOL worker threads each). "ps" (rank 0) holds one model per entry of ROWS
(comma-separated row counts), each:
    table = nn.EmbeddingBag(rows, 64, mode="sum", sparse=True)   # N(0, 1), seeded
    head  = nn.Linear(64, 2)
    forward(ids [256, 4]) = F.linear(table(ids), head.weight.clone(), head.bias.clone())
The head is used through a copy of its parameters taken at the forward's start (the
gradient reaches the parameters through the copy), as gradwire's side does: with two
trainers an optimizer step may otherwise change the head between another trainer's
forward and its backward. The table is used directly: its backward does not keep it.

Each trainer "trainer1".."trainerT":
  - gets an RRef to each model with rpc.remote("ps", get_model, args=(i,)) and its
    parameters' RRefs (model_rref.rpc_sync().parameter_rrefs());
  - builds one DistributedOptimizer(torch.optim.Adagrad, lr=0.1) per model;
  - makes BATCHES batches per model of 256 samples: a label y in {0, 1}, and 4 ids drawn
    uniformly from the model's hot rows whose parity is y (a row's class is its parity).
    The hot set is 8192 rows, one at a pseudo-random place in each of 8192 equal stretches
    of the table, so a batch touches about 970 distinct rows at every table size;
  - steps:
        with dist_autograd.context() as ctx:
            logits = model_rref.rpc_sync().forward(ids)
            loss = F.cross_entropy(logits, y)
            dist_autograd.backward(ctx, [loss])
            opt.step(ctx)
        loss.item()
  - runs WARMUP untimed steps on each model, then BLOCKS rounds in which, for each model
    in turn, the trainers meet at a barrier and time BLOCK_STEPS steps each, one by one.

  ps_sparse_peer.py THREADS POOL TRAINERS WARMUP BLOCKS BLOCK_STEPS BATCHES ROWS

Each process sets torch.set_num_threads(THREADS) (the caller also sets OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS). Each trainer checks, per model, that its loss went down (the mean
over its last 8 timed steps below that over its first 8 warm-up steps). Prints one JSON
object:
{"torch": version, "seconds": [median step for each entry of ROWS...]}
where a median step is the median over the trainers of their median timed step, or
{"error": "..."} when torch is unavailable or a process failed.

The models and get_model live at module level: the callee finds get_model by name (pickled
as __main__.get_model; every process is forked from this script).
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

DIM = 64
CLASSES = 2
BAG = 4
BATCH = 256
HOT = 8192
LR = 0.1
CHECK = 8  # steps averaged at each end for the loss check
MODELS = []  # the ps process's models, made before init_rpc


class SparseModel(torch.nn.Module):
    def __init__(self, rows, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.table = torch.nn.EmbeddingBag(rows, DIM, mode="sum", sparse=True)
        self.head = torch.nn.Linear(DIM, CLASSES)

    def forward(self, ids):
        h = self.table(ids)
        return F.linear(h, self.head.weight.clone(), self.head.bias.clone())

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]


def get_model(i):
    return MODELS[i]


def hot_rows(rows, gen):
    # One row at a pseudo-random place in each of HOT equal stretches of the table.
    starts = (torch.arange(HOT, dtype=torch.int64) * rows) // HOT
    ends = (torch.arange(1, HOT + 1, dtype=torch.int64) * rows) // HOT
    offsets = (torch.rand(HOT, generator=gen, dtype=torch.float64) *
               (ends - starts).to(torch.float64)).to(torch.int64)
    return starts + offsets


def make_batches(rows, count, gen):
    hot = hot_rows(rows, gen)
    by_class = [hot[hot % 2 == c] for c in range(CLASSES)]
    batches = []
    for _ in range(count):
        y = torch.randint(0, CLASSES, (BATCH,), generator=gen)
        ids = torch.empty(BATCH, BAG, dtype=torch.int64)
        for c in range(CLASSES):
            pick = torch.randint(0, len(by_class[c]), (BATCH, BAG), generator=gen)
            ids = torch.where((y == c).unsqueeze(1), by_class[c][pick], ids)
        batches.append((ids, y))
    return batches


def worker(rank, port, args, barrier, queue):
    try:
        train(rank, port, args, barrier, queue)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which prints it
        if rank > 0:
            barrier.abort()  # the other trainer stops waiting and reports too
            queue.put("trainer%d: %s" % (rank, e))
        raise


def train(rank, port, args, barrier, queue):
    threads, pool, trainers, warmup, blocks, block_steps, batches, rows = args
    torch.set_num_threads(threads)
    if rank == 0:
        for i, r in enumerate(rows):
            MODELS.append(SparseModel(r, 1 + i))
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=pool, rpc_timeout=120,
                                           init_method="tcp://127.0.0.1:%d" % port)
    name = "ps" if rank == 0 else "trainer%d" % rank
    rpc.init_rpc(name, rank=rank, world_size=1 + trainers, rpc_backend_options=opts)
    if rank > 0:
        gen = torch.Generator().manual_seed(100 + rank)
        models, optims, data = [], [], []
        for i, r in enumerate(rows):
            model = rpc.remote("ps", get_model, args=(i,))
            models.append(model)
            optims.append(DistributedOptimizer(torch.optim.Adagrad,
                                               model.rpc_sync().parameter_rrefs(), lr=LR))
            data.append(make_batches(r, batches, gen))

        def step(m, i):
            ids, y = data[m][i % batches]
            with dist_autograd.context() as ctx:
                logits = models[m].rpc_sync().forward(ids)
                loss = F.cross_entropy(logits, y)
                dist_autograd.backward(ctx, [loss])
                optims[m].step(ctx)
            return loss.item()

        first = [[step(m, i) for i in range(warmup)][:CHECK] for m in range(len(rows))]
        times = [[] for _ in rows]
        losses = [[] for _ in rows]
        for b in range(blocks):
            for m in range(len(rows)):
                barrier.wait(timeout=120)
                for i in range(block_steps):
                    t = time.perf_counter()
                    losses[m].append(step(m, warmup + b * block_steps + i))
                    times[m].append(time.perf_counter() - t)
        for m, r in enumerate(rows):
            before, after = statistics.mean(first[m]), statistics.mean(losses[m][-CHECK:])
            if after >= before:
                raise RuntimeError("ps sparse peer: trainer%d's loss at %d rows did not go "
                                   "down (%g -> %g)" % (rank, r, before, after))
        queue.put([statistics.median(t) for t in times])
    rpc.shutdown()


def main():
    threads, pool, trainers, warmup, blocks, block_steps, batches = (int(a) for a in sys.argv[1:8])
    rows = [int(r) for r in sys.argv[8].split(",")]
    args = (threads, pool, trainers, warmup, blocks, block_steps, batches, rows)
    ctx = mp.get_context("fork")
    port = free_port()
    barrier = ctx.Barrier(trainers)
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(rank, port, args, barrier, queue))
             for rank in range(1 + trainers)]
    try:
        for p in procs:
            p.start()
        medians = [queue.get(timeout=600) for _ in range(trainers)]
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()
        errors = [m for m in medians if isinstance(m, str)]
        if errors:
            raise RuntimeError(errors[0])
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError("ps sparse peer: a process failed")
    except Exception as e:  # noqa: BLE001 - the figure is still printed, with the reason
        for p in procs:
            if p.is_alive():
                p.terminate()
        print(json.dumps({"error": str(e).replace('"', "'")}))
        return
    seconds = [statistics.median(m[k] for m in medians) for k in range(len(rows))]
    print(json.dumps({"torch": torch.__version__, "seconds": seconds}))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
