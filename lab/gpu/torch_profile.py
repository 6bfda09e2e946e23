#!/usr/bin/env python3
"""Where PyTorch eager spends a ResNet-50 training step (forward + backward, synthetic input on the
GPU, cudnn.benchmark on), by CUDA kernel, grouped into convolution / batch norm / elementwise /
other: the peer figure beside `dlprobe bench --profile` on the same GPU.

    python3 lab/gpu/torch_profile.py --batch 256 --amp fp16 --channels-last
"""
import argparse
import re

import torch
import torch.nn.functional as F
import torchvision
from torch.profiler import ProfilerActivity, profile


def group(name):
    n = name.lower()
    # Batch norm first: cuDNN's batch-norm kernels (cudnn::batchnorm_*) would match the
    # convolutions' "cudnn" below.
    if "batch_norm" in n or "batchnorm" in n or "welford" in n or "bn_" in n:
        return "batch_norm"
    # cuDNN/cutlass convolution kernels, and cuDNN's own helpers around them.
    if re.search(r"conv|wgrad|dgrad|fprop|implicit_gemm|xmma|cutlass|sm90_|cudnn", n):
        return "convolution"
    if re.search(r"elementwise|vectorized|threshold|relu|add|copy|fill|cast", n):
        return "elementwise"
    if "gemm" in n or "matmul" in n:
        return "gemm"
    return "other"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--amp", choices=["none", "fp16", "bf16"], default="fp16")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--tf32", action="store_true")
    p.add_argument("--steps", type=int, default=3, help="profiled steps after 5 warm-up")
    args = p.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = torchvision.models.resnet50().cuda().to(memory_format=fmt)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").to(memory_format=fmt)
    y = torch.randint(0, 1000, (args.batch,), device="cuda")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.amp)

    def step():
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(model(x), y)
        loss.backward()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    groups, rows = {}, []
    for e in prof.key_averages():
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        if us <= 0:
            continue
        rows.append((us / args.steps / 1000.0, e.count // args.steps, e.key))
        g = group(e.key)
        groups[g] = groups.get(g, 0.0) + us / args.steps / 1000.0
    total = sum(groups.values())
    print(f"pytorch profile: {total:.3f} ms of kernels per step, batch {args.batch}, amp {args.amp},"
          f" channels_last {args.channels_last}, tf32 {args.tf32}")
    for g, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"  {g:<14} {ms:9.3f} ms {100 * ms / total:5.1f} %")
    print("  slowest kernels (ms per step, launches per step):")
    for ms, count, key in sorted(rows, reverse=True)[:25]:
        print(f"  {ms:9.3f} ms {count:5d}  {key[:110]}")


if __name__ == "__main__":
    main()
