#!/usr/bin/env python3
"""A training script in the seed's form, written without dlprobe in mind: ResNet-50 (the model of
examples/workloads/pytorch_resnet50.py) on a constant input tensor, cudnn.benchmark on, 5 warm-up
and 50 timed steps computing gradients without applying them, and a single line at the end:
"Throughput: X samples/sec". `dlprobe run` must find its throughput and its steady window alone.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "workloads"))
from pytorch_resnet50 import ResNet50  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    model = ResNet50().to(dev)
    x = torch.randn(args.batch, 3, 224, 224, device=dev)
    y = torch.randint(0, 1000, (args.batch,), device=dev)

    def step():
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    print(f"Throughput: {args.batch * args.steps / seconds:.2f} samples/sec")
    return 0


if __name__ == "__main__":
    sys.exit(main())
