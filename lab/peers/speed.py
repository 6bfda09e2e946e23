#!/usr/bin/env python3
"""dlprobe's native ResNet-50 step beside its peers, in one run on one GPU: one table.

For each configuration (precision and batch), back to back on the same GPU, gradients only
(forward and backward, no optimizer update: the usual benchmark protocol), synthetic input on the
device, each in its fastest layout:

- dlprobe: `dlprobe bench --model resnet50 --mode grads --precision P --batch B` with no other
  choice, so that bench picks its fastest settings for the device (layout, planned arena, CUDA
  graph), and prints what it picked;
- PyTorch eager: examples/workloads/pytorch_resnet50.py with AMP (fp16, bf16) or TF32, channels_last
  (NCHW for strict fp32), cudnn.benchmark;
- torch.compile: the same script with --compile, mode "default" above --small-batch and
  "reduce-overhead" (CUDA graphs) at or below it;
- JAX/XLA: examples/workloads/jax_resnet50.py (NHWC), for bf16 and fp32 (the script has no fp16
  mode: fp16 in JAX needs a loss scaler the script does not have).

Every peak is taken after warm-up: dlprobe's allocator peak is reset after warm-up; PyTorch's
torch.cuda.max_memory_allocated is reset after warm-up (the script does it), and under
reduce-overhead, whose CUDA graphs replay from a private pool that does not count as allocated,
the figure is the memory reserved after warm-up (the pool); JAX has no reset, so
its figure is peak_bytes_in_use over the process, which for a jitted step that allocates the same
buffers each step is the steps' peak.

    python3 lab/peers/speed.py --dlprobe .devbuild/bin/dlprobe --out speed-out
    python3 lab/peers/speed.py --dlprobe ... --configs fp16:256,bf16:256,fp16:32,tf32:256
    python3 lab/peers/speed.py --self-test          # the parsers, without a GPU

Writes OUT/speed.json (every run: command, figures, log file) and OUT/speed.md (the table), and
prints the table. Each run's output is in OUT/<name>.log. A run that fails, runs out of memory or
passes --timeout is a row with its reason, and the others go on.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH_SCRIPT = os.path.join(ROOT, "examples", "workloads", "pytorch_resnet50.py")
JAX_SCRIPT = os.path.join(ROOT, "examples", "workloads", "jax_resnet50.py")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
GIB = float(1 << 30)


def parse_configs(text):
    """"fp16:256,bf16:256" -> [("fp16", 256), ("bf16", 256)]; a bad item raises ValueError."""
    out = []
    for item in text.split(","):
        precision, sep, batch = item.strip().partition(":")
        if not sep or precision not in PRECISIONS or not batch.isdigit() or int(batch) < 1:
            raise ValueError(f"--configs: '{item}' is not PRECISION:BATCH "
                             f"(precision one of {', '.join(PRECISIONS)})")
        out.append((precision, int(batch)))
    if len(set(out)) != len(out):
        raise ValueError("--configs: a configuration is given twice")
    return out


def protocol_lines(text):
    """The {"dlprobe": {...}} lines a workload printed, in order."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("dlprobe"), dict):
            records.append(obj["dlprobe"])
    return records


def workload_figures(text):
    """What a peer script reported: img/s over its timed steps, the peak after warm-up, the
    warm-up's length (compilation included), and whether it ran out of memory."""
    records = protocol_lines(text)
    fig = {"images_per_s": None, "peak_bytes": None, "reserved_bytes": None, "warmup_s": None,
           "oom": False, "message": None}
    warm = [r for r in records if "step" in r and r.get("warmup")]
    timed = [r for r in records if "step" in r and not r.get("warmup")]
    if warm:
        fig["warmup_s"] = sum(r.get("step_time_s", 0.0) for r in warm)
    if timed:
        fig["peak_bytes"] = timed[-1].get("framework_peak_bytes")
        fig["reserved_bytes"] = timed[-1].get("framework_reserved_bytes")
    for r in records:
        if "images_per_s" in r:
            fig["images_per_s"] = r["images_per_s"]
        if r.get("oom"):
            fig["oom"] = True
            fig["message"] = r.get("message")
    return fig


def bench_figures(results):
    """What `dlprobe bench --json` recorded for its one configuration."""
    configs = results.get("configurations") or []
    if not configs:
        return {"images_per_s": None, "peak_bytes": None, "status": "no configuration"}
    c = configs[0]
    stats = c.get("statistics") or {}
    memory = c.get("memory") or {}
    allocator = memory.get("allocator_stats") or {}
    settings = c.get("settings") or {}
    return {
        "images_per_s": stats.get("throughput"),
        "ci": [stats.get("throughput_ci_low"), stats.get("throughput_ci_high")],
        "peak_bytes": allocator.get("peak.allocated_bytes"),
        "status": c.get("status"),
        "error": c.get("error") or None,
        "layout": settings.get("layout"),
        "gpu_memory": settings.get("gpu_memory"),
    }


def picked_line(stderr_text):
    m = re.search(r"picked: (.*?)(?: \(override|$)", stderr_text, re.M)
    return m.group(1) if m else None


def run(cmd, log_path, timeout):
    """Runs cmd with its output to log_path; returns (exit code or 'timeout', stdout, stderr,
    seconds)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        code = "timeout"
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    seconds = time.monotonic() - t0
    with open(log_path, "w") as f:
        f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        f.write(out)
        f.write("\n--- stderr ---\n")
        f.write(err)
        f.write(f"\n--- exit {code} after {seconds:.1f} s ---\n")
    return code, out, err, seconds


def torch_args(precision, batch, args):
    a = ["--batch", str(batch), "--mode", "grads", "--steps", str(args.steps),
         "--warmup", str(args.warmup)]
    if precision in ("fp16", "bf16"):
        a += ["--amp", precision, "--channels-last"]
    elif precision == "tf32":
        a += ["--tf32", "--channels-last"]
    return a


def plan(configs, args):
    """The runs, in order: (name, label, kind, command)."""
    runs = []
    for precision, batch in configs:
        tag = f"{precision}-bs{batch}"
        runs.append((f"dlprobe-{tag}", "dlprobe", "dlprobe",
                     [args.dlprobe, "bench", "--model", "resnet50", "--mode", "grads",
                      "--precision", precision, "--batch", str(batch), "--steps",
                      str(args.steps), "--json", os.path.join(args.out, f"dlprobe-{tag}.json"),
                      "--overwrite", "--no-ceiling"]))
        if "eager" in args.peers:
            runs.append((f"eager-{tag}", "PyTorch eager", "workload",
                         [args.python, TORCH_SCRIPT] + torch_args(precision, batch, args)))
        if "compile" in args.peers:
            mode = "reduce-overhead" if batch <= args.small_batch else "default"
            runs.append((f"compile-{tag}", f"torch.compile ({mode})", "workload",
                         [args.python, TORCH_SCRIPT] + torch_args(precision, batch, args) +
                         ["--compile", "--compile-mode", mode]))
        if "jax" in args.peers and precision in ("bf16", "fp32"):
            runs.append((f"jax-{tag}", "JAX/XLA", "workload",
                         [args.python, JAX_SCRIPT, "--batch", str(batch), "--mode", "grads",
                          "--precision", precision, "--steps", str(args.steps),
                          "--warmup", str(args.warmup)]))
    return runs


def versions(args):
    v = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
         "host": platform.node()}
    for name, code in (("torch", "import torch; print(torch.__version__, torch.cuda.get_device_name())"),
                       ("jax", "import jax; print(jax.__version__)")):
        try:
            p = subprocess.run([args.python, "-c", code], capture_output=True, text=True,
                               timeout=120)
            v[name] = p.stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            v[name] = None
    try:
        v["dlprobe"] = subprocess.run([args.dlprobe, "--version"], capture_output=True,
                                      text=True, timeout=30).stdout.strip()
    except OSError as e:
        v["dlprobe"] = f"not runnable: {e}"
    return v


def cell(row):
    if row is None:
        return "–"
    if row.get("images_per_s") is None:
        return row.get("why", "no figure")
    text = f"{row['images_per_s']:,.0f}"
    if row.get("peak_bytes"):
        what = " reserved" if row.get("peak_is_reserved") else ""
        text += f" ({row['peak_bytes'] / GIB:.1f} GiB{what})"
    return text


def table(rows, configs):
    """Markdown: a row per configuration, a column per engine, and dlprobe over the best peer."""
    lines = ["| configuration | dlprobe | PyTorch eager | torch.compile | JAX/XLA | "
             "dlprobe / best peer |", "|---|---|---|---|---|---|"]
    for precision, batch in configs:
        tag = f"{precision}-bs{batch}"
        mine = rows.get(f"dlprobe-{tag}")
        peers = [rows.get(f"{k}-{tag}") for k in ("eager", "compile", "jax")]
        figures = [p for p in peers if p and p.get("images_per_s")]
        ratio = "–"
        if mine and mine.get("images_per_s") and figures:
            best = max(figures, key=lambda p: p["images_per_s"])
            ratio = f"{mine['images_per_s'] / best['images_per_s']:.3f} (vs {best['label']})"
        compile_cell = cell(peers[1])
        if peers[1] and peers[1].get("images_per_s"):
            compile_cell += f", {peers[1]['label'].split('(')[1].rstrip(')')}"
        lines.append(f"| {precision} bs{batch} | {cell(mine)} | {cell(peers[0])} | "
                     f"{compile_cell} | {cell(peers[2])} | {ratio} |")
    return "\n".join(lines)


def self_test():
    assert parse_configs("fp16:256, bf16:32") == [("fp16", 256), ("bf16", 32)]
    for bad in ("fp8:256", "fp16", "fp16:0", "fp16:x", "fp16:2,fp16:2"):
        try:
            parse_configs(bad)
        except ValueError:
            continue
        raise AssertionError(f"parse_configs accepted {bad!r}")
    text = "\n".join([
        'noise',
        '{"dlprobe": {"framework": "pytorch", "batch": 4}}',
        '{"dlprobe": {"step": 0, "step_time_s": 40.0, "warmup": true, "framework_peak_bytes": 9}}',
        '{"dlprobe": {"step": 1, "step_time_s": 0.5, "warmup": false, "framework_peak_bytes": 5}}',
        '{"dlprobe": {"images_per_s": 8.0}}', '{"dlprobe": {"end": true}}', '{"other": 1}'])
    f = workload_figures(text)
    assert f["images_per_s"] == 8.0 and f["peak_bytes"] == 5 and f["warmup_s"] == 40.0, f
    assert not f["oom"] and f["reserved_bytes"] is None
    f = workload_figures('{"dlprobe": {"oom": true, "message": "CUDA out of memory"}}')
    assert f["oom"] and f["images_per_s"] is None
    b = bench_figures({"configurations": [{"status": "ok", "statistics": {
        "throughput": 7000.0, "throughput_ci_low": 6990.0, "throughput_ci_high": 7010.0},
        "memory": {"allocator_stats": {"peak.allocated_bytes": 2 * (1 << 30)}},
        "settings": {"layout": "nhwc", "gpu_memory": "planned"}}]})
    assert b["images_per_s"] == 7000.0 and b["peak_bytes"] == 2 * (1 << 30), b
    assert picked_line("x\ndlprobe: picked: layout nhwc, graph on (override with --layout)\n") \
        == "layout nhwc, graph on"
    rows = {"dlprobe-fp16-bs8": {"images_per_s": 110.0, "peak_bytes": GIB, "label": "dlprobe"},
            "eager-fp16-bs8": {"images_per_s": 100.0, "label": "PyTorch eager"},
            "compile-fp16-bs8": {"images_per_s": None, "why": "timeout",
                                 "label": "torch.compile (reduce-overhead)"}}
    t = table(rows, [("fp16", 8)])
    assert "| fp16 bs8 | 110 (1.0 GiB) | 100 | timeout | – | 1.100 (vs PyTorch eager) |" in t, t
    print("speed.py self-test: ok")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dlprobe", help="the dlprobe binary")
    p.add_argument("--out", default="speed-out", help="folder for logs, speed.json, speed.md")
    p.add_argument("--configs", default="fp16:256,bf16:256,fp16:32,tf32:256",
                   help="PRECISION:BATCH list")
    p.add_argument("--peers", default="eager,compile,jax",
                   help="which peers run: eager, compile, jax")
    p.add_argument("--steps", type=int, default=30, help="timed steps of every run")
    p.add_argument("--warmup", type=int, default=5, help="the peers' warm-up steps")
    p.add_argument("--small-batch", type=int, default=64,
                   help="torch.compile uses reduce-overhead (CUDA graphs) at or below this batch")
    p.add_argument("--timeout", type=float, default=300, help="seconds a run may take")
    p.add_argument("--python", default=sys.executable, help="Python with torch (and jax)")
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args()
    if args.self_test:
        return self_test()
    if not args.dlprobe:
        p.error("--dlprobe is needed")
    try:
        configs = parse_configs(args.configs)
    except ValueError as e:
        p.error(str(e))
    args.peers = {x.strip() for x in args.peers.split(",") if x.strip()}
    unknown = args.peers - {"eager", "compile", "jax"}
    if unknown:
        p.error(f"--peers: unknown {', '.join(sorted(unknown))}")
    os.makedirs(args.out, exist_ok=True)

    info = versions(args)
    rows = {}
    for name, label, kind, cmd in plan(configs, args):
        print(f"== {name}: {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
        # Every engine as it runs by default (JAX preallocates 75 % of the GPU; its peak is read
        # from its allocator's in-use figure all the same).
        code, out, err, seconds = run(cmd, os.path.join(args.out, f"{name}.log"), args.timeout)
        row = {"label": label, "command": cmd, "exit": code, "seconds": round(seconds, 1)}
        if kind == "dlprobe":
            try:
                with open(os.path.join(args.out, f"{name}.json")) as f:
                    row.update(bench_figures(json.load(f)))
            except (OSError, ValueError) as e:
                row.update({"images_per_s": None, "why": f"no results ({e.__class__.__name__})"})
            row["picked"] = picked_line(err)
        else:
            row.update(workload_figures(out))
            if "reduce-overhead" in cmd:
                # CUDA graph trees replay from a private pool whose blocks do not count as
                # allocated, so max_memory_allocated after warm-up says ~0; what the replays hold
                # is the pool, which counts as reserved.
                row["peak_bytes"] = row["reserved_bytes"]
                row["peak_is_reserved"] = True
        if row.get("images_per_s") is None:
            row.setdefault("why", "out of memory" if row.get("oom") else
                           ("timed out" if code == "timeout" else f"exit {code}"))
        rows[name] = row
        print(f"   {label}: {cell(row)}  [{seconds:.0f} s, exit {code}]", flush=True)

    md = table(rows, configs)
    with open(os.path.join(args.out, "speed.json"), "w") as f:
        json.dump({"versions": info, "configs": configs, "runs": rows}, f, indent=1)
    with open(os.path.join(args.out, "speed.md"), "w") as f:
        f.write(f"{info['date']}; {info.get('torch')}; jax {info.get('jax')}; "
                f"{info.get('dlprobe')}\n\n{md}\n")
    print()
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
