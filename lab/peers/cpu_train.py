#!/usr/bin/env python3
"""PyTorch's CPU training step, the peer of `dlprobe bench --device cpu --mode train`.

torchvision's resnet18 / resnet50 with --classes outputs, synthetic input, SGD with the engine's
settings (lr 0.1, momentum 0.9, weight decay 1e-4), fp32, forward + cross-entropy + backward +
step, timed on the host clock after --warmup steps:

    /usr/bin/python3 lab/peers/cpu_train.py --model resnet18 --batch 32 --image-size 64
    /usr/bin/python3 lab/peers/cpu_train.py --model resnet50 --batch 16 --threads 2 --channels-last

Prints one line, `pytorch <model> bs<B> <S>x<S> <layout> threads <T>: <img/s> img/s (<steps>
steps, <seconds> s)`, which lab/cpu/vs_pytorch.sh reads.
"""
import argparse
import time

import torch
import torch.nn.functional as F
import torchvision


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["resnet18", "resnet50"], default="resnet18")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="timed steps, at least")
    p.add_argument("--min-time", type=float, default=10.0, help="timed seconds, at least")
    p.add_argument("--channels-last", action="store_true")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = getattr(torchvision.models, args.model)(num_classes=args.classes)
    model = model.to(memory_format=fmt).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size).to(memory_format=fmt)
    labels = torch.randint(0, args.classes, (args.batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    steps = 0
    start = time.perf_counter()
    while steps < args.steps or time.perf_counter() - start < args.min_time:
        step()
        steps += 1
    seconds = time.perf_counter() - start
    layout = "nhwc" if args.channels_last else "nchw"
    print(f"pytorch {args.model} bs{args.batch} {args.image_size}x{args.image_size} {layout} "
          f"threads {args.threads}: {args.batch * steps / seconds:.2f} img/s "
          f"({steps} steps, {seconds:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
