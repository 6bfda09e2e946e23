#!/usr/bin/env python3
"""dlprobe's native training step against PyTorch's: per-tensor agreement, and a loss curve.

Two checks, each run beside controls that show it can fail:

1. One step, tensor by tensor. torchvision's ResNet (random initialisation from a fixed seed, the
   last batch-norm weight of every residual block set to --residual-gamma, see WELL-CONDITIONED
   below) and a fixed random batch are saved as safetensors; PyTorch's step and `dlprobe step` run
   on the same files per precision. The logits, the loss and every parameter gradient of dlprobe
   are compared with PyTorch's in the same precision: relative error ||a - b|| / ||b|| and cosine
   similarity a.b / (||a|| ||b||), each within the precision's bound (TOLERANCES). Controls, run on
   the same data: PyTorch against itself in another order (the batch reversed, the other memory
   format) must pass; dlprobe's gradients zeroed, and negated, must fail.
2. A short training run. --train-steps SGD steps (default 200) of --train-model (default
   resnet18) over a fixed set of --train-images images of --train-classes classes (default 64 of
   10 at 32x32: a noisy template per class, so the loss has something to fall to), batches of
   --train-batch (16) cycled, from the same initial weights; dlprobe's loss curve (`dlprobe step
   --mode train --steps N --batch B`) must stay within a band of PyTorch's (CURVE_BANDS).
   Controls: PyTorch with each batch's samples reversed must pass; PyTorch with negated gradients
   must fail.

    python3 lab/peers/compare_pytorch.py --json peers.json                 # H200: resnet50 bs32
    python3 lab/peers/compare_pytorch.py --device cpu --model resnet18 \\
        --batch 8 --image-size 32 --classes 10 --precisions fp32,bf16        # no GPU

The step, as the engine defines it (docs/engine-step.md) and PyTorch runs it here: BN in train
mode (batch statistics), forward, cross-entropy mean over the batch in fp32, backward, no
optimizer (grads mode). fp32: TF32 off. tf32: TF32 on for convolutions and matrix products. fp16:
torch.autocast(float16) with the loss multiplied by 65536 before backward (GradScaler's initial
scale, so its gradients are 65536x; both sides' gradients are divided by their reported scale
before comparing). bf16: autocast(bfloat16), no scaling. fp16/bf16 run channels_last (NHWC),
fp32/tf32 NCHW. Training: torch.optim.SGD with the engine's settings (SGD below), fp16 with
torch.cuda.amp.GradScaler's defaults (the engine's).

WELL-CONDITIONED. At torchvision's initialisation a ResNet's gradients are ill-conditioned: each
residual block adds a branch as large as its input, so the last layers see the sum of many
branches, and a rounding in the forward flips ReLU decisions whose effect the backward carries to
every layer below. PyTorch's own gradients then sit far from float64's (ResNet-50 at batch 32,
224x224 on an H200: median over tensors 2 % in fp32, 0.6 in tf32, 0.7 in fp16, 1.3 in bf16), and
no bound that lets PyTorch pass can fail a zeroed gradient. With the last BN weight of each
residual block at 0.2 instead of 1 (the zero-init-residual practice, not taken to zero, which
would leave the branches' gradients zero) every branch starts small and the network close to a
shallow one. Measured on the CPU (PyTorch 1.13.1, ResNet-18 at batch 8, 32x32, 10 classes; worst
tensor's relative error against float64 / its cosine):

    residual gamma                    1.0               0.5               0.2               0.1
    fp32 vs fp64              9.4e-6 / 1.00000  4.4e-6 / 1.00000  3.0e-6 / 1.00000  2.0e-6 / 1.00000
    bf16 vs fp64              0.52   / 0.853    0.51   / 0.896    0.22   / 0.975    0.41   / 0.914

0.2 is the best of these; a batch of 32, 64x64 images, the same label for every sample, or five
SGD warm-up steps did not bring bf16 further (0.23, 0.25, 0.34, 0.30 worst). bf16 keeps about 0.2
per tensor at this size: its forward flips ReLU decisions, and with 1x1 maps in layer4 a batch
norm sums over 8 values.

The engine's fp64 step (reference backend) is also compared with PyTorch's fp64 (--engine-fp64, on
by default with --device cpu): no rounding to hide behind, so it checks the math itself.

Needs torch, torchvision and numpy; the safetensors files are written and read here, so the
`safetensors` package is not needed. --self-test checks the helpers and that the checks fail on
a zeroed gradient, a negated gradient and a diverging loss curve, with numpy alone.
"""
import argparse
import contextlib
import copy
import json
import math
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
LAYOUT = {"fp32": "nchw", "tf32": "nchw", "fp16": "nhwc", "bf16": "nhwc"}
# torch.cuda.amp.GradScaler's initial scale, which the engine's fp16 grads mode also uses.
FP16_LOSS_SCALE = 65536.0
# The engine's SGD (StepConfig::sgd in include/dlprobe/step/step_config.h), on every parameter.
SGD = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}

# Bounds of dlprobe against PyTorch in the same precision, on the well-conditioned step above.
# Per gradient tensor (and the logits): relative error <= "rel" and cosine >= "cos"; the loss:
# relative error <= "loss". Two correct implementations round independently, so each sits about as
# far from float64 as PyTorch does, and from each other up to about sqrt(2) times that. The bounds
# leave room for that on the largest step checked (ResNet-50, batch 32, 224x224 on an H200, where
# the worst tensors are the small-norm batch-norm gradients of layer1 and layer4) and fail both a
# zeroed gradient (relative error 1, cosine 0) and a negated one (relative error 2, cosine -1) in
# every precision. Measured on the H200 (PyTorch 2.11, cuDNN 9.19), worst tensor: PyTorch against
# float64, and PyTorch against itself with the batch reversed and the other memory format.
TOLERANCES = {
    # PyTorch fp32: 7.4e-3 from fp64 on ResNet-50 (3e-6 on ResNet-18 at 32x32 on the CPU), 7.5e-3
    # from itself reordered (cosine 0.99997): cuDNN's algorithms sum in other orders, and a ReLU
    # decision that flips on one side moves a small layer4 gradient by ~1e-3.
    "fp32": {"rel": 2e-2, "cos": 0.9998, "logits": 1e-4, "loss": 1e-4,
             "why": "PyTorch fp32 is 7.4e-3 from fp64 on ResNet-50 and as far from itself "
                    "reordered; sqrt(2) x that, and room"},
    # TF32 rounds the inputs of every convolution and matrix product to 10 mantissa bits
    # (u = 4.9e-4). PyTorch tf32: 0.16 from fp64 (cosine 0.988), 0.092 from itself reordered.
    "tf32": {"rel": 0.25, "cos": 0.97, "logits": 2e-2, "loss": 1e-2,
             "why": "10 mantissa bits at product inputs: PyTorch is 0.16 from fp64 per tensor, so "
                    "two tf32 steps differ by up to ~0.23"},
    # fp16 rounds every activation and gradient to 10 mantissa bits (u = 4.9e-4) after each op.
    # PyTorch fp16: 0.18 from fp64 (cosine 0.984), 0.12 from itself reordered.
    "fp16": {"rel": 0.3, "cos": 0.95, "logits": 3e-2, "loss": 1e-2,
             "why": "every activation and gradient rounded to 10 mantissa bits: PyTorch is 0.18 "
                    "from fp64 per tensor, so two fp16 steps differ by up to ~0.25"},
    # bf16 keeps 7 mantissa bits (u = 3.9e-3). PyTorch bf16: 0.52 from fp64 (cosine 0.87) on
    # ResNet-50, 0.35 from itself reordered; a relative error of 0.75 still fails a zeroed
    # gradient, and a cosine of 0.7 a negated one or one pointing elsewhere.
    "bf16": {"rel": 0.75, "cos": 0.7, "logits": 0.1, "loss": 5e-2,
             "why": "7 mantissa bits: PyTorch is 0.52 from fp64 per tensor on ResNet-50, so two "
                    "bf16 steps differ by up to ~0.74; below 1 so that a zeroed gradient fails"},
}

# ---- safetensors ------------------------------------------------------------------------------

_CODES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
          "I32": np.int32}


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: ndarray} in insertion order (little-endian, C-contiguous)."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        array = np.asarray(array)  # tobytes() below writes C order; keeps 0-d arrays 0-d
        code = next((c for c, t in _CODES.items() if array.dtype == t), None)
        if code is None:
            raise ValueError(f"{name}: dtype {array.dtype} has no safetensors code here")
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": code, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    """Returns ({name: ndarray}, metadata); BF16 is widened to float32 exactly."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: {len(raw)} bytes, not a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header of {n} bytes runs past the file")
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    metadata = header.pop("__metadata__", {})
    out = {}
    for name, h in header.items():
        begin, end = h["data_offsets"]
        chunk = data[begin:end]
        shape = tuple(h["shape"])
        if h["dtype"] == "BF16":
            bits = np.frombuffer(chunk, "<u2").astype(np.uint32) << 16
            out[name] = bits.view(np.float32).reshape(shape)
        elif h["dtype"] in _CODES:
            out[name] = np.frombuffer(chunk, np.dtype(_CODES[h["dtype"]]).newbyteorder("<"))
            out[name] = out[name].reshape(shape)
        else:
            raise ValueError(f"{path}: {name} has dtype {h['dtype']}")
    return out, metadata


# ---- comparison -------------------------------------------------------------------------------

def rel_err(a, b):
    """||a - b|| / ||b|| in float64; inf when a is not finite or b is zero and a is not."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return math.inf
    diff = float(np.linalg.norm((a - b).ravel()))
    norm = float(np.linalg.norm(b.ravel()))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


def cosine(a, b):
    """a.b / (||a|| ||b||) in float64. Two zero tensors are 1 (the same); one zero tensor against a
    non-zero one is 0 (no direction in common); non-finite values are -inf (worse than any)."""
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return -math.inf
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b)) / (na * nb)


def summarize(errors):
    """{name: error} -> worst, its tensor, median and the five worst, largest first."""
    if not errors:
        return {"count": 0, "worst": None, "worst_tensor": None, "median": None, "worst5": []}
    ranked = sorted(errors.items(), key=lambda kv: kv[1], reverse=True)
    return {"count": len(errors), "worst": ranked[0][1], "worst_tensor": ranked[0][0],
            "median": float(np.median(list(errors.values()))),
            "worst5": [{"name": k, "error": v} for k, v in ranked[:5]]}


def compare_sets(a, b, names):
    return {n: rel_err(a[n], b[n]) for n in names}


def check_step(a, b, tol):
    """Step a (logits, loss, gradients) against step b in the same precision, with the bounds
    `tol` of TOLERANCES. Returns {"pass", "reasons", "logits": {rel, cos}, "loss": rel,
    "gradients": {name: {rel, cos}}, "worst_rel", "worst_rel_tensor", "min_cos",
    "min_cos_tensor"}."""
    reasons = []
    logits = {"rel": rel_err(a["logits"], b["logits"]), "cos": cosine(a["logits"], b["logits"])}
    if not logits["rel"] <= tol["logits"]:
        reasons.append(f"logits: relative error {fmt_err(logits['rel'])} > {tol['logits']:g}")
    if not logits["cos"] >= tol["cos"]:
        reasons.append(f"logits: cosine {logits['cos']:.6f} < {tol['cos']:g}")
    loss = rel_err(a["loss"], b["loss"])
    if not loss <= tol["loss"]:
        reasons.append(f"loss: relative error {fmt_err(loss)} > {tol['loss']:g}")
    names = sorted(b["gradients"])
    missing = set(names) - set(a["gradients"])
    if missing:
        raise RuntimeError(f"no gradient for {sorted(missing)[:3]}")
    grads = {n: {"rel": rel_err(a["gradients"][n], b["gradients"][n]),
                 "cos": cosine(a["gradients"][n], b["gradients"][n])} for n in names}
    bad_rel = [n for n in names if not grads[n]["rel"] <= tol["rel"]]
    bad_cos = [n for n in names if not grads[n]["cos"] >= tol["cos"]]
    if bad_rel:
        reasons.append(f"{len(bad_rel)} of {len(names)} gradients: relative error > {tol['rel']:g} "
                       f"({bad_rel[0]}: {fmt_err(grads[bad_rel[0]]['rel'])})")
    if bad_cos:
        reasons.append(f"{len(bad_cos)} of {len(names)} gradients: cosine < {tol['cos']:g} "
                       f"({bad_cos[0]}: {grads[bad_cos[0]]['cos']:.6f})")
    worst = max(names, key=lambda n: grads[n]["rel"])
    least = min(names, key=lambda n: grads[n]["cos"])
    return {"pass": not reasons, "reasons": reasons, "logits": logits, "loss": loss,
            "gradients": grads, "worst_rel": grads[worst]["rel"], "worst_rel_tensor": worst,
            "median_rel": float(np.median([g["rel"] for g in grads.values()])),
            "min_cos": grads[least]["cos"], "min_cos_tensor": least}


def sabotaged(step, factor):
    """The step with every gradient multiplied by `factor` (0: zeroed, -1: negated)."""
    return {**step, "gradients": {n: g * factor for n, g in step["gradients"].items()}}


# The loss curves of two correct runs part slowly: each step's rounding moves the weights a
# little, and training carries that on. The band, per precision: at every step
# |loss_a - loss_b| <= "step_abs" + "step_rel" * loss_b, and over the last "tail" steps (whole
# passes over the images) the mean losses within "final_abs" + "final_rel" * mean_b. PyTorch's own
# curve must fall to "falls" times its first pass's mean, or the run proves nothing (a curve that
# stays flat would not tell a negated gradient from a right one).
CURVE_BANDS = {
    # Measured on the CPU (PyTorch 1.13.1, the default run: ResNet-18, 64 images, batch 16, 200
    # steps): the loss falls from 2.43 to 1e-4 in 8 steps and to ~2e-6 by the end; dlprobe's curve
    # (oneDNN backend) is within 5.8e-6 of PyTorch's at every step, PyTorch reordered within
    # 2.4e-7. 1e-3 + 5 % leaves room for a GPU's other summation orders carried over 200 steps.
    "fp32": {"step_abs": 1e-3, "step_rel": 0.05, "final_abs": 1e-3, "final_rel": 0.5,
             "tail": 16, "falls": 0.5},
    # Not measured yet: tf32, fp16 and bf16 round each step's activations and gradients at
    # 4.9e-4..3.9e-3, 100x to 1000x fp32's, and training carries that on; a band this wide still
    # fails a climbing curve (negated gradients) and a flat one (zeroed).
    "low": {"step_abs": 0.1, "step_rel": 0.25, "final_abs": 0.05, "final_rel": 0.5,
            "tail": 16, "falls": 0.5},
}


def curve_band(precision):
    return CURVE_BANDS["fp32" if precision == "fp32" else "low"]


def check_curve(a, b, band, batches):
    """Loss curve a against curve b (PyTorch's) within `band`, one of CURVE_BANDS. `batches`:
    steps in one pass over the images (the first pass's mean is the starting loss)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"curves of {a.size} and {b.size} steps")
    reasons = []
    if not np.all(np.isfinite(a)):
        reasons.append(f"loss not finite from step {int(np.argmin(np.isfinite(a)))} on")
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(np.isfinite(a), np.abs(a - b), math.inf)
    limit = band["step_abs"] + band["step_rel"] * np.abs(b)
    over = np.nonzero(~(diff <= limit))[0]
    if over.size:
        i = int(over[0])
        reasons.append(f"{over.size} of {a.size} steps outside the band; first step {i}: "
                       f"{a[i]:.4g} vs {b[i]:.4g} (bound {limit[i]:.3g})")
    tail = min(band["tail"], a.size)
    fa, fb = float(np.mean(a[-tail:])), float(np.mean(b[-tail:]))
    final_limit = band["final_abs"] + band["final_rel"] * abs(fb)
    if not abs(fa - fb) <= final_limit:
        reasons.append(f"mean of the last {tail} steps {fa:.4g} vs {fb:.4g} (bound "
                       f"{final_limit:.3g})")
    first = float(np.mean(b[:max(batches, 1)]))
    falls = fb <= band["falls"] * first
    if not falls:
        reasons.append(f"PyTorch's loss did not fall ({first:.4g} over the first pass, {fb:.4g} at "
                       f"the end): the run cannot tell a wrong gradient from a right one")
    return {"pass": not reasons and falls, "reasons": reasons, "max_step_diff": float(np.max(diff)),
            "final": fa, "final_reference": fb, "first_reference": first,
            "reference_falls": falls}


def fmt_err(e):
    return "-" if e is None else ("inf" if math.isinf(e) else f"{e:.2e}")

# ---- the steps --------------------------------------------------------------------------------

def set_residual_gamma(torch, model, gamma):
    """The last batch norm's weight of every residual block (bn2 of a BasicBlock, bn3 of a
    Bottleneck) set to `gamma`: the well-conditioned start (module docstring)."""
    import torchvision
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torchvision.models.resnet.BasicBlock):
                m.bn2.weight.fill_(gamma)
            elif isinstance(m, torchvision.models.resnet.Bottleneck):
                m.bn3.weight.fill_(gamma)


def torch_setup(torch, precision, device):
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def autocast(torch, precision, device):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    if dtype is None:
        return contextlib.nullcontext(), None
    return torch.autocast(device_type=device.type, dtype=dtype), dtype


def torch_step(torch, model, images, labels, precision, layout, device, scale=1.0,
               reverse=False):
    """One step as the engine defines it, the loss multiplied by `scale` before backward; with
    `reverse` the batch runs in reverse order (the logits are put back in order). Returns logits
    (fp32 or fp64), loss, unscaled gradients and BN running statistics, all as float64 numpy
    arrays, whether every gradient was finite, and the scale."""
    import torch.nn.functional as F
    is64 = precision == "fp64"
    torch_setup(torch, precision, device)
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    m = copy.deepcopy(model).to(device)
    if is64:
        m = m.double()
    m = m.to(memory_format=fmt).train()
    x = images.to(device, torch.float64 if is64 else torch.float32)
    y = labels.to(device)
    if reverse:
        x, y = x.flip(0), y.flip(0)
    x = x.contiguous(memory_format=fmt)
    ctx, dtype = autocast(torch, precision, device)
    with ctx:
        logits = m(x)
    # A PyTorch whose autocast lacks this dtype on this device warns and runs fp32 instead.
    if dtype is not None and logits.dtype != dtype:
        raise RuntimeError(f"PyTorch {torch.__version__}'s autocast on {device.type} did not run "
                           f"{precision} (the fc output is {logits.dtype})")
    # Cross-entropy in fp32 as autocast runs it (its fp32 list), written out so it does not
    # depend on which ops a given PyTorch version's autocast lists.
    logits = logits.double() if is64 else logits.float()
    loss = F.cross_entropy(logits, y)
    (loss * scale).backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    if reverse:
        logits = logits.flip(0)
    grads = {n: (p.grad.detach().double() / scale).cpu().numpy() for n, p in m.named_parameters()}
    finite = all(np.all(np.isfinite(g)) for g in grads.values())
    stats = {n: b.detach().double().cpu().numpy() for n, b in m.named_buffers()
             if n.endswith("running_mean") or n.endswith("running_var")}
    return {"logits": logits.detach().double().cpu().numpy(), "loss": float(loss),
            "gradients": grads, "running_stats": stats, "loss_scale": scale, "finite": finite}


def dlprobe_device(args, precision):
    if precision == "fp64" or args.device == "cpu":
        return "cpu"
    return args.device if ":" in args.device else "cuda:0"


def run_dlprobe(args, cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.step_timeout)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"dlprobe step exited {p.returncode}: {last}")


def dlprobe_step(args, precision, layout, files, tag, scale=None):
    out = os.path.join(files["dir"], f"dlprobe-{tag}.safetensors")
    state = os.path.join(files["dir"], f"dlprobe-{tag}-state.safetensors")
    device = dlprobe_device(args, precision)
    cmd = [args.dlprobe, "step", "--model", args.model, "--precision", precision, "--layout",
           layout, "--mode", "grads", "--device", device,
           "--weights", files["weights"], "--input", files["input"], "--output", out,
           "--state-output", state, "--overwrite"]
    if device == "cpu":
        cmd += ["--backend", "reference" if precision == "fp64" else args.cpu_backend]
    if scale is not None:
        cmd += ["--loss-scale", f"{scale:g}"]
    run_dlprobe(args, cmd)
    tensors, meta = load_safetensors(out)
    stats, _ = load_safetensors(state)
    scale = float(tensors["loss_scale"])
    names = [k for k in tensors if k not in ("logits", "loss", "loss_scale", "losses")]
    return {"logits": tensors["logits"].astype(np.float64), "loss": float(tensors["loss"]),
            "gradients": {n: tensors[n].astype(np.float64) / scale for n in names},
            "running_stats": {n: v.astype(np.float64) for n, v in stats.items()
                              if n.endswith("running_mean") or n.endswith("running_var")},
            "loss_scale": scale, "metadata": meta, "command": " ".join(cmd)}


def training_set(torch, images, classes, size, seed):
    """`images` images of `classes` classes, in class order cycled (every batch holds every
    class as evenly as it can): a fixed random template per class plus as much noise, so the
    classes can be learnt and the loss has somewhere to fall."""
    gen = torch.Generator().manual_seed(seed)
    templates = torch.randn(classes, 3, size, size, generator=gen)
    labels = torch.arange(images) % classes
    x = templates[labels] + torch.randn(images, 3, size, size, generator=gen)
    return x, labels


def torch_train(torch, model, images, labels, args, precision, device, sign=1.0, reverse=False):
    """--train-steps SGD steps (the engine's settings) over batches of --train-batch cycled; each
    step's gradients multiplied by `sign` before the update (the control: -1, negated);
    with `reverse` each batch's samples in reverse order. Returns the losses."""
    import torch.nn.functional as F
    torch_setup(torch, precision, device)
    layout = LAYOUT[precision]
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    m = copy.deepcopy(model).to(device).to(memory_format=fmt).train()
    opt = torch.optim.SGD(m.parameters(), lr=SGD["lr"], momentum=SGD["momentum"],
                          weight_decay=SGD["weight_decay"])
    scaler = (torch.cuda.amp.GradScaler(init_scale=FP16_LOSS_SCALE)
              if precision == "fp16" else None)
    batch = args.train_batch
    batches = images.shape[0] // batch
    losses = []
    for i in range(args.train_steps):
        first = (i % batches) * batch
        x = images[first:first + batch].to(device)
        y = labels[first:first + batch].to(device)
        if reverse:
            x, y = x.flip(0), y.flip(0)
        x = x.contiguous(memory_format=fmt)
        opt.zero_grad(set_to_none=False)
        ctx, _ = autocast(torch, precision, device)
        with ctx:
            logits = m(x)
        loss = F.cross_entropy(logits.float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if sign != 1.0:
            for p in m.parameters():
                p.grad.mul_(sign)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        losses.append(float(loss))
    return [float(v) for v in losses]


def dlprobe_train(args, precision, files):
    out = os.path.join(files["dir"], f"dlprobe-train-{precision}.safetensors")
    device = dlprobe_device(args, precision)
    cmd = [args.dlprobe, "step", "--model", args.train_model, "--precision", precision,
           "--layout", LAYOUT[precision], "--mode", "train", "--device", device,
           "--steps", str(args.train_steps), "--batch", str(args.train_batch),
           "--weights", files["train_weights"], "--input", files["train_input"], "--output", out,
           "--overwrite"]
    if device == "cpu":
        cmd += ["--backend", args.cpu_backend]
    run_dlprobe(args, cmd)
    tensors, _ = load_safetensors(out)
    return [float(v) for v in tensors["losses"]], " ".join(cmd)

# ---- the checks and their controls ------------------------------------------------------------

# Each check with its controls, and what each must give: the real comparison and PyTorch in
# another order pass, the sabotaged ones fail. A control that does not behave so makes the run
# "invalid": its bounds cannot tell a right result from a wrong one there.
STEP_ROWS = (("dlprobe", "dlprobe", True),
             ("pytorch_reordered", "PyTorch reordered", True),
             ("dlprobe_zeroed", "dlprobe, gradients zeroed", False),
             ("dlprobe_negated", "dlprobe, gradients negated", False))
CURVE_ROWS = (("dlprobe", "dlprobe", True),
              ("pytorch_reordered", "PyTorch reordered", True),
              ("pytorch_negated", "PyTorch, gradients negated", False))


def verdict_of(checks, rows):
    """pass: the real check passes and every control behaves; fail: the real check fails and the
    controls behave; invalid: a control does not."""
    controls_ok = all(checks[key]["pass"] == want for key, _, want in rows if key != "dlprobe")
    if not controls_ok:
        return "invalid"
    return "pass" if checks["dlprobe"]["pass"] else "fail"


def compare_step(dl, pt, pt_reordered, ref, tol):
    checks = {"dlprobe": check_step(dl, pt, tol),
              "pytorch_reordered": check_step(pt_reordered, pt, tol),
              "dlprobe_zeroed": check_step(sabotaged(dl, 0.0), pt, tol),
              "dlprobe_negated": check_step(sabotaged(dl, -1.0), pt, tol)}
    names = sorted(ref["gradients"])
    fp64 = {who: summarize(compare_sets(side["gradients"], ref["gradients"], names))
            for who, side in (("dlprobe", dl), ("pytorch", pt))}
    for who, side in (("dlprobe", dl), ("pytorch", pt)):
        fp64[who]["logits"] = rel_err(side["logits"], ref["logits"])
        fp64[who]["min_cos"] = min(cosine(side["gradients"][n], ref["gradients"][n])
                                   for n in names)
    g = checks["dlprobe"]["gradients"]
    worst5 = sorted(names, key=lambda n: g[n]["rel"], reverse=True)[:5]
    pt64 = compare_sets(pt["gradients"], ref["gradients"], names)
    return {"verdict": verdict_of(checks, STEP_ROWS), "checks": checks, "fp64": fp64,
            "loss": {"dlprobe": dl["loss"], "pytorch": pt["loss"], "fp64": ref["loss"]},
            "worst5": [{"name": n, **g[n], "pytorch_vs_fp64": pt64[n],
                        "norm": float(np.linalg.norm(ref["gradients"][n].ravel()))}
                       for n in worst5]}


def print_step(r):
    print(f"\n== {r['precision']} ({r['layout'].upper()}), loss scale {r.get('loss_scale', '-')}"
          + (f" (halved {r['loss_scale_backoffs']}x: PyTorch's gradients overflowed)"
             if r.get("loss_scale_backoffs") else "") + f": {r['verdict'].upper()}")
    if "error" in r:
        print(f"   error: {r['error']}")
        return
    tol = r["tolerance"]
    print(f"   {'against PyTorch ' + r['precision']:<28}{'grad rel worst':>15}{'grad cos min':>14}"
          f"{'logits rel':>12}{'logits cos':>12}{'loss rel':>10}  check")
    for key, label, want in STEP_ROWS:
        c = r["checks"][key]
        got = "pass" if c["pass"] else "FAIL"
        print(f"   {label:<28}{fmt_err(c['worst_rel']):>15}{c['min_cos']:>14.6f}"
              f"{fmt_err(c['logits']['rel']):>12}{c['logits']['cos']:>12.6f}"
              f"{fmt_err(c['loss']):>10}  {got} ({'must pass' if want else 'must fail'})")
    print(f"   {'bounds':<28}{'<= ' + format(tol['rel'], 'g'):>15}"
          f"{'>= ' + format(tol['cos'], 'g'):>14}{'<= ' + format(tol['logits'], 'g'):>12}"
          f"{'>= ' + format(tol['cos'], 'g'):>12}{'<= ' + format(tol['loss'], 'g'):>10}")
    f = r["fp64"]
    print(f"   against fp64 (information): PyTorch grad rel worst {fmt_err(f['pytorch']['worst'])} "
          f"median {fmt_err(f['pytorch']['median'])} cos min {f['pytorch']['min_cos']:.6f}; "
          f"dlprobe worst {fmt_err(f['dlprobe']['worst'])} median "
          f"{fmt_err(f['dlprobe']['median'])} cos min {f['dlprobe']['min_cos']:.6f}")
    print(f"   loss: dlprobe {r['loss']['dlprobe']:.9g}, PyTorch {r['loss']['pytorch']:.9g}, "
          f"fp64 {r['loss']['fp64']:.9g}")
    print("   worst 5 gradients (dlprobe vs PyTorch: rel, cos | PyTorch vs fp64 rel | norm):")
    for t in r["worst5"]:
        print(f"     {t['name']:<34}{fmt_err(t['rel']):>10}{t['cos']:>10.6f}"
              f"{fmt_err(t['pytorch_vs_fp64']):>10}{t['norm']:>11.3e}")
    for key, label, _ in STEP_ROWS:
        for reason in r["checks"][key]["reasons"][:4]:
            print(f"   - {label}: {reason}")


def print_training(t):
    c = t.get("config", {})
    print(f"\n== training: {c.get('model')} over {c.get('images')} images of {c.get('classes')} "
          f"classes at {c.get('image_size')}x{c.get('image_size')}, batch {c.get('batch')}, "
          f"{c.get('steps')} SGD steps, {t['precision']}: {t['verdict'].upper()}")
    if "error" in t:
        print(f"   error: {t['error']}")
        return
    print(f"   {'curve against PyTorch':<28}{'max |dloss|':>12}{'final':>11}{'PyTorch':>11}  check")
    for key, label, want in CURVE_ROWS:
        k = t["checks"][key]
        print(f"   {label:<28}{k['max_step_diff']:>12.4g}{k['final']:>11.4g}"
              f"{k['final_reference']:>11.4g}  {'pass' if k['pass'] else 'FAIL'} "
              f"({'must pass' if want else 'must fail'})")
    b = t["band"]
    print(f"   band: every step |dloss| <= {b['step_abs']:g} + {b['step_rel']:g} * loss; mean of "
          f"the last {b['tail']} steps within {b['final_abs']:g} + {b['final_rel']:g} * PyTorch's")
    idx = list(range(0, len(t["pytorch"]), max(len(t["pytorch"]) // 10, 1)))
    print("   step            " + "".join(f"{i:>9}" for i in idx))
    for key in ("pytorch", "dlprobe", "pytorch_negated"):
        print(f"   {key:<16}" + "".join(f"{t[key][i]:>9.3g}" for i in idx))
    for key, label, _ in CURVE_ROWS:
        for reason in t["checks"][key]["reasons"][:3]:
            print(f"   - {label}: {reason}")


def print_summary(results, training=None, title="summary"):
    print(f"\n== {title} (dlprobe against PyTorch in the same precision)")
    print(f"   {'check':<16}{'verdict':<9}{'grad rel worst':>15}{'grad cos min':>14}"
          f"{'logits rel':>12}{'loss rel':>10}  zeroed / negated / reordered")
    for r in results:
        if "error" in r:
            print(f"   {'step ' + r['precision']:<16}{r['verdict']:<9}  {r['error']}")
            continue
        c = r["checks"]
        d = c["dlprobe"]
        controls = " / ".join("pass" if c[k]["pass"] else "fail"
                              for k in ("dlprobe_zeroed", "dlprobe_negated", "pytorch_reordered"))
        print(f"   {'step ' + r['precision']:<16}{r['verdict']:<9}{fmt_err(d['worst_rel']):>15}"
              f"{d['min_cos']:>14.6f}{fmt_err(d['logits']['rel']):>12}{fmt_err(d['loss']):>10}"
              f"  {controls}")
    for t in training or []:
        if "error" in t:
            print(f"   {'train ' + t['precision']:<16}{t['verdict']:<9}  {t['error']}")
            continue
        k = t["checks"]
        print(f"   {'train ' + t['precision']:<16}{t['verdict']:<9}  max |dloss| "
              f"{k['dlprobe']['max_step_diff']:.3g}, final {k['dlprobe']['final']:.4g} vs "
              f"PyTorch {k['dlprobe']['final_reference']:.4g}; negated "
              f"{'pass' if k['pytorch_negated']['pass'] else 'fail'}, reordered "
              f"{'pass' if k['pytorch_reordered']['pass'] else 'fail'}")


def summarize_files(paths):
    """One table of several runs' results (e.g. one run per precision); exit 1 unless every
    check passes."""
    results, training, ok = [], [], True
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print(f"{path}: {e}")
            ok = False
            continue
        c = doc["config"]
        runs = ([f"{c['model']} batch {c['batch']} at {c['image_size']}"]
                if doc.get("results") else [])
        runs += [f"training {t['config']['model']} at {t['config']['image_size']}, {t['precision']}"
                 for t in doc.get("training", [])]
        print(f"{path}: {'; '.join(runs) or 'nothing run'}, {c['device']}"
              f"{', ' + c['gpu'] if 'gpu' in c else ''}; PyTorch {c['torch']}; "
              f"{c.get('dlprobe_build') or c['dlprobe']}")
        results += doc.get("results", [])
        training += doc.get("training", [])
        if "engine_fp64" in doc:
            e = doc["engine_fp64"]
            print(f"   engine fp64 vs PyTorch fp64: {e['verdict']}"
                  + (f" ({e['error']})" if "error" in e else
                     f", gradients worst {fmt_err(e['gradients']['worst'])}"))
            ok = ok and e["verdict"] == "pass"
    if results or training:
        print_summary(results, training, "all runs")
    verdicts = [r["verdict"] for r in results + training]
    return 0 if ok and verdicts and all(v == "pass" for v in verdicts) else 1


def find_dlprobe(given):
    if given:
        return given
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    for candidate in (os.path.join(root, ".devbuild", "bin", "dlprobe"),
                      os.path.join(root, "build", "dlprobe")):
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("dlprobe") or "dlprobe"


def run_engine_fp64(args, files, ref):
    """The engine's own float64 step (reference backend) against PyTorch's: no rounding to hide
    behind, so this checks the math itself (~1e-12 when it is right)."""
    r = {"precision": "fp64", "layout": "nchw", "tolerance": args.fp64_tolerance}
    try:
        t0 = time.perf_counter()
        dl = dlprobe_step(args, "fp64", "nchw", files, "fp64")
        r["dlprobe_seconds"] = time.perf_counter() - t0
        names = sorted(ref["gradients"])
        r["logits"] = rel_err(dl["logits"], ref["logits"])
        r["loss_error"] = rel_err(dl["loss"], ref["loss"])
        r["gradients"] = summarize(compare_sets(dl["gradients"], ref["gradients"], names))
        worst = max(r["logits"], r["loss_error"], r["gradients"]["worst"])
        r["verdict"] = "pass" if worst <= args.fp64_tolerance else "fail"
    except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
        r["verdict"], r["error"] = "error", str(e)
    print(f"\n== engine fp64 (reference backend) vs PyTorch fp64: {r['verdict'].upper()}")
    if "error" in r:
        print(f"   error: {r['error']}")
    else:
        g = r["gradients"]
        print(f"   logits {fmt_err(r['logits'])}, loss {fmt_err(r['loss_error'])}, gradients "
              f"worst {fmt_err(g['worst'])} ({g['worst_tensor']}), median "
              f"{fmt_err(g['median'])}; bound {args.fp64_tolerance:g}")
    return r


def run_precision(torch, args, p, model, images, labels, device, files, ref):
    layout = LAYOUT[p]
    r = {"precision": p, "layout": layout, "tolerance": TOLERANCES[p]}
    try:
        if p == "tf32" and device.type == "cpu":
            raise RuntimeError("tf32 needs a GPU: on the CPU both sides compute fp32")
        t0 = time.perf_counter()
        scale = args.fp16_loss_scale if p == "fp16" else 1.0
        pt = torch_step(torch, model, images, labels, p, layout, device, scale)
        # GradScaler skips a step whose gradients overflow and halves the scale; one step is
        # compared here, so back off the same way until PyTorch's gradients are finite.
        backoffs = 0
        while p == "fp16" and not pt["finite"] and scale > 1.0:
            scale /= 2
            backoffs += 1
            pt = torch_step(torch, model, images, labels, p, layout, device, scale)
        r["loss_scale_backoffs"] = backoffs
        # The same step in another order: the batch reversed, the other memory format (other
        # kernels, other summation orders). Two right answers; the bounds must take both.
        other = "nchw" if layout == "nhwc" else "nhwc"
        pt_reordered = torch_step(torch, model, images, labels, p, other, device, scale,
                                  reverse=True)
        r["pytorch_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        dl = dlprobe_step(args, p, layout, files, p, scale if p == "fp16" else None)
        r["dlprobe_seconds"] = time.perf_counter() - t0
        r["dlprobe_command"] = dl["command"]
        r["dlprobe_build"] = dl["metadata"].get("producer")
        if dl["loss_scale"] != pt["loss_scale"]:
            raise RuntimeError(f"dlprobe used loss scale {dl['loss_scale']:g}, PyTorch "
                               f"{pt['loss_scale']:g}")
        r["loss_scale"] = dl["loss_scale"]
        r.update(compare_step(dl, pt, pt_reordered, ref, TOLERANCES[p]))
    except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
        r["verdict"], r["error"] = "error", str(e)
    return r


def run_training(torch, torchvision, args, p, device, work):
    t = {"precision": p, "band": curve_band(p),
         "config": {"model": args.train_model, "images": args.train_images,
                    "classes": args.train_classes, "image_size": args.train_image_size,
                    "batch": args.train_batch, "steps": args.train_steps, "sgd": SGD,
                    "residual_gamma": args.residual_gamma, "seed": args.seed}}
    try:
        if p == "tf32" and device.type == "cpu":
            raise RuntimeError("tf32 needs a GPU: on the CPU both sides compute fp32")
        torch.manual_seed(args.seed)
        model = getattr(torchvision.models, args.train_model)(num_classes=args.train_classes)
        set_residual_gamma(torch, model, args.residual_gamma)
        images, labels = training_set(torch, args.train_images, args.train_classes,
                                      args.train_image_size, args.seed + 2)
        files = {"dir": work, "train_weights": os.path.join(work, "train-weights.safetensors"),
                 "train_input": os.path.join(work, "train-input.safetensors")}
        save_safetensors(files["train_weights"], {k: v.detach().cpu().contiguous().numpy()
                                                  for k, v in model.state_dict().items()})
        save_safetensors(files["train_input"], {"images": images.numpy(),
                                                "labels": labels.numpy()})
        t0 = time.perf_counter()
        t["pytorch"] = torch_train(torch, model, images, labels, args, p, device)
        t["pytorch_reordered"] = torch_train(torch, model, images, labels, args, p, device,
                                             reverse=True)
        t["pytorch_negated"] = torch_train(torch, model, images, labels, args, p, device,
                                           sign=-1.0)
        t["pytorch_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        t["dlprobe"], t["dlprobe_command"] = dlprobe_train(args, p, files)
        t["dlprobe_seconds"] = time.perf_counter() - t0
        batches = args.train_images // args.train_batch
        t["checks"] = {key: check_curve(t[key], t["pytorch"], t["band"], batches)
                       for key, _, _ in CURVE_ROWS}
        t["verdict"] = verdict_of(t["checks"], CURVE_ROWS)
    except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
        t["verdict"], t["error"] = "error", str(e)
    return t


def run(args):
    import torch
    import torchvision
    if args.device != "cpu" and not torch.cuda.is_available():
        print("compare_pytorch.py: no CUDA device for PyTorch; use --device cpu", file=sys.stderr)
        return 2
    device = torch.device(args.device if args.device != "cuda" else "cuda:0")
    ref_device = torch.device(args.reference_device or device)
    # On the CPU tf32 has no counterpart (both sides would run fp32), and fp16 autocast exists
    # only in newer PyTorch versions: ask for it explicitly there.
    default = "fp32,bf16" if args.device == "cpu" else ",".join(PRECISIONS)
    precisions = [p for p in (args.precisions if args.precisions is not None
                              else default).split(",") if p]
    train_precisions = [p for p in (args.train_precisions or "fp32").split(",") if p]
    for p in precisions + train_precisions:
        if p not in PRECISIONS:
            print(f"compare_pytorch.py: unknown precision '{p}' (expected one of "
                  f"{', '.join(PRECISIONS)})", file=sys.stderr)
            return 2

    work = args.workdir or tempfile.mkdtemp(prefix="dlprobe-peers-")
    os.makedirs(work, exist_ok=True)
    config = {"model": args.model, "batch": args.batch, "image_size": args.image_size,
              "classes": args.classes, "seed": args.seed, "residual_gamma": args.residual_gamma,
              "device": str(device), "reference": f"PyTorch float64 on {ref_device}",
              "torch": torch.__version__, "torchvision": torchvision.__version__,
              "numpy": np.__version__, "python": platform.python_version(), "files": work,
              "dlprobe": args.dlprobe, "cpu_backend": args.cpu_backend}
    if device.type == "cuda":
        config["gpu"] = torch.cuda.get_device_name(device)
        config["cuda"] = torch.version.cuda
        config["cudnn"] = torch.backends.cudnn.version()
    doc = {"schema": "dlprobe.peers.pytorch/2", "config": config, "tolerances": TOLERANCES,
           "curve_bands": CURVE_BANDS, "sgd": SGD, "results": [], "training": []}

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)

    if precisions or args.engine_fp64:
        torch.manual_seed(args.seed)
        model = getattr(torchvision.models, args.model)(num_classes=args.classes)
        set_residual_gamma(torch, model, args.residual_gamma)
        gen = torch.Generator().manual_seed(args.seed + 1)
        images = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=gen)
        labels = torch.randint(0, args.classes, (args.batch,), generator=gen)
        files = {"dir": work, "weights": os.path.join(work, "weights.safetensors"),
                 "input": os.path.join(work, "input.safetensors")}
        save_safetensors(files["weights"], {k: v.detach().cpu().contiguous().numpy()
                                            for k, v in model.state_dict().items()})
        save_safetensors(files["input"], {"images": images.numpy(), "labels": labels.numpy()})
        print(f"compare_pytorch: {args.model} batch {args.batch} at {args.image_size}x"
              f"{args.image_size}, {args.classes} classes, seed {args.seed}, residual gamma "
              f"{args.residual_gamma:g}; PyTorch {torch.__version__} on {device}; reference fp64 "
              f"on {ref_device}; files in {work}", flush=True)
        t0 = time.perf_counter()
        ref = torch_step(torch, model, images, labels, "fp64", "nchw", ref_device)
        config["reference_seconds"] = time.perf_counter() - t0
        if args.engine_fp64:
            doc["engine_fp64"] = run_engine_fp64(args, files, ref)
            save()
        for p in precisions:
            r = run_precision(torch, args, p, model, images, labels, device, files, ref)
            config.setdefault("dlprobe_build", r.get("dlprobe_build"))
            doc["results"].append(r)
            print_step(r)
            sys.stdout.flush()
            save()

    if args.train_steps > 0:
        for p in train_precisions:
            t = run_training(torch, torchvision, args, p, device, work)
            doc["training"].append(t)
            print_training(t)
            sys.stdout.flush()
            save()

    print_summary(doc["results"], doc["training"])
    save()
    if args.json:
        print(f"\nwrote {args.json}")
    verdicts = [r["verdict"] for r in doc["results"] + doc["training"]]
    if "engine_fp64" in doc:
        verdicts.append(doc["engine_fp64"]["verdict"])
    return 0 if verdicts and all(v == "pass" for v in verdicts) else 1

# ---- self-test --------------------------------------------------------------------------------

def self_test():
    """The helpers on known values, and the checks against sabotage; numpy only."""
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    a = np.array([3.0, 4.0])
    check(rel_err(a, a) == 0.0, "rel_err of equal arrays is 0")
    check(abs(rel_err(np.array([3.0, 5.0]), a) - 0.2) < 1e-15, "rel_err([3,5],[3,4]) = 1/5")
    check(rel_err(np.zeros(2), np.zeros(2)) == 0.0, "0 against 0 is 0")
    check(math.isinf(rel_err(np.ones(2), np.zeros(2))), "anything against 0 is inf")
    check(math.isinf(rel_err(np.array([np.nan, 1.0]), a)), "NaN is inf")
    check(math.isinf(rel_err(np.array([np.inf, 1.0]), a)), "inf is inf")
    check(abs(rel_err(2.0, 1.0) - 1.0) < 1e-15, "scalars")
    try:
        rel_err(np.ones(2), np.ones(3))
        failures.append("shape mismatch raises")
    except ValueError:
        pass
    check(abs(cosine(a, a) - 1.0) < 1e-15, "cosine of a with itself is 1")
    check(abs(cosine(-a, a) + 1.0) < 1e-15, "cosine of -a with a is -1")
    check(abs(cosine(np.array([4.0, -3.0]), a)) < 1e-15, "orthogonal: cosine 0")
    check(cosine(np.zeros(2), a) == 0.0, "zero against non-zero: cosine 0")
    check(cosine(np.zeros(2), np.zeros(2)) == 1.0, "zero against zero: cosine 1")
    check(cosine(np.array([np.nan, 1.0]), a) == -math.inf, "NaN: cosine -inf")

    s = summarize({"a": 1e-6, "b": 3e-5, "c": 2e-6, "d": 5e-7, "e": 4e-6, "f": 1e-7})
    check(s["worst"] == 3e-5 and s["worst_tensor"] == "b", "worst")
    check(abs(s["median"] - 1.5e-6) < 1e-20, "median of six")
    check([t["name"] for t in s["worst5"]] == ["b", "e", "c", "a", "d"], "five worst in order")
    check(summarize({})["count"] == 0, "empty summary")

    # A step and a copy of it with independent noise per tensor at a fraction of each bound: the
    # noisy copy passes, zeroed and negated gradients fail, in every precision; noise past the
    # bound fails.
    rng = np.random.default_rng(0)
    shapes = {"conv1.weight": (8, 3, 3, 3), "bn1.weight": (8,), "fc.weight": (10, 8),
              "fc.bias": (10,)}
    exact = {"logits": rng.standard_normal((4, 10)), "loss": 2.3,
             "gradients": {n: rng.standard_normal(s) * 10.0 ** rng.uniform(-3, 1)
                           for n, s in shapes.items()}}

    def noisy(step, level):
        def add(x):
            x = np.asarray(x, np.float64)
            e = rng.standard_normal(x.shape)
            return x + level * np.linalg.norm(x) / max(np.linalg.norm(e), 1e-300) * e
        return {"logits": add(step["logits"]), "loss": step["loss"] * (1 + level),
                "gradients": {n: add(g) for n, g in step["gradients"].items()}}

    for p, tol in TOLERANCES.items():
        level = 0.3 * min(tol["rel"], tol["logits"], tol["loss"])
        close = noisy(exact, level)
        check(check_step(close, exact, tol)["pass"], f"{p}: noise at 0.3x the bounds passes")
        check(not check_step(sabotaged(close, 0.0), exact, tol)["pass"],
              f"{p}: a zeroed gradient fails")
        check(not check_step(sabotaged(close, -1.0), exact, tol)["pass"],
              f"{p}: a negated gradient fails")
        far = {**close, "gradients": noisy(exact, 2.0 * tol["rel"])["gradients"]}
        check(not check_step(far, exact, tol)["pass"], f"{p}: noise at 2x the bound fails")
        one = copy.deepcopy(close)
        one["gradients"]["fc.bias"] = -one["gradients"]["fc.bias"]
        check(not check_step(one, exact, tol)["pass"], f"{p}: one negated tensor fails")
        checks = {"dlprobe": check_step(close, exact, tol),
                  "pytorch_reordered": check_step(noisy(exact, level), exact, tol),
                  "dlprobe_zeroed": check_step(sabotaged(close, 0.0), exact, tol),
                  "dlprobe_negated": check_step(sabotaged(close, -1.0), exact, tol)}
        check(verdict_of(checks, STEP_ROWS) == "pass", f"{p}: verdict pass")
        checks["dlprobe_negated"] = check_step(close, exact, tol)
        check(verdict_of(checks, STEP_ROWS) == "invalid",
              f"{p}: a sabotaged control that passes makes the run invalid")

    # Loss curves: the shape of the default run (a fall from ln 10 towards 0 over 200 steps, each
    # of 4 batches its own loss). A curve a little off passes; one that climbs (as under negated
    # gradients), one that stays flat (zeroed) and one that ends far off fail; a reference that
    # does not fall proves nothing.
    steps, batches = 200, 4
    t = np.arange(steps)
    ref = 2.3 * np.exp(-t / 40.0) * (1 + 0.2 * np.sin(t * 2 * np.pi / batches)) + 0.01
    for name, band in CURVE_BANDS.items():
        near = ref * (1 + 0.2 * band["step_rel"] * rng.standard_normal(steps))
        check(check_curve(near, ref, band, batches)["pass"], f"{name}: a curve near it passes")
        climbing = 2.3 + t / 20.0
        check(not check_curve(climbing, ref, band, batches)["pass"],
              f"{name}: a climbing curve fails")
        flat = np.full(steps, 2.3)
        check(not check_curve(flat, ref, band, batches)["pass"], f"{name}: a flat curve fails")
        late = ref.copy()
        late[-20:] = 0.5
        check(not check_curve(late, ref, band, batches)["pass"],
              f"{name}: a curve off at the end fails")
        nan = ref.copy()
        nan[100:] = np.nan
        res = check_curve(nan, ref, band, batches)
        check(not res["pass"] and "step 100 on" in res["reasons"][0], f"{name}: a NaN loss fails")
        check(not check_curve(flat, flat, band, batches)["pass"],
              f"{name}: a reference that does not fall fails")

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.safetensors")
        tensors = {"w": np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2),
                   "n": np.array(7, dtype=np.int64), "x": np.linspace(0, 1, 5),
                   "l": np.array([1, 2, 3], dtype=np.int64)}
        save_safetensors(path, tensors, {"k": "v"})
        with open(path, "rb") as f:
            raw = f.read()
        (n,) = struct.unpack("<Q", raw[:8])
        check(n % 8 == 0, "header padded to 8 bytes")
        back, meta = load_safetensors(path)
        check(meta == {"k": "v"}, "metadata round trip")
        for k, v in tensors.items():
            check(back[k].dtype == v.dtype and back[k].shape == v.shape
                  and np.array_equal(back[k], v), f"round trip of {k}")
        # BF16, which numpy lacks: 1.0 is 0x3F80, -2.5 is 0xC020.
        header = json.dumps({"b": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
        header += b" " * ((8 - len(header) % 8) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header + struct.pack("<HH", 0x3F80, 0xC020))
        back, _ = load_safetensors(path)
        check(np.array_equal(back["b"], np.array([1.0, -2.5], np.float32)), "BF16 widened")
        try:
            import safetensors.numpy as stn  # where installed, our files must read there too
            save_safetensors(path, tensors)
            theirs = stn.load_file(path)
            check(all(np.array_equal(theirs[k], v) for k, v in tensors.items()),
                  "safetensors.numpy reads our file")
            stn.save_file({k: v for k, v in tensors.items()}, path)
            ours, _ = load_safetensors(path)
            check(all(np.array_equal(ours[k], v) for k, v in tensors.items()),
                  "we read safetensors.numpy's file")
            print("self-test: cross-checked with the safetensors package")
        except ImportError:
            print("self-test: safetensors package not installed; own format code only")

    for f in failures:
        print(f"self-test FAILED: {f}")
    print(f"self-test: {len(failures)} failed")
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 2)[2])
    p.add_argument("--dlprobe", help="the dlprobe binary (default: .devbuild/bin/dlprobe, "
                                     "build/dlprobe, then PATH)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--cpu-backend", default="reference", choices=["reference", "onednn"],
                   help="dlprobe's backend with --device cpu (default reference; fp64 always "
                        "runs there)")
    p.add_argument("--reference-device",
                   help="where PyTorch's float64 step runs (default: --device)")
    p.add_argument("--model", default="resnet50",
                   choices=["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--residual-gamma", type=float, default=0.2,
                   help="the last BN weight of every residual block at the start (default 0.2: "
                        "the well-conditioned setup; 1 is torchvision's)")
    p.add_argument("--precisions",
                   help="comma-separated subset of fp32,tf32,fp16,bf16 for the one-step check "
                        "(default: all four on a GPU, fp32,bf16 on the CPU; empty: none)")
    p.add_argument("--engine-fp64", action=argparse.BooleanOptionalAction, default=None,
                   help="also run the engine's float64 step on the CPU reference backend against "
                        "PyTorch's (default: on with --device cpu; slow for resnet50 at 224)")
    p.add_argument("--fp16-loss-scale", type=float, default=FP16_LOSS_SCALE,
                   help="fp16's first loss scale, halved while PyTorch's gradients overflow "
                        "(default 65536, GradScaler's)")
    p.add_argument("--fp64-tolerance", type=float, default=1e-9,
                   help="bound for the engine's fp64 step against PyTorch's (default 1e-9)")
    p.add_argument("--train-steps", type=int, default=200,
                   help="SGD steps of the training run (default 200; 0: no training run)")
    p.add_argument("--train-model", default="resnet18",
                   choices=["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"])
    p.add_argument("--train-images", type=int, default=64)
    p.add_argument("--train-classes", type=int, default=10)
    p.add_argument("--train-image-size", type=int, default=32)
    p.add_argument("--train-batch", type=int, default=16)
    p.add_argument("--train-precisions", default="fp32",
                   help="comma-separated precisions of the training run (default fp32)")
    p.add_argument("--step-timeout", type=float, default=600,
                   help="seconds one dlprobe run may take (default 600)")
    p.add_argument("--workdir", help="keep the safetensors files here (default: a temp folder)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--self-test", action="store_true",
                   help="check the helpers, and that the checks fail on sabotage (numpy only)")
    p.add_argument("--summarize", nargs="+", metavar="JSON",
                   help="only print one summary table of earlier --json files (numpy only)")
    args = p.parse_args()
    if args.self_test:
        return self_test()
    if args.summarize:
        return summarize_files(args.summarize)
    for name in ("batch", "image_size", "classes", "train_images", "train_classes",
                 "train_image_size", "train_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.train_steps < 0:
        p.error("--train-steps must be >= 0")
    if args.train_images % args.train_batch != 0:
        p.error(f"--train-batch {args.train_batch} must divide --train-images "
                f"{args.train_images}")
    args.dlprobe = find_dlprobe(args.dlprobe)
    if args.engine_fp64 is None:
        args.engine_fp64 = args.device == "cpu"
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
