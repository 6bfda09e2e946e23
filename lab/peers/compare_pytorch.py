#!/usr/bin/env python3
"""One training step of dlprobe's native engine against PyTorch's, tensor by tensor.

Builds torchvision's ResNet (random initialisation from a fixed seed) and a fixed random batch,
saves both as safetensors, runs PyTorch's step and `dlprobe step` on the same files per precision,
and compares the logits, the loss and every parameter gradient; both are also compared with the
same step in float64 (PyTorch, the exact reference), which shows who is closer to exact when they
disagree.

    python3 lab/peers/compare_pytorch.py --json peers.json                 # H200: resnet50 bs32
    python3 lab/peers/compare_pytorch.py --device cpu --model resnet18 \\
        --batch 4 --image-size 32 --classes 10 --precisions fp32,bf16        # no GPU

The step, as the engine defines it (docs/engine-step.md) and PyTorch runs it here: BN in train
mode (batch statistics), forward, cross-entropy mean over the batch in fp32, backward, no
optimizer (grads mode). fp32: TF32 off. tf32: TF32 on for convolutions and matrix products. fp16:
torch.autocast(float16) with the loss multiplied by 65536 before backward (GradScaler's initial
scale, so its gradients are 65536x; both sides' gradients are divided by their reported scale
before comparing). bf16: autocast(bfloat16), no scaling. fp16/bf16 run channels_last (NHWC),
fp32/tf32 NCHW.

Relative error of a tensor a against a reference b: ||a - b|| / ||b|| (2-norm over all elements,
in float64); non-finite values count as infinite error. Needs torch, torchvision and numpy; the
safetensors files are written and read here (the format is a length, a JSON header and raw bytes),
so the `safetensors` package is not needed. --self-test checks the comparison helpers with numpy
alone.
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

# How far two correct implementations of the same step may drift apart, per precision. Two
# implementations round differently (other convolution algorithms, other summation orders), and
# the step is ~50 convolutions deep forwards and again backwards, so per-op rounding grows with
# depth. u below is the unit roundoff of what gets rounded.
TOLERANCES = {
    # The agreement bound is 1e-4. u = 2^-24 (6e-8) per op; with reductions over up to N*H*W = 400k
    # terms (weight gradients, batch norm) summed in different orders the drift is ~1e-6..1e-5.
    "fp32": {"logits": 1e-4, "loss": 1e-4, "gradients": 1e-4,
             "why": "the agreement bound; fp32 rounding (u = 6e-8) over the network's depth and its "
                    "400k-term reductions stays near 1e-5"},
    # TF32 rounds the inputs of every convolution and matrix product to 10 mantissa bits
    # (u = 2^-11 = 4.9e-4); fp32 accumulation. Independent roundings over ~100 dependent products
    # (forward + backward) grow like sqrt(100) * u = 5e-3; gradients of the first layers see all of
    # them, hence 2e-2.
    "tf32": {"logits": 1e-2, "loss": 1e-2, "gradients": 2e-2,
             "why": "TF32 inputs carry 10 mantissa bits (u = 4.9e-4); ~100 dependent products give "
                    "sqrt(100) * u = 5e-3, doubled for the gradients of the first layers"},
    # fp16 activations and gradients are stored with 10 mantissa bits (u = 4.9e-4) after every op,
    # not only at product inputs, so a little looser than tf32.
    "fp16": {"logits": 2e-2, "loss": 1e-2, "gradients": 5e-2,
             "why": "every fp16 activation and gradient is rounded to 10 mantissa bits "
                    "(u = 4.9e-4) after each op: ~5e-3 drift at the logits, more at the first "
                    "layers' gradients"},
    # bf16 keeps 7 mantissa bits (u = 2^-8 = 3.9e-3): eight times fp16's rounding.
    "bf16": {"logits": 1e-1, "loss": 5e-2, "gradients": 2e-1,
             "why": "bf16 keeps 7 mantissa bits (u = 3.9e-3, 8x fp16's): sqrt(100) * u = 4e-2 at "
                    "the logits, more at the first layers' gradients"},
}
# When dlprobe and PyTorch miss the tolerance, the step may be ill-conditioned for this model and
# batch (tiny batches: BN over few values, ReLU ties): then both are far from fp64. The engine
# still counts as correct where it is no farther from fp64 than this factor times PyTorch.
AS_EXACT_FACTOR = 2.0


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


def verdict(quantities, tolerance):
    """quantities: {q: {"dlprobe_vs_pytorch", "dlprobe_vs_fp64", "pytorch_vs_fp64"}} with each an
    error (or for "gradients" a {tensor: error} dict). Returns (verdict, reasons):
    agree     every quantity within tolerance of PyTorch;
    as_exact  some are not, but each of those is no farther from fp64 than AS_EXACT_FACTOR times
              PyTorch's own distance from fp64 (the disagreement is PyTorch's rounding as much as
              the engine's);
    fail      otherwise."""
    reasons, missed, all_as_exact = [], False, True
    for q, errs in quantities.items():
        tol = tolerance[q]
        vs_pt, vs_64, pt_64 = (errs["dlprobe_vs_pytorch"], errs["dlprobe_vs_fp64"],
                               errs["pytorch_vs_fp64"])
        items = vs_pt.items() if isinstance(vs_pt, dict) else [(q, vs_pt)]
        for name, e in items:
            if e <= tol:
                continue
            missed = True
            d64 = vs_64[name] if isinstance(vs_64, dict) else vs_64
            p64 = pt_64[name] if isinstance(pt_64, dict) else pt_64
            exact = d64 <= AS_EXACT_FACTOR * p64
            all_as_exact = all_as_exact and exact
            reasons.append(f"{name}: {e:.2e} from PyTorch > {tol:g}; vs fp64 dlprobe {d64:.2e}, "
                           f"PyTorch {p64:.2e}" + (" (as exact)" if exact else ""))
    if not missed:
        return "agree", reasons
    return ("as_exact" if all_as_exact else "fail"), reasons


def fmt_err(e):
    return "-" if e is None else ("inf" if math.isinf(e) else f"{e:.2e}")


# ---- the steps --------------------------------------------------------------------------------

def torch_step(torch, model, images, labels, precision, layout, device, scale=1.0):
    """One step as the engine defines it, the loss multiplied by `scale` before backward; returns
    logits (fp32 or fp64), loss, unscaled gradients and BN running statistics, all as float64
    numpy arrays, whether every gradient was finite, and the scale."""
    import torch.nn.functional as F
    is64 = precision == "fp64"
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    m = copy.deepcopy(model).to(device)
    if is64:
        m = m.double()
    m = m.to(memory_format=fmt).train()
    x = images.to(device, torch.float64 if is64 else torch.float32).contiguous(memory_format=fmt)
    y = labels.to(device)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    ctx = (torch.autocast(device_type=device.type, dtype=dtype) if dtype is not None
           else contextlib.nullcontext())
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
    grads = {n: (p.grad.detach().double() / scale).cpu().numpy() for n, p in m.named_parameters()}
    finite = all(np.all(np.isfinite(g)) for g in grads.values())
    stats = {n: b.detach().double().cpu().numpy() for n, b in m.named_buffers()
             if n.endswith("running_mean") or n.endswith("running_var")}
    return {"logits": logits.detach().double().cpu().numpy(), "loss": float(loss),
            "gradients": grads, "running_stats": stats, "loss_scale": scale, "finite": finite}


def dlprobe_step(args, precision, layout, files, tag, scale=None):
    out = os.path.join(files["dir"], f"dlprobe-{tag}.safetensors")
    state = os.path.join(files["dir"], f"dlprobe-{tag}-state.safetensors")
    device = "cpu" if args.device == "cpu" else args.device if ":" in args.device else "cuda:0"
    cmd = [args.dlprobe, "step", "--model", args.model, "--precision", precision, "--layout",
           layout, "--mode", "grads", "--device", "cpu" if precision == "fp64" else device,
           "--weights", files["weights"], "--input", files["input"], "--output", out,
           "--state-output", state, "--overwrite"]
    if scale is not None:
        cmd += ["--loss-scale", f"{scale:g}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.step_timeout)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"dlprobe step exited {p.returncode}: {last}")
    tensors, meta = load_safetensors(out)
    stats, _ = load_safetensors(state)
    scale = float(tensors["loss_scale"])
    names = [k for k in tensors if k not in ("logits", "loss", "loss_scale")]
    return {"logits": tensors["logits"].astype(np.float64), "loss": float(tensors["loss"]),
            "gradients": {n: tensors[n].astype(np.float64) / scale for n in names},
            "running_stats": {n: v.astype(np.float64) for n, v in stats.items()
                              if n.endswith("running_mean") or n.endswith("running_var")},
            "loss_scale": scale, "metadata": meta, "command": " ".join(cmd)}


def compare(dl, pt, ref, tolerance):
    names = sorted(ref["gradients"])
    for side, what in ((dl, "dlprobe"), (pt, "PyTorch")):
        missing = set(names) - set(side["gradients"])
        if missing:
            raise RuntimeError(f"{what} has no gradient for {sorted(missing)[:3]}")
    q = {
        "logits": {"dlprobe_vs_pytorch": rel_err(dl["logits"], pt["logits"]),
                   "dlprobe_vs_fp64": rel_err(dl["logits"], ref["logits"]),
                   "pytorch_vs_fp64": rel_err(pt["logits"], ref["logits"])},
        "loss": {"dlprobe_vs_pytorch": rel_err(dl["loss"], pt["loss"]),
                 "dlprobe_vs_fp64": rel_err(dl["loss"], ref["loss"]),
                 "pytorch_vs_fp64": rel_err(pt["loss"], ref["loss"])},
        "gradients": {"dlprobe_vs_pytorch": compare_sets(dl["gradients"], pt["gradients"], names),
                      "dlprobe_vs_fp64": compare_sets(dl["gradients"], ref["gradients"], names),
                      "pytorch_vs_fp64": compare_sets(pt["gradients"], ref["gradients"], names)},
    }
    v, reasons = verdict(q, tolerance)
    stat_names = sorted(ref["running_stats"])
    stats = {k: summarize(compare_sets(a, b, stat_names))
             for k, (a, b) in {"dlprobe_vs_pytorch": (dl["running_stats"], pt["running_stats"]),
                               "dlprobe_vs_fp64": (dl["running_stats"], ref["running_stats"]),
                               "pytorch_vs_fp64": (pt["running_stats"], ref["running_stats"])
                               }.items()}
    grads = q["gradients"]
    per_tensor = [{"name": n, "norm": float(np.linalg.norm(ref["gradients"][n].ravel())),
                   **{k: grads[k][n] for k in grads}} for n in names]
    return {
        "verdict": v, "reasons": reasons,
        "loss": {"dlprobe": dl["loss"], "pytorch": pt["loss"], "fp64": ref["loss"]},
        "logits": q["logits"], "loss_error": q["loss"],
        "gradients": {k: summarize(grads[k]) for k in grads},
        "worst5": sorted(per_tensor, key=lambda t: t["dlprobe_vs_pytorch"], reverse=True)[:5],
        "per_tensor": per_tensor,
        "running_stats": stats,
    }


def print_result(r):
    backoffs = r.get("loss_scale_backoffs", 0)
    print(f"\n== {r['precision']} ({r['layout'].upper()}), loss scale {r.get('loss_scale', '-')}"
          + (f" (halved {backoffs}x: PyTorch's gradients overflowed)" if backoffs else "")
          + f": {r['verdict'].upper()}")
    if "error" in r:
        print(f"   error: {r['error']}")
        return
    tol = r["tolerance"]
    cols = ("dlprobe_vs_pytorch", "dlprobe_vs_fp64", "pytorch_vs_fp64")
    print(f"   {'quantity':<26}{'dlprobe vs PyTorch':>20}{'dlprobe vs fp64':>18}"
          f"{'PyTorch vs fp64':>18}{'tolerance':>11}")

    def row(label, errs, t):
        print(f"   {label:<26}" + "".join(f"{fmt_err(errs[c]):>{w}}"
                                         for c, w in zip(cols, (20, 18, 18))) + f"{t:>11}")
    row("logits", r["logits"], f"{tol['logits']:g}")
    row("loss", r["loss_error"], f"{tol['loss']:g}")
    g = r["gradients"]
    row(f"gradients worst ({g['dlprobe_vs_pytorch']['count']})",
        {c: g[c]["worst"] for c in cols}, f"{tol['gradients']:g}")
    row("gradients median", {c: g[c]["median"] for c in cols}, "")
    s = r["running_stats"]
    row("BN running stats worst", {c: s[c]["worst"] for c in cols}, "(info)")
    print(f"   loss: dlprobe {r['loss']['dlprobe']:.9g}, PyTorch {r['loss']['pytorch']:.9g}, "
          f"fp64 {r['loss']['fp64']:.9g}")
    print("   worst 5 gradients (dlprobe vs PyTorch | dlprobe vs fp64 | PyTorch vs fp64 | norm):")
    for t in r["worst5"]:
        print(f"     {t['name']:<34}{fmt_err(t['dlprobe_vs_pytorch']):>10}"
              f"{fmt_err(t['dlprobe_vs_fp64']):>10}{fmt_err(t['pytorch_vs_fp64']):>10}"
              f"{t['norm']:>11.3e}")
    for reason in r["reasons"][:10]:
        print(f"   - {reason}")


def print_summary(results, title="summary"):
    print(f"\n== {title} (relative error ||a-b||/||b||; reference fp64 = PyTorch float64)")
    print(f"   {'precision':<10}{'verdict':<10}{'logits':>10}{'loss':>10}{'grad worst':>12}"
          f"{'grad median':>13}  worst tensor (dlprobe vs PyTorch)")
    for r in results:
        if "error" in r:
            print(f"   {r['precision']:<10}{r['verdict']:<10}  {r['error']}")
            continue
        g = r["gradients"]["dlprobe_vs_pytorch"]
        print(f"   {r['precision']:<10}{r['verdict']:<10}"
              f"{fmt_err(r['logits']['dlprobe_vs_pytorch']):>10}"
              f"{fmt_err(r['loss_error']['dlprobe_vs_pytorch']):>10}{fmt_err(g['worst']):>12}"
              f"{fmt_err(g['median']):>13}  {g['worst_tensor']}")


def summarize_files(paths):
    """One table of several runs' results (e.g. one run per precision); exit 1 unless every
    result agrees or is as exact."""
    results, ok = [], True
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print(f"{path}: {e}")
            ok = False
            continue
        c = doc["config"]
        print(f"{path}: {c['model']} batch {c['batch']} at {c['image_size']}, {c['device']}"
              f"{', ' + c['gpu'] if 'gpu' in c else ''}; PyTorch {c['torch']}; "
              f"{c.get('dlprobe_build') or c['dlprobe']}")
        results += doc["results"]
        if "engine_fp64" in doc:
            e = doc["engine_fp64"]
            print(f"   engine fp64 vs PyTorch fp64: {e['verdict']}"
                  + (f" ({e['error']})" if "error" in e else
                     f", gradients worst {fmt_err(e['gradients']['worst'])}"))
            ok = ok and e["verdict"] == "agree"
    if results:
        print_summary(results, "all runs")
    return 0 if ok and results and all(r["verdict"] in ("agree", "as_exact")
                                       for r in results) else 1


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
    precisions = (args.precisions or ("fp32,bf16" if args.device == "cpu" else
                                      ",".join(PRECISIONS))).split(",")
    for p in precisions:
        if p not in PRECISIONS:
            print(f"compare_pytorch.py: unknown precision '{p}' (expected one of "
                  f"{', '.join(PRECISIONS)})", file=sys.stderr)
            return 2

    torch.manual_seed(args.seed)
    model = getattr(torchvision.models, args.model)(num_classes=args.classes)
    gen = torch.Generator().manual_seed(args.seed + 1)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=gen)
    labels = torch.randint(0, args.classes, (args.batch,), generator=gen)

    work = args.workdir or tempfile.mkdtemp(prefix="dlprobe-peers-")
    os.makedirs(work, exist_ok=True)
    files = {"dir": work, "weights": os.path.join(work, "weights.safetensors"),
             "input": os.path.join(work, "input.safetensors")}
    save_safetensors(files["weights"], {k: v.detach().cpu().contiguous().numpy()
                                        for k, v in model.state_dict().items()})
    save_safetensors(files["input"], {"images": images.numpy(), "labels": labels.numpy()})

    config = {"model": args.model, "batch": args.batch, "image_size": args.image_size,
              "classes": args.classes, "seed": args.seed, "device": str(device),
              "reference": f"PyTorch float64 on {ref_device}", "torch": torch.__version__,
              "torchvision": torchvision.__version__, "numpy": np.__version__,
              "python": platform.python_version(), "files": work, "dlprobe": args.dlprobe}
    if device.type == "cuda":
        config["gpu"] = torch.cuda.get_device_name(device)
        config["cuda"] = torch.version.cuda
        config["cudnn"] = torch.backends.cudnn.version()
    print(f"compare_pytorch: {args.model} batch {args.batch} at {args.image_size}x"
          f"{args.image_size}, {args.classes} classes, seed {args.seed}; PyTorch {torch.__version__}"
          f" on {device}; reference fp64 on {ref_device}; files in {work}", flush=True)

    t0 = time.perf_counter()
    ref = torch_step(torch, model, images, labels, "fp64", "nchw", ref_device)
    config["reference_seconds"] = time.perf_counter() - t0

    doc = {"schema": "dlprobe.peers.pytorch/1", "config": config, "tolerances": TOLERANCES,
           "as_exact_factor": AS_EXACT_FACTOR, "results": []}
    if args.engine_fp64:
        # The engine's own float64 step (reference backend) against PyTorch's: no rounding to
        # hide behind, so this checks the math itself (~1e-12 when it is right).
        r = {"precision": "fp64", "layout": "nchw"}
        try:
            t0 = time.perf_counter()
            dl = dlprobe_step(args, "fp64", "nchw", files, "fp64")
            r["dlprobe_seconds"] = time.perf_counter() - t0
            names = sorted(ref["gradients"])
            r["logits"] = rel_err(dl["logits"], ref["logits"])
            r["loss_error"] = rel_err(dl["loss"], ref["loss"])
            r["gradients"] = summarize(compare_sets(dl["gradients"], ref["gradients"], names))
            worst = max(r["logits"], r["loss_error"], r["gradients"]["worst"])
            r["verdict"] = "agree" if worst <= args.fp64_tolerance else "fail"
            r["tolerance"] = args.fp64_tolerance
        except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
            r["verdict"], r["error"] = "error", str(e)
        doc["engine_fp64"] = r
        print(f"\n== engine fp64 (reference backend) vs PyTorch fp64: {r['verdict'].upper()}")
        if "error" in r:
            print(f"   error: {r['error']}")
        else:
            g = r["gradients"]
            print(f"   logits {fmt_err(r['logits'])}, loss {fmt_err(r['loss_error'])}, gradients "
                  f"worst {fmt_err(g['worst'])} ({g['worst_tensor']}), median "
                  f"{fmt_err(g['median'])}; tolerance {args.fp64_tolerance:g}")

    for p in precisions:
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
            r["pytorch_seconds"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            dl = dlprobe_step(args, p, layout, files, p, scale if p == "fp16" else None)
            r["dlprobe_seconds"] = time.perf_counter() - t0
            r["dlprobe_command"] = dl["command"]
            r["dlprobe_build"] = dl["metadata"].get("producer")
            config.setdefault("dlprobe_build", r["dlprobe_build"])
            if dl["loss_scale"] != pt["loss_scale"]:
                raise RuntimeError(f"dlprobe used loss scale {dl['loss_scale']:g}, PyTorch "
                                   f"{pt['loss_scale']:g}")
            r["loss_scale"] = dl["loss_scale"]
            r.update(compare(dl, pt, ref, TOLERANCES[p]))
        except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
            r["verdict"], r["error"] = "error", str(e)
        doc["results"].append(r)
        print_result(r)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)

    print_summary(doc["results"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nwrote {args.json}")
    verdicts = [r["verdict"] for r in doc["results"]]
    if "engine_fp64" in doc:
        verdicts.append(doc["engine_fp64"]["verdict"])
    return 0 if all(v in ("agree", "as_exact") for v in verdicts) else 1


# ---- self-test --------------------------------------------------------------------------------

def self_test():
    """The helpers on known values; numpy only."""
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

    s = summarize({"a": 1e-6, "b": 3e-5, "c": 2e-6, "d": 5e-7, "e": 4e-6, "f": 1e-7})
    check(s["worst"] == 3e-5 and s["worst_tensor"] == "b", "worst")
    check(abs(s["median"] - 1.5e-6) < 1e-20, "median of six")
    check([t["name"] for t in s["worst5"]] == ["b", "e", "c", "a", "d"], "five worst in order")
    check(summarize({})["count"] == 0, "empty summary")

    tol = {"logits": 1e-4, "loss": 1e-4, "gradients": 1e-4}

    def q(vs_pt, vs_64, pt_64):
        return {"logits": {"dlprobe_vs_pytorch": vs_pt, "dlprobe_vs_fp64": vs_64,
                           "pytorch_vs_fp64": pt_64},
                "loss": {"dlprobe_vs_pytorch": 0.0, "dlprobe_vs_fp64": 0.0,
                         "pytorch_vs_fp64": 0.0},
                "gradients": {"dlprobe_vs_pytorch": {"w": vs_pt}, "dlprobe_vs_fp64": {"w": vs_64},
                              "pytorch_vs_fp64": {"w": pt_64}}}
    check(verdict(q(5e-5, 3e-5, 3e-5), tol)[0] == "agree", "within tolerance agrees")
    v, reasons = verdict(q(1e-3, 8e-4, 9e-4), tol)
    check(v == "as_exact" and len(reasons) == 2, "ill-conditioned but as exact as PyTorch")
    check(verdict(q(1e-3, 1e-3, 1e-5), tol)[0] == "fail", "far from PyTorch and from fp64")
    check(verdict(q(1e-3, math.inf, 1e-5), tol)[0] == "fail", "non-finite fails")

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
    p.add_argument("--reference-device",
                   help="where PyTorch's float64 step runs (default: --device)")
    p.add_argument("--model", default="resnet50",
                   choices=["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precisions",
                   help="comma-separated subset of fp32,tf32,fp16,bf16 (default: all four on a "
                        "GPU, fp32,bf16 on the CPU)")
    p.add_argument("--engine-fp64", action=argparse.BooleanOptionalAction, default=None,
                   help="also run the engine's float64 step on the CPU reference backend against "
                        "PyTorch's (default: on with --device cpu; slow for resnet50 at 224)")
    p.add_argument("--fp16-loss-scale", type=float, default=FP16_LOSS_SCALE,
                   help="fp16's first loss scale, halved while PyTorch's gradients overflow "
                        "(default 65536, GradScaler's)")
    p.add_argument("--fp64-tolerance", type=float, default=1e-9,
                   help="bound for the engine's fp64 step against PyTorch's (default 1e-9)")
    p.add_argument("--step-timeout", type=float, default=600,
                   help="seconds one dlprobe step may take (default 600)")
    p.add_argument("--workdir", help="keep the safetensors files here (default: a temp folder)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--self-test", action="store_true", help="check the helpers (numpy only)")
    p.add_argument("--summarize", nargs="+", metavar="JSON",
                   help="only print one summary table of earlier --json files (numpy only)")
    args = p.parse_args()
    if args.self_test:
        return self_test()
    if args.summarize:
        return summarize_files(args.summarize)
    for name in ("batch", "image_size", "classes"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    args.dlprobe = find_dlprobe(args.dlprobe)
    if args.engine_fp64 is None:
        args.engine_fp64 = args.device == "cpu"
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
