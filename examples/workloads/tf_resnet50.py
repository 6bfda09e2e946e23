#!/usr/bin/env python3
"""ResNet-50 training steps in TensorFlow 2.x (Keras ResNet50, weights=None) on synthetic
on-device input, printing the dlprobe line protocol (docs/external.md). Written for TF 2.9's APIs
(the tensorflow/tensorflow:2.9.0-gpu container) and newer.

    dlprobe run -- docker run --rm --gpus all -v $PWD/examples/workloads:/w \
        tensorflow/tensorflow:2.9.0-gpu python /w/tf_resnet50.py --batch 128 --mixed-precision

TensorFlow takes nearly all GPU memory at start unless --memory-growth (or
TF_FORCE_GPU_ALLOW_GROWTH=true); the peak printed here (tf.config.experimental.get_memory_info)
is what the model used.
"""
import argparse
import json
import sys
import time


def emit(**fields):
    print(json.dumps({"dlprobe": fields}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--memory-growth", action="store_true",
                   help="allocate GPU memory as needed instead of (almost) all at start")
    p.add_argument("--mixed-precision", action="store_true", help="mixed_float16 policy")
    p.add_argument("--xla", action="store_true", help="compile the step with XLA")
    args = p.parse_args()

    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        print("tf_resnet50.py: TensorFlow sees no GPU", file=sys.stderr)
        return 2
    if args.memory_growth:
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
        x = tf.random.uniform((args.batch, args.image_size, args.image_size, 3))
        y = tf.random.uniform((args.batch,), maxval=1000, dtype=tf.int32)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=False)

    @tf.function(jit_compile=args.xla)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            probs = model(x, training=True)
            loss = loss_fn(y, tf.cast(probs, tf.float32))
            scaled = opt.get_scaled_loss(loss) if args.mixed_precision else loss
        grads = tape.gradient(scaled, model.trainable_variables)
        if args.mixed_precision:
            grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    # Keras builds NHWC models; cuDNN runs NHWC natively with fp16.
    # Without mixed precision, TF (2.4+) runs float32 matmuls and convolutions in TF32 on GPUs
    # that have it, unless turned off.
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    emit(framework="tensorflow", model="resnet50",
         precision="fp16" if args.mixed_precision else ("tf32" if tf32 else "fp32"),
         channels_last=True,
         warmup_steps=args.warmup, batch=args.batch)
    measured = 0.0
    try:
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            loss = train_step(x, y)
            loss.numpy()  # waits for the step to finish on the GPU
            dt = time.perf_counter() - t0
            if i >= args.warmup:
                measured += dt
            mem = tf.config.experimental.get_memory_info("GPU:0")
            emit(step=i, step_time_s=dt, data_time_s=0.0, batch=args.batch,
                 warmup=i < args.warmup, framework_peak_bytes=int(mem["peak"]),
                 framework_allocated_bytes=int(mem["current"]))
    except tf.errors.ResourceExhaustedError as e:
        emit(oom=True, framework="tensorflow", message=str(e).splitlines()[0])
        raise
    # The script's own figure, for checking the one dlprobe computes from the steps.
    if args.steps > 0 and measured > 0:
        emit(images_per_s=args.batch * args.steps / measured)
    emit(end=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
