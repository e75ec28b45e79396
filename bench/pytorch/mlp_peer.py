#!/usr/bin/env python3
"""PyTorch 1.13 baseline for gradwire-bench's nn.mlp_step_ms (bench/nn_bench.cc).

One training step of the same model, the same way: a 784-1024-1024-1024-10 ReLU MLP
(torch.nn.Sequential of Linear/ReLU), batch 64, float32, seeded random inputs and labels;
zero_grad(set_to_none=True), forward, cross-entropy, backward, SGD(lr=0.01) step.

  mlp_peer.py THREADS WARMUP STEPS

sets torch.set_num_threads(THREADS) (the caller also sets OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS to THREADS in our environment) and prints one JSON object:
{"torch": version, "threads": n, "seconds": [per-step wall times]}, or {"error": "..."}.
"""
import json
import sys
import time

try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means "unavailable"
    print(json.dumps({"error": "torch unavailable: %s" % e}))
    sys.exit(0)


def main():
    threads, warmup, steps = (int(a) for a in sys.argv[1:4])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    sizes = [784, 1024, 1024, 1024, 10]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
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
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "seconds": seconds}))


if __name__ == "__main__":
    main()
