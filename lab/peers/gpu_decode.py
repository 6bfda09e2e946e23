#!/usr/bin/env python3
"""torchvision's GPU JPEG decode (nvJPEG through `decode_jpeg(device="cuda")`), the peer of
dlprobe's GPU input pipeline (docs/pipeline.md): images per second decoded, and decoded plus
augmented into a normalised batch on the device, over a folder of JPEGs.

The files are read into host memory once (both sides then measure decoding, not the disk). A
batch is `--batch` files in shuffled order, decoded in one `decode_jpeg` call; `augment` then
takes RandomResizedCrop(size) (the crop drawn as torchvision draws it) and a random horizontal
flip per image on the GPU (the v2 functional ops on CUDA tensors), stacks, converts to `--dtype`
and normalises with ImageNet's mean and std, in NCHW. Every batch is synchronised before it counts. The first
`--warmup` batches are not timed; then batches for at least `--min-time` seconds.

    python3 lab/peers/gpu_decode.py DIR --batch 256 --min-time 10
"""
import argparse
import os
import random
import time

import torch
import torchvision
from torchvision.io import decode_jpeg, ImageReadMode
from torchvision.transforms import RandomResizedCrop
from torchvision.transforms.v2 import functional as F


def jpeg_files(root):
    out = []
    for dirpath, _dirs, files in os.walk(root):
        out += [os.path.join(dirpath, f) for f in files if f.lower().endswith((".jpg", ".jpeg"))]
    return sorted(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", help="folder of JPEGs (any depth)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--dtype", choices=["fp32", "fp16"], default="fp16")
    parser.add_argument("--min-time", type=float, default=10.0)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--stages", default="decode,augment")
    args = parser.parse_args()

    paths = jpeg_files(args.dir)
    if not paths:
        raise SystemExit(f"gpu_decode: no JPEGs under {args.dir}")
    data = [torchvision.io.read_file(p) for p in paths]
    total_bytes = sum(d.numel() for d in data)
    print(f"gpu_decode: {len(data)} images, {total_bytes / 2**20:.0f} MiB in memory, "
          f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"{torch.cuda.get_device_name()}", flush=True)

    dtype = torch.float16 if args.dtype == "fp16" else torch.float32
    mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device="cuda").view(1, 3, 1, 1) * 255
    rng = random.Random(0)

    def batches():
        while True:
            order = list(range(len(data)))
            rng.shuffle(order)
            for i in range(0, len(order) - args.batch + 1, args.batch):
                yield [data[j] for j in order[i:i + args.batch]]

    def one(stage, files):
        images = decode_jpeg(files, mode=ImageReadMode.RGB, device="cuda")
        if stage == "augment":
            out = []
            for img in images:
                top, left, h, w = RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))
                img = F.resized_crop(img, top, left, h, w, [args.size, args.size], antialias=False)
                if rng.random() < 0.5:
                    img = F.horizontal_flip(img)
                out.append(img)
            batch = torch.stack(out).to(dtype)
            batch = ((batch - mean.to(dtype)) / std.to(dtype)).contiguous()
        torch.cuda.synchronize()

    for stage in args.stages.split(","):
        gen = batches()
        for _ in range(args.warmup):
            one(stage, next(gen))
        images = 0
        start = time.perf_counter()
        while True:
            one(stage, next(gen))
            images += args.batch
            elapsed = time.perf_counter() - start
            if elapsed >= args.min_time:
                break
        name = "decode" if stage == "decode" else "decode+augment"
        print(f"torchvision GPU {name:15s} batch {args.batch:4d}: {images / elapsed:10.1f} img/s "
              f"({images} images in {elapsed:.2f} s)", flush=True)


if __name__ == "__main__":
    main()
