#!/usr/bin/env python3
"""Writes the reference values dist_optim_test.cc compares DistributedOptimizer with.

PyTorch 1.13 (Debian 12's python3-torch: scripts/install-deps.sh --bench) runs the same
training as the test, in float64: parameters p1, p2, p3 (make_param in the test), the loss
sum((p1 * x)^2) + sum(p2 * x) with x = [1, -2, 3, 0.5] (p3 gets no gradient, so torch.optim
skips it, state included), one torch.optim step per backward. Each file holds, for every
step, every parameter's values after it:

    <step> <param> <v0> <v1> <v2> <v3>

Run from the repository root:  /usr/bin/python3 tests/dist_optim/make_fixtures.py
The tests read the committed files; they never need PyTorch.
"""
import os

import torch

STEPS = 4
X = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)

# name -> (constructor, options, what the test passes to DistributedOptimizer)
OPTIMIZERS = {
    "sgd_momentum": (torch.optim.SGD,
                     dict(lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True),
                     "SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}"),
    "adam": (torch.optim.Adam, dict(lr=0.01), "AdamOptions{.lr = 0.01}"),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1),
              "AdamWOptions{.lr = 0.01, .weight_decay = 0.1}"),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.1), "AdagradOptions{.lr = 0.1}"),
}


def make_param(seed):
    values = [0.25 * (seed + 1) - 0.1 * i for i in range(4)]
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def run(constructor, options):
    params = [make_param(1), make_param(2), make_param(3)]
    opt = constructor(params, **options)
    rows = []
    for step in range(1, STEPS + 1):
        opt.zero_grad(set_to_none=True)
        p1, p2, _ = params
        a = p1 * X
        loss = (a * a).sum() + (p2 * X).sum()
        loss.backward()
        opt.step()
        for index, p in enumerate(params, start=1):
            rows.append((step, index, p.detach().tolist()))
    return rows


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
    os.makedirs(out_dir, exist_ok=True)
    for name, (constructor, options, cpp) in OPTIMIZERS.items():
        rows = run(constructor, options)
        path = os.path.join(out_dir, name + ".txt")
        with open(path, "w") as f:
            f.write("# torch %s, float64: torch.optim.%s(%s); in the test: %s\n" %
                    (torch.__version__, constructor.__name__,
                     ", ".join("%s=%r" % kv for kv in options.items()), cpp))
            f.write("# loss sum((p1 * x)^2) + sum(p2 * x), x = [1, -2, 3, 0.5]; p3 gets no "
                    "gradient\n")
            f.write("# step param v0 v1 v2 v3 (each parameter after the step)\n")
            for step, index, values in rows:
                f.write("%d %d %s\n" % (step, index, " ".join(repr(v) for v in values)))
        print("wrote", path)


if __name__ == "__main__":
    main()
