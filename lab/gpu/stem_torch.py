#!/usr/bin/env python3
"""PyTorch's ResNet-50 stem convolution alone (7x7, stride 2, 3 -> 64 channels, fp16 or TF32,
channels_last): its forward and weight gradient by CUDA kernel, with cudnn.benchmark on or off.
Run under CUDNN_LOGLEVEL_DBG/CUDNN_LOGDEST_DBG, cuDNN's log names the engine and knobs of each
plan PyTorch built: the peer beside dlprobe's own candidates for the same shape.

    python3 lab/gpu/stem_torch.py --batch 256 --benchmark [--precision tf32]
"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--benchmark", action="store_true")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--precision", choices=["fp16", "tf32"], default="fp16")
    args = p.parse_args()
    torch.backends.cudnn.benchmark = args.benchmark
    # TF32: fp32 tensors, the convolution on TF32 tensor cores (as dlprobe's --precision tf32).
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    dtype = torch.half if args.precision == "fp16" else torch.float
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    conv = torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False).cuda().to(dtype)
    conv = conv.to(memory_format=torch.channels_last)
    g = None
    for _ in range(3):
        y = conv(x)
        if g is None:
            g = torch.randn_like(y)
        y.backward(g)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            y = conv(x)
            y.backward(g)
        torch.cuda.synchronize()
    print(f"batch {args.batch}, {args.precision}, cudnn.benchmark {args.benchmark}, "
          f"{args.steps} steps")
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total):
        if e.device_time_total <= 0:
            continue
        print(f"{e.device_time_total / args.steps / 1000:8.3f} ms/step  {e.count // args.steps:3d}x  "
              f"{e.key[:160]}")


if __name__ == "__main__":
    main()
