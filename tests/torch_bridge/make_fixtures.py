#!/usr/bin/env python3
"""Writes the reference values dist_autograd_test.cc compares gradwire::torch's distributed
autograd and DistributedOptimizer with.

PyTorch 1.13 (Debian 12's python3-torch) runs each case with its own torch.distributed.rpc,
dist_autograd and DistributedOptimizer: worker "w0" is the trainer, "w1" the server, two
processes on 127.0.0.1. Everything is float64. The server's model is
Sequential(Linear(4, 5), Tanh, Linear(5, 3)); parameter number i (in parameters() order)
holds 0.25 * sin(0.9 * k + i + 1) at flat position k. The batch x is 6 x 4 with
x[r][c] = 0.5 * cos(4 * r + c), the labels y = [2, 0, 1, 1, 0, 2]. A trainer leaf of 4
elements (v or e below) holds 0.25 * sin(0.9 * k + 11).

  ps_<optimizer>.txt  two steps: out = server.forward(x), cross_entropy(out, y), backward,
                      DistributedOptimizer step. Lines "grad <step> <param> <values...>"
                      (the server's gradients in the step's context) and
                      "param <step> <param> <values...>" (after the step).
  shared.txt          h = tanh(x * v) sent in two calls: o1 = forward(h), o2 = forward(h),
                      loss = sum(o1 * o2). Lines "v <values>" and "grad <param> <values>".
  chain.txt           the trainer calls the server's relay(x), which calls back the trainer's
                      embed(x) = x * e and returns forward(x * e); loss = 0.5 * sum(out^2).
                      Lines "e <values>" and "grad <param> <values>".
  unused.txt          the trainer sends u = x * v; the server computes h = forward(u), sends
                      h to the trainer in a nested call (kept, never used) and returns h * 3;
                      loss = sum(out^2). PyTorch's dist_autograd (FAST mode) waits for the
                      gradient of the unused send and fails on its rpc timeout (its error is
                      written as a comment); the values are what one PyTorch process computes
                      for the same function (gradwire's exact mode must give them).

Run from the repository root:  /usr/bin/python3 tests/torch_bridge/make_fixtures.py
The tests read the committed files; they never need PyTorch.
"""
import math
import os
import sys

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch.distributed.optim import DistributedOptimizer

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
LABELS = [2, 0, 1, 1, 0, 2]
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "adam": (torch.optim.Adam, dict(lr=0.01)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.1)),
}

MODEL = None
KEPT = []


def make_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    model = model.double()
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            flat = torch.tensor([0.25 * math.sin(0.9 * k + i + 1) for k in range(p.numel())],
                                dtype=torch.float64)
            p.copy_(flat.reshape(p.shape))
    return model


def batch():
    return torch.tensor([[0.5 * math.cos(4 * r + c) for c in range(4)] for r in range(6)],
                        dtype=torch.float64)


def leaf():
    return torch.tensor([0.25 * math.sin(0.9 * k + 11) for k in range(4)], dtype=torch.float64,
                        requires_grad=True)


# ---- what the server (w1) serves
def reset():
    global MODEL
    MODEL = make_model()
    return True


def param_rrefs():
    return [rpc.RRef(p) for p in MODEL.parameters()]


def forward(x):
    return MODEL(x)


def server_grads(ctx_id):
    grads = dist_autograd.get_gradients(ctx_id)
    return [grads[p].clone() if p in grads else None for p in MODEL.parameters()]


def params():
    return [p.detach().clone() for p in MODEL.parameters()]


def relay(x):
    return MODEL(rpc.rpc_sync("w0", embed, args=(x,)))


def share_and_return(u):
    h = MODEL(u)
    rpc.rpc_sync("w0", keep, args=(h,))
    return h * 3.0


# ---- what the trainer (w0) serves
E = None


def embed(x):
    return x * E


def keep(t):
    KEPT.append(t)
    return True


def fmt(values):
    return " ".join(repr(float(v)) for v in values.reshape(-1).tolist())


def header(f, what):
    f.write("# torch %s, float64; written by make_fixtures.py: %s\n" % (torch.__version__, what))


def run_ps(name):
    constructor, options = OPTIMIZERS[name]
    rpc.rpc_sync("w1", reset)
    rrefs = rpc.rpc_sync("w1", param_rrefs)
    opt = DistributedOptimizer(constructor, rrefs, **options)
    x, y = batch(), torch.tensor(LABELS)
    with open(os.path.join(OUT, "ps_%s.txt" % name), "w") as f:
        header(f, "ps, %s%s" % (constructor.__name__, options))
        for step in (1, 2):
            with dist_autograd.context() as ctx:
                out = rpc.rpc_sync("w1", forward, args=(x,))
                loss = torch.nn.functional.cross_entropy(out, y)
                dist_autograd.backward(ctx, [loss])
                for i, g in enumerate(rpc.rpc_sync("w1", server_grads, args=(ctx,))):
                    f.write("grad %d %d %s\n" % (step, i, fmt(g)))
                opt.step(ctx)
            for i, p in enumerate(rpc.rpc_sync("w1", params)):
                f.write("param %d %d %s\n" % (step, i, fmt(p)))


def write_grads(f, ctx):
    for i, g in enumerate(rpc.rpc_sync("w1", server_grads, args=(ctx,))):
        f.write("grad %d %s\n" % (i, fmt(g)))


def run_shared():
    rpc.rpc_sync("w1", reset)
    v = leaf()
    with dist_autograd.context() as ctx, open(os.path.join(OUT, "shared.txt"), "w") as f:
        header(f, "shared")
        h = torch.tanh(batch() * v)
        o1 = rpc.rpc_sync("w1", forward, args=(h,))
        o2 = rpc.rpc_sync("w1", forward, args=(h,))
        dist_autograd.backward(ctx, [(o1 * o2).sum()])
        f.write("v %s\n" % fmt(dist_autograd.get_gradients(ctx)[v]))
        write_grads(f, ctx)


def run_chain():
    global E
    rpc.rpc_sync("w1", reset)
    E = leaf()
    with dist_autograd.context() as ctx, open(os.path.join(OUT, "chain.txt"), "w") as f:
        header(f, "chain")
        out = rpc.rpc_sync("w1", relay, args=(batch(),))
        dist_autograd.backward(ctx, [0.5 * (out * out).sum()])
        f.write("e %s\n" % fmt(dist_autograd.get_gradients(ctx)[E]))
        write_grads(f, ctx)


def run_unused():
    # PyTorch's FAST mode first (it fails on its rpc timeout, set short here).
    rpc.rpc_sync("w1", reset)
    v = leaf()
    outcome = "succeeded"
    with dist_autograd.context() as ctx:
        out = rpc.rpc_sync("w1", share_and_return, args=(batch() * v,))
        try:
            dist_autograd.backward(ctx, [(out * out).sum()])
        except RuntimeError as e:
            outcome = "failed: " + str(e).splitlines()[0][:200]
    # The function itself, in one process.
    model = make_model()
    v = leaf()
    out = model(batch() * v) * 3.0
    (out * out).sum().backward()
    with open(os.path.join(OUT, "unused.txt"), "w") as f:
        header(f, "unused")
        f.write("# PyTorch's dist_autograd on this graph %s\n" % outcome)
        f.write("v %s\n" % fmt(v.grad))
        for i, p in enumerate(model.parameters()):
            f.write("grad %d %s\n" % (i, fmt(p.grad)))


def run(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29541"
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=5,
                                           _transports=["uv"], _channels=["basic"])
    rpc.init_rpc("w%d" % rank, rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        os.makedirs(OUT, exist_ok=True)
        for name in OPTIMIZERS:
            run_ps(name)
        run_shared()
        run_chain()
        run_unused()
    rpc.shutdown()


if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    mp.spawn(run, nprocs=2)
    sys.exit(0)
