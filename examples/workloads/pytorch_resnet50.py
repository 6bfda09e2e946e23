#!/usr/bin/env python3
"""ResNet-50 training steps in PyTorch on synthetic on-device input, printing the dlprobe line
protocol (docs/external.md) so that `dlprobe run` measures it.

    dlprobe run -- python3 pytorch_resnet50.py --batch 256 --amp bf16 --channels-last

The model is written here (no torchvision needed) with torchvision's ResNet-50 v1.5 layout. The
defaults follow the peer protocol of docs/performance.md: cudnn.benchmark on, fp32
without TF32 unless --tf32, timed steps back to back on CUDA events (no host sync between them).
--mode grads stops after the backward pass (the protocol's "gradients only"); --mode train adds
the SGD update. --device cpu runs the same step on the CPU (fp32 or bf16), timed on the host
clock; the default is the GPU when PyTorch has one, else the CPU.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# --plain: no protocol lines, only the seed's closing lines (seed_lines), as a script written
# without dlprobe in mind prints.
PLAIN = False


def emit(**fields):
    if not PLAIN:
        print(json.dumps({"dlprobe": fields}), flush=True)


def seed_lines(batch, steps, seconds):
    """The closing lines of the seed's scripts, which `dlprobe run` reads without a regex."""
    if steps > 0 and seconds > 0:
        print(f"Throughput: {batch * steps / seconds:.2f} samples/sec")
        print(f"Average Step Time: {seconds / steps:.4f}s")
        print(f"Batch Size: {batch}", flush=True)


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        layers, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto: the GPU when PyTorch has one, else the CPU (said on stderr)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=30, help="timed steps after warm-up")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--amp", choices=["none", "fp16", "bf16"], default="none")
    p.add_argument("--tf32", action="store_true",
                   help="without --amp, let convolutions and matrix products use TF32")
    p.add_argument("--mode", choices=["train", "grads"], default="train",
                   help="train: forward, backward and SGD update; grads: no update")
    p.add_argument("--no-cudnn-benchmark", action="store_true",
                   help="take cuDNN's heuristic choice instead of timing its algorithms")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--compile-mode", choices=["default", "reduce-overhead", "max-autotune"],
                   default="default",
                   help="with --compile: torch.compile's mode (reduce-overhead replays CUDA "
                        "graphs, the fastest at small batches)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--plain", action="store_true",
                   help="print no dlprobe lines, only 'Throughput: X samples/sec', 'Average Step "
                        "Time: Xs' and 'Batch Size: N' at the end")
    p.add_argument("--memory-fraction", type=float,
                   help="cap PyTorch's allocator at this share of the GPU "
                        "(torch.cuda.set_per_process_memory_fraction): a smaller card, to find "
                        "where it runs out of memory")
    args = p.parse_args()
    global PLAIN
    PLAIN = args.plain
    if args.memory_fraction is not None and not 0 < args.memory_fraction <= 1:
        p.error("--memory-fraction must be in (0, 1]")

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        print(f"pytorch_resnet50.py: running on {device} (--device picks another)", file=sys.stderr)
    if device == "cuda" and not torch.cuda.is_available():
        print("pytorch_resnet50.py: PyTorch sees no CUDA device; run on the CPU with --device cpu",
              file=sys.stderr)
        return 2
    on_gpu = device == "cuda"
    if not on_gpu:
        # GPU-only modes, refused rather than run as something else under their name.
        for flag, given in (("--tf32", args.tf32), ("--amp fp16", args.amp == "fp16"),
                            ("--memory-fraction", args.memory_fraction is not None)):
            if given:
                p.error(f"{flag} needs a GPU; on the CPU use fp32 or --amp bf16")
    dev = torch.device(device)
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    limit_mib = int(os.environ.get("DLPROBE_MEMORY_LIMIT_MIB", "0"))
    if on_gpu and args.memory_fraction is None and limit_mib > 0:
        # `dlprobe run --memory-limit`: the same cap as a share of this GPU.
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        args.memory_fraction = min(1.0, limit_mib * 2**20 / total)
    if args.memory_fraction is not None:
        # The call takes a device index; a bare torch.device("cuda") has none.
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction, torch.cuda.current_device())
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = ResNet50().to(dev, memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step_fn_model = torch.compile(model, mode=args.compile_mode) if args.compile else model
    # CUDA graph trees need to be told where a step begins, or a replay may overwrite the outputs
    # of the step before while they are still in use.
    graphs = on_gpu and args.compile and args.compile_mode != "default"
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.amp)
    # fp16 needs loss scaling; bf16 has fp32's range and does not.
    scaler = torch.amp.GradScaler(device, enabled=args.amp == "fp16")
    x = torch.randn(args.batch, 3, args.image_size, args.image_size, device=dev)
    x = x.contiguous(memory_format=fmt)
    y = torch.randint(0, 1000, (args.batch,), device=dev)
    precision = args.amp if dtype is not None else ("tf32" if args.tf32 else "fp32")
    emit(framework="pytorch", model="resnet50", precision=precision, mode=args.mode,
         channels_last=args.channels_last,
         cudnn_benchmark=on_gpu and not args.no_cudnn_benchmark,
         warmup_steps=args.warmup, batch=args.batch)

    def step():
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(step_fn_model(x), y)
        scaler.scale(loss).backward()
        if args.mode == "train":
            scaler.step(opt)
            scaler.update()

    # Input is synthetic and already on the device: no step waits for data. PyTorch's allocator
    # peaks are the GPU's; on the CPU there are none to report.
    def emit_step(i, seconds):
        memory = {}
        if on_gpu:
            memory = dict(framework_peak_bytes=torch.cuda.max_memory_allocated(),
                          framework_reserved_bytes=torch.cuda.max_memory_reserved())
        emit(step=i, step_time_s=seconds, data_time_s=0.0, batch=args.batch,
             warmup=i < args.warmup, **memory)

    def synchronize():
        if on_gpu:
            torch.cuda.synchronize()

    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    try:
        # Warm-up steps one at a time, each reported as it ends (cudnn.benchmark's search and
        # the allocator's growth happen here).
        for i in range(args.warmup):
            synchronize()
            t0 = time.perf_counter()
            step()
            synchronize()
            emit_step(i, time.perf_counter() - t0)
        if on_gpu:
            # The peak of the timed steps alone, as the protocol takes every peak: warm-up holds
            # cudnn.benchmark's trial workspaces and compilation's buffers, which training does
            # not.
            torch.cuda.reset_peak_memory_stats()
            # Timed steps queued back to back, an event between each two: no host sync in
            # between, as the protocol times them.
            events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)]
            events[0].record()
            for k in range(args.steps):
                step()
                events[k + 1].record()
            torch.cuda.synchronize()
            seconds = [events[k].elapsed_time(events[k + 1]) / 1000.0 for k in range(args.steps)]
        else:
            # The CPU runs each step to its end before the call returns: the host clock times it.
            marks = [time.perf_counter()]
            for k in range(args.steps):
                step()
                marks.append(time.perf_counter())
            seconds = [b - a for a, b in zip(marks, marks[1:])]
    except torch.OutOfMemoryError as e:
        emit(oom=True, framework="pytorch", message=str(e).splitlines()[0])
        raise
    for k in range(args.steps):
        emit_step(args.warmup + k, seconds[k])
    # The script's own figure, for checking the one dlprobe computes from the steps.
    if args.steps > 0:
        measured = sum(seconds)
        emit(images_per_s=args.batch * args.steps / measured)
    if PLAIN and args.steps > 0:
        seed_lines(args.batch, args.steps, measured)
    emit(end=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
