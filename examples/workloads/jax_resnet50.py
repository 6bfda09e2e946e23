#!/usr/bin/env python3
"""ResNet-50 training steps in JAX/Flax (linen), bf16 (or fp32) compute on synthetic on-device
input, printing the dlprobe line protocol (docs/external.md).

    dlprobe run -- python3 jax_resnet50.py --batch 256 [--precision fp32] [--mode grads]

--mode grads stops after the gradients (the protocol's "gradients only"); --mode train (the
default) adds the SGD update with momentum. --device cpu runs on the CPU; the default is the GPU
when JAX has one, else the CPU.

JAX preallocates 75% of the GPU at start unless XLA_PYTHON_CLIENT_PREALLOCATE=false; dlprobe run
reports that (memory_preallocated) and reads the real peak from the figures printed here.
"""
import argparse
import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import flax.linen as nn


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
    width: int
    stride: int
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x, train):
        conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype)
        norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                                 dtype=self.dtype)
        y = nn.relu(norm()(conv(self.width, (1, 1))(x)))
        y = nn.relu(norm()(conv(self.width, (3, 3), (self.stride, self.stride))(y)))
        y = norm(scale_init=nn.initializers.zeros)(conv(self.width * 4, (1, 1))(y))
        if x.shape[-1] != self.width * 4 or self.stride != 1:
            x = norm()(conv(self.width * 4, (1, 1), (self.stride, self.stride))(x))
        return nn.relu(x + y)


class ResNet50(nn.Module):
    classes: int = 1000
    dtype: jnp.dtype = jnp.bfloat16

    @nn.compact
    def __call__(self, x, train=True):
        x = nn.Conv(64, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], use_bias=False,
                    dtype=self.dtype)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9,
                                 dtype=self.dtype)(x))
        x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                x = Bottleneck(width, stride if i == 0 else 1, self.dtype)(x, train)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.classes, dtype=jnp.float32)(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto: the GPU when JAX has one, else the CPU (said on stderr)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--plain", action="store_true",
                   help="print no dlprobe lines, only 'Throughput: X samples/sec', 'Average Step "
                        "Time: Xs' and 'Batch Size: N' at the end")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16",
                   help="bf16 activations and convolutions (fp32 parameters), or fp32 throughout "
                        "with full-precision matrix products (no TF32)")
    p.add_argument("--mode", choices=["train", "grads"], default="train",
                   help="train: forward, backward and SGD update; grads: no update")
    args = p.parse_args()
    global PLAIN
    PLAIN = args.plain

    if args.device == "cpu":
        # Before any array exists: JAX picks its platforms once, at the first use.
        jax.config.update("jax_platforms", "cpu")
    backend = jax.default_backend()
    if args.device == "cuda" and backend != "gpu":
        print(f"jax_resnet50.py: JAX sees no GPU (its backend is {backend}); run on the CPU with "
              "--device cpu", file=sys.stderr)
        return 2
    if args.device == "auto":
        print(f"jax_resnet50.py: running on {jax.devices()[0].platform} (--device picks another)",
              file=sys.stderr)

    dtype = jnp.bfloat16 if args.precision == "bf16" else jnp.float32
    if args.precision == "fp32":
        # XLA's default precision lets fp32 convolutions and products run on TF32 tensor cores.
        jax.config.update("jax_default_matmul_precision", "highest")
    model = ResNet50(dtype=dtype)
    key = jax.random.PRNGKey(0)
    # NHWC, XLA's layout for GPU convolutions.
    x = jax.random.normal(key, (args.batch, args.image_size, args.image_size, 3), dtype)
    y = jax.random.randint(key, (args.batch,), 0, 1000)
    variables = model.init(key, x[:1], train=False)
    params, stats = variables["params"], variables["batch_stats"]
    momentum = jax.tree_util.tree_map(jnp.zeros_like, params)

    def loss_fn(p, stats, x, y):
        logits, updates = model.apply({"params": p, "batch_stats": stats}, x, train=True,
                                      mutable=["batch_stats"])
        onehot = jax.nn.one_hot(y, 1000)
        loss = -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits), axis=-1))
        return loss, updates["batch_stats"]

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def train_step(params, stats, momentum, x, y):
        (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, x, y)
        # SGD with momentum by hand, so the script needs nothing beyond jax and flax.
        momentum = jax.tree_util.tree_map(lambda m, g: 0.9 * m + g, momentum, grads)
        params = jax.tree_util.tree_map(lambda w, m: w - 0.1 * m, params, momentum)
        return params, new_stats, momentum, loss

    # Gradients only: the gradients are outputs, so XLA cannot leave them uncomputed; the batch
    # statistics are carried as in training.
    @functools.partial(jax.jit, donate_argnums=(1,))
    def grads_step(params, stats, x, y):
        (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, x, y)
        return grads, new_stats, loss

    dev = jax.devices()[0]
    prealloc = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower()
    prealloc = prealloc not in ("false", "0")
    emit(framework="jax", model="resnet50", precision=args.precision, mode=args.mode,
         channels_last=True, warmup_steps=args.warmup, batch=args.batch)
    measured = 0.0
    try:
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            if args.mode == "train":
                params, stats, momentum, loss = train_step(params, stats, momentum, x, y)
                jax.block_until_ready(loss)
            else:
                # Nothing of the step before stays alive into the next (its gradients would
                # count in the next step's peak).
                out = grads_step(params, stats, x, y)
                jax.block_until_ready(out)
                stats = out[1]
                del out
            dt = time.perf_counter() - t0
            if i >= args.warmup:
                measured += dt
            mem = dev.memory_stats() or {}
            fields = dict(step=i, step_time_s=dt, data_time_s=0.0, batch=args.batch,
                          warmup=i < args.warmup)
            if "peak_bytes_in_use" in mem:
                fields["framework_peak_bytes"] = mem["peak_bytes_in_use"]
            # bytes_reserved counts a separate reservation that XLA's default (BFC) allocator
            # leaves at 0; preallocating, the allocator holds its whole pool, bytes_limit.
            reserved = mem.get("bytes_reserved") or (mem.get("bytes_limit") if prealloc else None)
            if reserved:
                fields["framework_reserved_bytes"] = reserved
            emit(**fields)
    except Exception as e:  # XlaRuntimeError's module moved between jaxlib versions
        if "RESOURCE_EXHAUSTED" in str(e):
            emit(oom=True, framework="jax", message=str(e).splitlines()[0])
        raise
    # The script's own figure, for checking the one dlprobe computes from the steps.
    if args.steps > 0 and measured > 0:
        emit(images_per_s=args.batch * args.steps / measured)
    if PLAIN:
        seed_lines(args.batch, args.steps, measured)
    emit(end=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
