#!/usr/bin/env python3
"""PyTorch's DataLoader with torchvision's ImageNet training transforms, the peer of
`dlprobe pipeline` (docs/pipeline.md): images per second over a JPEG ImageFolder tree.

The pipeline is the one torchvision's ImageNet reference trains with: ImageFolder (PIL decode,
convert to RGB), RandomResizedCrop(size), RandomHorizontalFlip(), ToTensor(), Normalize(ImageNet
mean and std), batches of `--batch` collated by `--workers` worker processes (persistent, so that
a new epoch does not restart them), shuffled. The first `--workers` batches are warm-up (worker
start, first reads); the rate is over the batches after them, for at least `--min-time` seconds,
the same protocol as dlprobe pipeline's.

    python3 lab/peers/dataloader.py DIR --workers 2 --batch 64 --min-time 10 --repeat 3
"""
import argparse
import os
import time

import torch
from torchvision import datasets, transforms


def measure(loader, workers, min_time):
    """Images per second over the batches after the first `workers`, for at least min_time."""
    images = 0
    start = None
    while True:
        for i, (batch, _labels) in enumerate(loader):
            if start is None:
                if i + 1 >= workers:
                    start = time.perf_counter()
                continue
            images += batch.shape[0]
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                return images / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", help="ImageFolder tree of JPEGs")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--min-time", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()

    transform = transforms.Compose([
        transforms.RandomResizedCrop(args.size),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    dataset = datasets.ImageFolder(args.dir, transform=transform)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, shuffle=True,
                                         num_workers=args.workers,
                                         persistent_workers=args.workers > 0)
    print(f"dataloader: {len(dataset)} images, {args.workers} workers, batch {args.batch}, "
          f"torch {torch.__version__}", flush=True)
    for r in range(args.repeat):
        rate = measure(loader, max(args.workers, 1), args.min_time)
        print(f"dataloader: run {r + 1}: {rate:.1f} img/s", flush=True)


if __name__ == "__main__":
    main()
