#!/usr/bin/env python3
"""ResNet-50 training steps in TensorFlow 2.x (Keras ResNet50, weights=None) in the seed's form:
a constant input tensor on the GPU (tf.constant), 5 warm-up and 50 timed steps that compute the
gradients without applying them, memory growth on, and three lines at the end that `dlprobe run`
reads without a regex (docs/external.md, "Throughput from what scripts already print"):

    Throughput: 1234.56 samples/sec
    Average Step Time: 0.1037s
    Batch Size: 128

Written for TF 2.9's APIs (the tensorflow/tensorflow:2.9.0-gpu container) and newer:

    dlprobe run -- docker run --rm --gpus all -v $PWD/examples/workloads:/w \
        tensorflow/tensorflow:2.9.0-gpu python /w/tf_resnet50.py --batch 128

--mode train applies the gradients (SGD with momentum); --protocol also prints the dlprobe line
protocol (a line per step, the framework's peak memory); --no-memory-growth leaves TensorFlow's
default of taking nearly all GPU memory at start; --memory-limit MIB (or DLPROBE_MEMORY_LIMIT_MIB)
caps what TensorFlow may use, as a smaller card would (a logical device with memory_limit).
"""
import argparse
import json
import os
import sys
import time


def emit(**fields):
    print(json.dumps({"dlprobe": fields}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--mode", choices=("grads", "train"), default="grads",
                   help="grads: compute the gradients only (the seed's form); train: apply them")
    p.add_argument("--no-memory-growth", action="store_true",
                   help="let TensorFlow take (almost) all GPU memory at start, its default")
    p.add_argument("--memory-limit", type=int,
                   default=int(os.environ.get("DLPROBE_MEMORY_LIMIT_MIB", "0")),
                   help="MiB TensorFlow may use on the GPU (0: no limit)")
    p.add_argument("--mixed-precision", action="store_true", help="mixed_float16 policy")
    p.add_argument("--xla", action="store_true", help="compile the step with XLA")
    p.add_argument("--protocol", action="store_true", help="also print the dlprobe line protocol")
    args = p.parse_args()

    import numpy as np
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        print("tf_resnet50.py: TensorFlow sees no GPU", file=sys.stderr)
        return 2
    if args.memory_limit > 0:
        # A logical device with a memory limit excludes memory growth on the same device.
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=args.memory_limit)])
    elif not args.no_memory_growth:
        for g in gpus:
            tf.config.experimental.set_memory_growth(g, True)
    if args.mixed_precision:
        tf.keras.mixed_precision.set_global_policy("mixed_float16")

    with tf.device("/GPU:0"):
        model = tf.keras.applications.ResNet50(weights=None, classes=1000,
                                               input_shape=(args.image_size, args.image_size, 3))
        opt = tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
        if args.mixed_precision:
            opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)
        rng = np.random.default_rng(0)
        x = tf.constant(rng.random((args.batch, args.image_size, args.image_size, 3),
                                   dtype=np.float32))
        y = tf.constant(rng.integers(0, 1000, size=(args.batch,), dtype=np.int32))
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=False)
    apply = args.mode == "train"

    @tf.function(jit_compile=args.xla)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            probs = model(x, training=True)
            loss = loss_fn(y, tf.cast(probs, tf.float32))
            scaled = opt.get_scaled_loss(loss) if args.mixed_precision else loss
        grads = tape.gradient(scaled, model.trainable_variables)
        if args.mixed_precision:
            grads = opt.get_unscaled_gradients(grads)
        if apply:
            opt.apply_gradients(zip(grads, model.trainable_variables))
        # Returned, so that the gradients are computed even when not applied.
        return loss, grads

    if args.protocol:
        tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
        emit(framework="tensorflow", model="resnet50",
             precision="fp16" if args.mixed_precision else ("tf32" if tf32 else "fp32"),
             channels_last=True, warmup_steps=args.warmup, batch=args.batch)
    measured = 0.0
    try:
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            loss, _ = train_step(x, y)
            loss.numpy()  # waits for the step to finish on the GPU
            dt = time.perf_counter() - t0
            if i >= args.warmup:
                measured += dt
            if args.protocol:
                mem = tf.config.experimental.get_memory_info("GPU:0")
                emit(step=i, step_time_s=dt, data_time_s=0.0, batch=args.batch,
                     warmup=i < args.warmup, framework_peak_bytes=int(mem["peak"]),
                     framework_allocated_bytes=int(mem["current"]))
    except tf.errors.ResourceExhaustedError as e:
        if args.protocol:
            emit(oom=True, framework="tensorflow", message=str(e).splitlines()[0])
        raise
    if args.steps > 0 and measured > 0:
        step_s = measured / args.steps
        print(f"Throughput: {args.batch / step_s:.2f} samples/sec")
        print(f"Average Step Time: {step_s:.4f}s")
        print(f"Batch Size: {args.batch}")
    if args.protocol:
        emit(end=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
