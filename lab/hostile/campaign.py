#!/usr/bin/env python3
"""Hostile-input campaign against the dlprobe CLI (CPU only).

Seven families of cases, each a function that yields cases; a case is a command and what it must
do: exit 0, 1 or 2 without a signal, no sanitizer report on stderr, at most one error line (exactly
one, the last, on exit 2), finish within its time bound, and, where it writes a file, leave that
file valid and complete, or absent / unchanged. Deterministic given --seed (but for the timing of
the signals the interrupt cases send). Standard library only.

  python3 lab/hostile/campaign.py --dlprobe build-test/dlprobe --seed 1 --failures fail.json
"""

import argparse
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time

SANITIZER = re.compile(
    rb"ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|UndefinedBehaviorSanitizer|"
    rb"SUMMARY: \w+Sanitizer|AddressSanitizer:DEADLYSIGNAL|terminate called|Aborted")
TINY = ["--model", "resnet18", "--width", "8", "--image-size", "32", "--classes", "10"]
TINY_BENCH = TINY + ["--batch", "2", "--steps", "1", "--warmup", "0", "--min-time", "0s",
                     "--warmup-time", "0s", "--no-ceiling", "-q"]
SAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}


class Case:
    """One command and its expectations; `check` (optional) says whether the outputs survived."""

    def __init__(self, family, name, argv, *, timeout=20.0, stdin=b"", shell=False, env=None,
                 check=None, interrupt=None, codes=(0, 1, 2), cwd=None, one_error=True):
        self.family, self.name, self.argv = family, name, argv
        self.timeout, self.stdin, self.shell, self.env = timeout, stdin, shell, env or {}
        self.check, self.interrupt, self.codes, self.cwd = check, interrupt, codes, cwd
        self.one_error = one_error

    def repro(self):
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        cmd = self.argv if self.shell else " ".join(shlex.quote(a) for a in self.argv)
        cd = f"cd {shlex.quote(self.cwd)} && " if self.cwd else ""
        return f"{cd}{env + ' ' if env else ''}{cmd}"


def run_case(case):
    """Runs `case`; returns (verdict, detail): verdict one of ok, crash, hang, lost, other."""
    env = dict(os.environ, **SAN_ENV, **case.env)
    start = time.monotonic()
    proc = subprocess.Popen(case.argv, shell=case.shell, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=case.cwd, start_new_session=True)
    hang = False
    if case.interrupt:
        sig, after = case.interrupt
        try:
            proc.wait(timeout=after)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, sig) if case.shell else proc.send_signal(sig)
    try:
        out, err = proc.communicate(case.stdin, timeout=max(0.1, case.timeout -
                                                             (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        hang = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    except BrokenPipeError:
        out, err = proc.communicate()
    rc = proc.returncode
    elapsed = time.monotonic() - start
    tail = err[-2000:].decode("utf-8", "replace")
    if hang:
        return "hang", f"still running after {case.timeout:.0f}s; stderr tail: {tail[-400:]}"
    if SANITIZER.search(err):
        m = SANITIZER.search(err)
        return "crash", f"sanitizer report (rc {rc}): " + err[max(0, m.start() - 200):
                                                            m.start() + 1200].decode(
                                                                "utf-8", "replace")
    expected_kill = case.interrupt and case.interrupt[0] == signal.SIGKILL and rc == -9
    if rc < 0 and not expected_kill:
        return "crash", f"killed by signal {-rc}; stderr tail: {tail[-600:]}"
    if rc not in case.codes and not expected_kill:
        return "other", f"exit {rc} (want one of {case.codes}); stderr tail: {tail[-600:]}"
    if case.one_error and not case.shell:
        lines = [l for l in err.decode("utf-8", "replace").splitlines() if l.strip()]
        errors = [i for i, l in enumerate(lines) if l.startswith("dlprobe: error")]
        if len(errors) > 1 or (rc == 2 and (len(errors) != 1 or errors[0] != len(lines) - 1)):
            return "other", f"exit {rc}, error not one last line: {tail[-600:]}"
    if case.check:
        problem = case.check(rc, out, err)
        if problem:
            return "lost", f"exit {rc}: {problem}; stderr tail: {tail[-400:]}"
    return "ok", f"exit {rc} in {elapsed:.2f}s"


# ---------------------------------------------------------------------------------------------
# Output checks


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def json_file_problem(path, *, want_configs=0):
    """None when `path` is one complete JSON document (with at least `want_configs`
    configurations when it is a results file); else what is wrong."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(), parse_constant=_reject_constant)
    except FileNotFoundError:
        return f"{path} missing"
    except (ValueError, OSError) as e:
        return f"{path} is not valid JSON: {e}"
    if want_configs:
        configs = doc.get("configurations", []) if isinstance(doc, dict) else []
        n = sum(1 for c in configs if c.get("status") == "ok")
        if n < want_configs:
            return f"{path} keeps {n} finished configurations, at least {want_configs} finished"
    return None


def absent_or_valid(path):
    """A check: after exit 0 `path` is there and (a .json) valid; after a failure it is absent,
    empty or still valid (a results file rewritten as work finishes keeps what finished)."""

    def check(rc, out, err):
        if not os.path.exists(path):
            return f"{path} missing after exit 0" if rc == 0 else None
        if path.endswith(".json") and (rc == 0 or os.path.getsize(path) > 0):
            return json_file_problem(path)
        return None if rc != 0 or os.path.getsize(path) > 0 else f"{path} empty after exit 0"

    return check


# ---------------------------------------------------------------------------------------------
# Family 1: malformed results files


def leaf_paths(doc, prefix=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from leaf_paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from leaf_paths(v, prefix + (i,))
    yield prefix


def set_path(doc, path, value):
    if not path:
        return value
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return doc


def family_results(ctx):
    rng, d = ctx.rng, ctx.tmp("f1")
    valid = {"bench": open(ctx.bench_json, "rb").read(), "memory": open(ctx.memory_json, "rb").read()}
    files = []  # (name, path, base kind)

    def add(name, data, kind="bench"):
        path = os.path.join(d, f"{len(files):04d}.json")
        with open(path, "wb") as f:
            f.write(data)
        files.append((name, path, kind))

    for kind, text in valid.items():
        doc = json.loads(text)
        paths = [p for p in leaf_paths(doc) if p]
        for i in range(45):
            p = rng.choice(paths)
            bad = rng.choice([None, True, False, "x", "", -1, 0, 1e308, -1e308, [], {}, [[]],
                              2 ** 64, -(2 ** 63) - 1, 18446744073709551615, 0.5, "\u00e9\u4e2d",
                              {"a": 1}, [1, "a", None]])
            add(f"{kind}: {'/'.join(map(str, p))} = {json.dumps(bad)}",
                json.dumps(set_path(json.loads(text), p, bad)).encode(), kind)
        # Deleting keys (schema errors).
        dicts = [p for p in paths if isinstance(_get(doc, p), dict)] + [()]
        for i in range(20):
            p = rng.choice(dicts)
            node = json.loads(text)
            target = _get(node, p)
            if target:
                key = rng.choice(sorted(target))
                del target[key]
                add(f"{kind}: delete {'/'.join(map(str, p + (key,)))}", json.dumps(node).encode(),
                    kind)
        # Numbers out of range, written as text.
        numbers = list(re.finditer(rb"(?<=: )-?\d+(\.\d+)?(e[-+]?\d+)?(?=[,\n])", text))
        for lit in [b"1e400", b"1e999", b"-1e999", b"1" * 100001, b"-" + b"9" * 100001,
                    b"NaN", b"Infinity", b"-0", b"1e-400", b"0x10", b"01"]:
            for _ in range(3):
                m = rng.choice(numbers)
                add(f"{kind}: number at byte {m.start()} = {lit[:20].decode()}"
                    f"{'...' if len(lit) > 20 else ''}", text[:m.start()] + lit + text[m.end():],
                    kind)
        # Deep nesting.
        for field in ["analysis", "allocator_stats"]:
            for depth in [1000, 100000]:
                node = json.loads(text)
                for c in node.get("configurations", []):
                    c.setdefault("memory", {})[field] = "@@DEEP@@"
                add(f"{kind}: memory.{field} nested {depth} deep",
                    json.dumps(node).encode().replace(b'"@@DEEP@@"', b"[" * depth + b"]" * depth),
                    kind)
        # Invalid UTF-8 in strings.
        strings = list(re.finditer(rb'": "([^"\\]+)"', text))
        for bad in [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x00"]:
            for _ in range(2):
                m = rng.choice(strings)
                add(f"{kind}: string at byte {m.start(1)} gets {bad!r}",
                    text[:m.start(1)] + bad + text[m.start(1):], kind)
        # Truncations at random offsets, and byte flips.
        for _ in range(40):
            cut = rng.randrange(len(text))
            add(f"{kind}: truncated at {cut}", text[:cut], kind)
        for _ in range(40):
            data = bytearray(text)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            add(f"{kind}: byte flips", bytes(data), kind)
    # Whole-file oddities.
    for name, data in [("empty", b""), ("null", b"null"), ("array", b"[]"), ("number", b"0"),
                       ("string", b'""'), ("object", b"{}"), ("BOM", b"\xef\xbb\xbf" + valid["bench"]),
                       ("two documents", valid["bench"] + valid["bench"]),
                       ("schema v2", valid["bench"].replace(b"dlprobe.results/1", b"dlprobe.results/2")),
                       ("configurations object",
                        json.dumps({"schema": "dlprobe.results/1", "configurations": {}}).encode()),
                       ("NUL", b"\x00" * 100)]:
        add(name, data)
    big = json.loads(valid["bench"])
    big["configurations"] = big["configurations"] * 5000
    add("10,000 configurations", json.dumps(big).encode())
    add("64 MiB of spaces then a document", b" " * (64 << 20) + valid["bench"])
    specials = [("/dev/zero", "/dev/zero"), ("/dev/null", "/dev/null"), ("a directory", d),
                ("missing", os.path.join(d, "nope.json")), ("/proc/self/mem", "/proc/self/mem")]
    unreadable = os.path.join(d, "unreadable.json")
    shutil.copy(ctx.bench_json, unreadable)
    os.chmod(unreadable, 0)
    specials.append(("unreadable (mode 0)", unreadable))
    cases = []
    for i, (name, path, kind) in enumerate(files + [(n, p, "bench") for n, p in specials]):
        out = os.path.join(d, f"out{i}.html")
        which = i % 3
        if which == 0 or path in dict(specials).values():
            cases.append(Case("1 results files", f"report {name}",
                              [ctx.dlprobe, "report", path, "-o", out], timeout=60,
                              check=absent_or_valid(out)))
        if which == 1 or path in dict(specials).values():
            order = [ctx.bench_json, path] if i % 2 else [path, ctx.bench_json]
            cases.append(Case("1 results files", f"compare {name}",
                              [ctx.dlprobe, "compare", *order], timeout=60))
        if which == 2 or path in dict(specials).values():
            cases.append(Case("1 results files", f"memory --calibration {name}",
                              [ctx.dlprobe, "memory", "--predict-only", "--calibration", path,
                               *TINY, "--batch", "2"], timeout=60))
    return cases


def _get(doc, path):
    for p in path:
        doc = doc[p]
    return doc


# ---------------------------------------------------------------------------------------------
# Family 2: command lines

BAD_VALUES = ["-1", "0", "-0", "99999999999999999999999", "1e400", "nan", "NaN", "inf", "-inf", "",
              " ", "\u00e9\u4e2d\U0001f600", "x" * 100000, "1,1,1", "2,2", ",", "1,,2", "0x10",
              "1.5", "1e3", "--", "-", "=", "\x7f", "10000000000000s", "-5s", "0s", "1ns", "1h",
              "cuda:-1", "cuda:99999999999", "cpu,cpu", "resnet18,resnet18", "fp32,fp32",
              "fp64", "planned+planned", "prealloc:2", "prealloc:-1", "limit:0", "limit:1e400",
              "3%%", "200%", "-3%", "a=b", "KEY=", "=1,2", "KEY=1,1", "%s%n%x", "../../etc/passwd",
              "\t\n", "1 2", "0.0000000000001", "4294967297", "18446744073709551616"]
GOOD = {
    "--model": ["resnet18"], "--batch": ["2", "1,2", "2,1"], "--precision": ["fp32", "fp64,fp32"],
    "--mode": ["train", "grads", "infer", "infer,grads"], "--layout": ["nchw", "nhwc", "auto"],
    "--optimizer": ["sgd", "adamw"], "--backend": ["auto", "reference", "onednn"],
    "--gpu-memory": ["grow", "planned", "limit:64MiB", "grow,planned", "prealloc:0.5"],
    "--repeat": ["1", "2"], "--alpha": ["0.05", "0.5"], "--noise": ["1%", "0"],
    "--fail-above": ["3%", "0.5"], "--conv-algo": ["heuristic"], "--conv-engines": ["exact", "any"],
    "--timeout": ["5s"], "--kill-grace": ["1s"], "--hang-after": ["5s"], "--warmup-steps": ["0"],
    "--throughput-regex": [r"(?<ips>[0-9.]+) img/s"], "--sweep": ["N=1,2"], "-i": ["50ms"],
    "--interval": ["50ms"], "--gpu": ["0"], "--max-batch-start": ["1"], "--max-batch-limit": ["4"],
    "--max-batch-step": ["1"], "--max-batch-runs": ["3"], "--count": ["2"], "-c": ["2"],
    "--duration": ["1s"], "--device-memory": ["16GiB"], "--limit": ["64MiB"],
    "--calibration-batch": ["2"], "--loss-scale": ["1024"], "--graph": ["off"],
}
PATH_FLAGS = {"--json", "-o", "--output", "--csv", "--md", "--state-output", "--log-dir",
              "--details-json", "--tuning-cache", "--out", "--calibration", "--weights", "--input"}


def help_flags(ctx, sub):
    out = subprocess.run([ctx.dlprobe, sub, "--help"], capture_output=True, text=True,
                         env=dict(os.environ, **SAN_ENV)).stdout
    flags = []
    for m in re.finditer(r"^\s+(-\w,)?(--[\w-]+)( \S+)?", out, re.M):
        if m.group(2) in ("--help",):
            continue
        flags.append((m.group(2), bool(m.group(3)) and not m.group(3).strip().startswith("[")))
    return flags


def family_cli(ctx, count):
    rng, d = ctx.rng, ctx.tmp("f2")
    subs = ["bench", "memory", "step", "run", "report", "compare", "doctor", "monitor", "evaluate"]
    listed = subprocess.run([ctx.dlprobe, "--help"], capture_output=True, text=True,
                            env=dict(os.environ, **SAN_ENV)).stdout
    subs += ["pipeline"] if re.search(r"^\s+pipeline\s", listed, re.M) else []
    flags = {s: help_flags(ctx, s) for s in subs}
    cases = []
    for i in range(count):
        sub = subs[i % len(subs)]
        cd = os.path.join(d, f"c{i}")
        os.makedirs(cd)
        chosen = rng.sample(flags[sub], min(len(flags[sub]), rng.randint(1, 5)))
        if rng.random() < 0.1:
            chosen.append(rng.choice(chosen))  # a repeated flag
        if rng.random() < 0.05:
            chosen.append(("--no-such-flag", rng.random() < 0.5))
        work = i % 10 == 0  # every tenth case gets only good values and does (tiny) work
        argv = [ctx.dlprobe, sub]
        for flag, takes in chosen:
            argv.append(flag)
            if not takes:
                continue
            if flag in PATH_FLAGS:
                good = {"--calibration": ctx.memory_json, "--weights": ctx.weights,
                        "--input": ctx.batch, "--tuning-cache": os.path.join(cd, "tune.json")}.get(
                    flag, os.path.join(cd, flag.strip("-") + rng.choice([".json", ".md", ".csv",
                                                                        ".html"])))
                bad = rng.choice(["", "/", "/nonexistent/x.json", "-", "/dev/full", cd,
                                  "/proc/self/status", "\u00e9.json", "x" * 5000])
                argv.append(good if work or rng.random() < 0.5 else bad)
            elif work:
                argv.append(rng.choice(GOOD.get(flag, ["1"])))
            else:
                argv.append(rng.choice(BAD_VALUES + GOOD.get(flag, [])))
        if sub in ("bench", "memory"):
            # Keeps the work tiny where the flags are good; cuda:0 refuses where they are not.
            argv += TINY + ["--device", "cpu" if work else rng.choice(["cpu", "cuda:0"])]
            if sub == "bench":
                argv += TINY_BENCH[8:]
            else:
                argv += ["--warmup", "0"]
        elif sub == "step":
            argv += ["--weights", ctx.weights, "--input", ctx.batch, "--device", "cpu",
                     "--output", os.path.join(cd, "grads.safetensors")]
        elif sub == "run":
            argv += ["--", "sh", "-c", "echo '100 img/s'"]
        elif sub in ("report", "compare"):
            argv += [ctx.bench_json] * (1 if sub == "report" else 2)
            if sub == "report" and "-o" not in argv and "--output" not in argv:
                argv += ["-o", os.path.join(cd, "r.html")]
        elif sub == "evaluate":
            if work:
                continue  # a whole evaluation is not tiny
            argv += ["--device", "cuda:0"]  # no GPU here: refused once every value is checked
        elif sub == "doctor":
            argv += ["--no-ceilings"]
        elif sub == "pipeline":
            if work:
                continue  # measuring a dataset is not tiny
            argv += [cd]  # an empty folder: no images to measure
        elif sub == "monitor":
            argv += ["-c", "2", "-i", "50ms"]
        env = {"DLPROBE_NVML_LIBRARY": ctx.fake_nvml,
               "DLPROBE_FAKE_NVML_SCRIPT": ctx.nvml_script} if sub == "monitor" and i % 2 else {}
        cases.append(Case("2 command lines", f"{sub} #{i}" + (" (work)" if work else ""), argv,
                          timeout=120 if work else 40, env=env, cwd=cd))
    return cases


# ---------------------------------------------------------------------------------------------
# Family 3: mutated safetensors


def resnet18_state(width=8, classes=10):
    """torchvision resnet18 names and shapes at `width` channels in the stem."""
    shapes = {}

    def bn(name, c):
        for s in ["weight", "bias", "running_mean", "running_var"]:
            shapes[f"{name}.{s}"] = ("F32", [c])
        shapes[f"{name}.num_batches_tracked"] = ("I64", [])

    shapes["conv1.weight"] = ("F32", [width, 3, 7, 7])
    bn("bn1", width)
    cin = width
    for layer in range(1, 5):
        c = width * 2 ** (layer - 1)
        for block in range(2):
            p = f"layer{layer}.{block}"
            stride_in = cin if block == 0 else c
            shapes[f"{p}.conv1.weight"] = ("F32", [c, stride_in, 3, 3])
            bn(f"{p}.bn1", c)
            shapes[f"{p}.conv2.weight"] = ("F32", [c, c, 3, 3])
            bn(f"{p}.bn2", c)
            if block == 0 and layer > 1:
                shapes[f"{p}.downsample.0.weight"] = ("F32", [c, cin, 1, 1])
                bn(f"{p}.downsample.1", c)
        cin = c
    shapes["fc.weight"] = ("F32", [classes, cin])
    shapes["fc.bias"] = ("F32", [classes])
    return shapes


def safetensors(tensors, rng):
    """(header dict, data) of a safetensors file holding `tensors` {name: (dtype, shape)}."""
    size = {"F32": 4, "I64": 8, "F64": 8, "F16": 2, "BF16": 2, "I32": 4}
    header, data = {}, bytearray()
    for name, (dtype, shape) in tensors.items():
        n = 1
        for s in shape:
            n *= s
        if dtype == "F32":
            blob = struct.pack(f"<{n}f", *[rng.gauss(0, 0.05) for _ in range(n)])
            if name.endswith("running_var") or (name.endswith(".weight") and "bn" in name):
                blob = struct.pack(f"<{n}f", *[1.0] * n)
        elif dtype == "I64":
            blob = struct.pack(f"<{n}q", *[rng.randrange(10) for _ in range(n)])
        else:
            blob = bytes(n * size[dtype])
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    return header, bytes(data)


def encode_st(header, data, raw_header=None):
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def family_safetensors(ctx):
    rng, d = ctx.rng, ctx.tmp("f3")
    wh, wd = ctx.weights_parts
    bh, bd = ctx.batch_parts
    files = []

    def add(name, which, blob):
        path = os.path.join(d, f"{len(files):03d}.safetensors")
        open(path, "wb").write(blob)
        files.append((name, which, path))

    for which, (h, data) in [("weights", (wh, wd)), ("input", (bh, bd))]:
        valid = encode_st(h, data)
        names = sorted(h)
        for length in [0, 1, 7, 2 ** 63, 2 ** 64 - 1, len(json.dumps(h)) + 1,
                       len(json.dumps(h)) - 1, len(valid)]:
            add(f"{which}: header length {length}", which,
                struct.pack("<Q", length) + valid[8:])
        for cut in sorted(rng.sample(range(len(valid)), 12)) + [0, 4, 8, 9]:
            add(f"{which}: truncated at {cut}", which, valid[:cut])
        raw = json.dumps(h).encode()
        for _ in range(8):
            b = bytearray(raw)
            b[rng.randrange(len(b))] = rng.randrange(256)
            add(f"{which}: header byte flip", which, encode_st(h, data, bytes(b)))
        for bad in ["F16", "BF16", "F64", "I8", "U8", "BOOL", "F8_E4M3", "Q4", "", 7, None]:
            m = json.loads(raw)
            m[rng.choice(names)]["dtype"] = bad
            add(f"{which}: dtype {bad!r}", which, encode_st(m, data))
        for bad in [[], [0], [-1], [2 ** 62, 2 ** 62], [1] * 64, "x", [1.5], [2 ** 64],
                    None, [3, 3]]:
            m = json.loads(raw)
            m[rng.choice(names)]["shape"] = bad
            add(f"{which}: shape {json.dumps(bad)}", which, encode_st(m, data))
        for bad in [[0, 0], [-4, 0], [0, 2 ** 64], [2 ** 63, 2 ** 63 + 4], [8, 4], [0], "x",
                    [0, len(data) + 4], [len(data), len(data) + 4], None, [1, 5]]:
            m = json.loads(raw)
            m[rng.choice(names)]["data_offsets"] = bad
            add(f"{which}: offsets {json.dumps(bad)}", which, encode_st(m, data))
        m = json.loads(raw)
        del m[rng.choice(names)]
        add(f"{which}: a tensor missing", which, encode_st(m, data))
        m = json.loads(raw)
        m["__metadata__"] = {"x": [1, 2]}
        add(f"{which}: metadata not strings", which, encode_st(m, data))
        m = json.loads(raw)
        first = names[0]
        m[first + "x"] = dict(m[first])
        add(f"{which}: two tensors over the same bytes", which, encode_st(m, data))
        add(f"{which}: data trailing", which, valid + b"\0" * 13)
        add(f"{which}: header not an object", which, encode_st(None, data, b"[1,2,3]"))
        add(f"{which}: header deep", which,
            encode_st(None, data, b'{"a":' + b"[" * 100000 + b"]" * 100000 + b"}"))
        add(f"{which}: header invalid UTF-8", which, encode_st(None, data, raw[:-2] + b'\xff"}'))
    # Batch values: NaN images, labels out of range.
    for name, mutate in [("labels -1", lambda b: b[:-8] + struct.pack("<q", -1)),
                         ("labels 10 (== classes)", lambda b: b[:-8] + struct.pack("<q", 10)),
                         ("labels 2^63-1", lambda b: b[:-8] + struct.pack("<q", 2 ** 63 - 1))]:
        add(f"input: {name}", "input", encode_st(bh, mutate(bd)))
    for name, value in [("NaN", float("nan")), ("inf", float("inf")), ("1e38", 1e38)]:
        images = struct.pack("<f", value) * ((len(bd) - 16) // 4) + bd[-16:]
        add(f"input: {name} images", "input", encode_st(bh, images))
    # Files that are well formed but odd: other dtypes and shapes, each tensor's bytes consistent.
    for name, tensors in [
            ("images F64", {"images": ("F64", [2, 3, 32, 32]), "labels": ("I64", [2])}),
            ("images F16", {"images": ("F16", [2, 3, 32, 32]), "labels": ("I64", [2])}),
            ("images BF16", {"images": ("BF16", [2, 3, 32, 32]), "labels": ("I64", [2])}),
            ("labels I32", {"images": ("F32", [2, 3, 32, 32]), "labels": ("I32", [2])}),
            ("labels F32", {"images": ("F32", [2, 3, 32, 32]), "labels": ("F32", [2])}),
            ("batch 0", {"images": ("F32", [0, 3, 32, 32]), "labels": ("I64", [0])}),
            ("1x1 images", {"images": ("F32", [2, 3, 1, 1]), "labels": ("I64", [2])}),
            ("7x7 images", {"images": ("F32", [2, 3, 7, 7]), "labels": ("I64", [2])}),
            ("33x33 images", {"images": ("F32", [2, 3, 33, 33]), "labels": ("I64", [2])}),
            ("non-square images", {"images": ("F32", [2, 3, 32, 16]), "labels": ("I64", [2])}),
            ("one channel", {"images": ("F32", [2, 1, 32, 32]), "labels": ("I64", [2])}),
            ("labels of 3 for 2 images", {"images": ("F32", [2, 3, 32, 32]),
                                         "labels": ("I64", [3])}),
            ("labels [2, 1]", {"images": ("F32", [2, 3, 32, 32]), "labels": ("I64", [2, 1])}),
            ("images rank 3", {"images": ("F32", [2, 3, 32]), "labels": ("I64", [2])}),
            ("no labels", {"images": ("F32", [2, 3, 32, 32])}),
            ("extra tensor", {"images": ("F32", [2, 3, 32, 32]), "labels": ("I64", [2]),
                              "junk": ("F32", [5])})]:
        add(f"input: {name}", "input", encode_st(*safetensors(tensors, rng)))
    base = resnet18_state()
    for name, change in [("conv1 F64", {"conv1.weight": ("F64", [8, 3, 7, 7])}),
                         ("fc F16", {"fc.weight": ("F16", [10, 64])}),
                         ("width 3", {"conv1.weight": ("F32", [3, 3, 7, 7])}),
                         ("width 0", {"conv1.weight": ("F32", [0, 3, 7, 7])}),
                         ("classes 0", {"fc.weight": ("F32", [0, 64]), "fc.bias": ("F32", [0])}),
                         ("fc features 7", {"fc.weight": ("F32", [10, 7])}),
                         ("bn counter F32", {"bn1.num_batches_tracked": ("F32", [])}),
                         ("bn counter [1]", {"bn1.num_batches_tracked": ("I64", [1])}),
                         ("conv1 5x5", {"conv1.weight": ("F32", [8, 3, 5, 5])})]:
        add(f"weights: {name}", "weights", encode_st(*safetensors(dict(base, **change), rng)))
    for model in ["resnet34", "resnet50"]:
        add(f"weights: resnet18 weights for {model}", "model:" + model, encode_st(wh, wd))
    cases = []
    # Endless and special files where a file is read.
    for special in ["/dev/zero", "/dev/full", "/dev/null", d]:
        for flag in ["--weights", "--input", "--tuning-cache"]:
            argv = [ctx.dlprobe, "step", "--device", "cpu", "--model", "resnet18", "--weights",
                    ctx.weights, "--input", ctx.batch, "--output", os.path.join(d, "o.st")]
            if flag == "--tuning-cache":
                argv += [flag, special]
            else:
                argv[argv.index(flag) + 1] = special
            cases.append(Case("3 safetensors", f"step {flag} {special}", argv, timeout=60))
        cases.append(Case("3 safetensors", f"bench --tuning-cache {special}",
                          [ctx.dlprobe, "bench", "--device", "cpu", *TINY_BENCH, "--tuning-cache",
                           special], timeout=60))
    for i, (name, which, path) in enumerate(files):
        out = os.path.join(d, f"out{i}.safetensors")
        weights = path if which != "input" else ctx.weights
        batch = path if which == "input" else ctx.batch
        cases.append(Case("3 safetensors", name,
                          [ctx.dlprobe, "step", "--device", "cpu", "--model",
                           which[6:] if which.startswith("model:") else "resnet18",
                           "--weights", weights, "--input", batch, "--output", out], timeout=90,
                          check=lambda rc, o, e, out=out: None if rc != 0 or (
                              os.path.exists(out) and os.path.getsize(out) > 8)
                          else f"{out} missing after exit 0"))
    return cases


# ---------------------------------------------------------------------------------------------
# Family 4: faulty workloads under dlprobe run


def family_run(ctx):
    d = ctx.tmp("f4")
    dl = shlex.quote(ctx.dlprobe)
    py = shlex.quote(sys.executable)
    W = {
        "segfault": "kill -SEGV $$",
        "abort": "echo '10 img/s'; kill -ABRT $$",
        "huge line": f"{py} -c \"import sys; sys.stdout.write('x'*(64<<20)+'\\n')\"",
        "huge line no newline": f"{py} -c \"import sys; sys.stdout.write('y'*(16<<20))\"",
        "binary output": "head -c 4000000 /dev/urandom",
        "no newline": "printf '100 img/s'",
        "NaN throughput": "for i in 1 2 3 4 5 6 7 8; do echo 'step 1 nan img/s'; done",
        "negative throughput": "for i in 1 2 3 4 5 6 7 8; do echo 'step 1 -5 img/s'; done",
        "inf throughput": "for i in 1 2 3 4 5 6 7 8; do echo 'step 1 inf img/s'; echo '1e999 img/s'; done",
        "setsid child": "setsid sh -c 'sleep 30' & echo '5 img/s'",
        "daemon child": "( ( sleep 30 & ) & ) ; echo started",
        "closes stdout": "exec >&- 2>&-; sleep 0.5",
        "fork bomb under ulimit": "ulimit -u 60 2>/dev/null; for i in $(seq 200); do sleep 2 & done; wait",
        "stderr flood": f"{py} -c \"import sys\nfor i in range(200000): sys.stderr.write('e%d\\n'%i)\"",
        "exit 255": "exit 255",
        "many lines": "seq 1 300000",
        "invalid UTF-8": "printf '\\xff\\xfe 12 img/s\\n\\xc3\\n'",
    }
    cases = []
    for name, script in W.items():
        j = os.path.join(d, f"{len(cases)}.json")
        cases.append(Case("4 run workloads", name,
                          [ctx.dlprobe, "run", "-q", "--timeout", "20s", "--kill-grace", "1s",
                           "--json", j, "--details-json", j + ".details", "--shell", "--", script],
                          timeout=60, check=absent_or_valid(j)))
    # Hangs, timeouts.
    for name, extra, script in [
            ("hang-after", ["--hang-after", "1s"], "echo '1 img/s'; sleep 60"),
            ("timeout", ["--timeout", "1s"], "sleep 60"),
            ("timeout ignores TERM", ["--timeout", "1s"], "trap '' TERM; sleep 60"),
            ("hang-after, child ignores INT and TERM", ["--hang-after", "1s"],
             "trap '' INT TERM; echo x; sleep 60")]:
        j = os.path.join(d, f"{len(cases)}.json")
        cases.append(Case("4 run workloads", name,
                          [ctx.dlprobe, "run", "-q", "--kill-grace", "1s", *extra, "--json", j,
                           "--shell", "--", script], timeout=40, check=absent_or_valid(j)))
    # SIGPIPE: dlprobe's own stdout goes into head -1 (a death by SIGPIPE, 141, is what a Unix
    # tool does there; the results file must survive it).
    for name, args in [("stdout to head -1", "--shell -- seq 1 100000"),
                       ("details to head -1", "--details-json - --shell -- seq 1 1000"),
                       ("bench table to head -1", "")]:
        j = os.path.join(d, f"{len(cases)}.json")
        cmd = (f"{dl} bench --device cpu {' '.join(TINY_BENCH[:-1])} --json {j}"
               if not args else f"{dl} run --json {j} {args}")
        cases.append(Case("4 run workloads", name,
                          ["bash", "-c", f"{cmd} | head -1; exit ${{PIPESTATUS[0]}}"],
                          timeout=60, codes=(0, 1, 2, 141), check=absent_or_valid(j)))
    # Signals to dlprobe mid-sweep: the --json file keeps the finished points.
    for k, (sig, after) in enumerate([(signal.SIGINT, 2.5), (signal.SIGTERM, 2.5),
                                      (signal.SIGKILL, 2.5), (signal.SIGINT, 0.05),
                                      (signal.SIGTERM, 0.3), (signal.SIGINT, 4.5),
                                      (signal.SIGTERM, 1.3), (signal.SIGKILL, 4.2)]):
        j = os.path.join(d, f"sweep{k}.json")
        argv = [ctx.dlprobe, "run", "-q", "--kill-grace", "1s", "--sweep", "N=1,2,3,4,5,6,7,8",
                "--json", j, "--shell", "--", "echo '{N}0 img/s'; sleep 0.8; echo '{N}0 img/s'"]

        def check(rc, out, err, j=j, sig=sig, after=after):
            finished = err.count(b"dlprobe run [") // 2  # an announced line and a verdict each
            if not os.path.exists(j):
                return None if after < 1 else f"{j} missing after {after}s"
            return json_file_problem(j, want_configs=max(0, int(after / 1.0) - 1))

        cases.append(Case("4 run workloads", f"{signal.Signals(sig).name} after {after}s",
                          argv, timeout=40, interrupt=(sig, after), check=check,
                          codes=(0, 1, 2, 130, 143)))
    return cases


# ---------------------------------------------------------------------------------------------
# Family 5: clients of monitor --serve


def family_serve(ctx):
    """Runs its own cases against one server (returns finished results, not Cases)."""
    results = []
    env = dict(os.environ, **SAN_ENV, DLPROBE_NVML_LIBRARY=ctx.fake_nvml,
               DLPROBE_FAKE_NVML_SCRIPT=ctx.nvml_script)
    argv = [ctx.dlprobe, "monitor", "-i", "50ms", "--serve", "127.0.0.1:0"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    err = b""
    port = None
    deadline = time.monotonic() + 20
    os.set_blocking(proc.stderr.fileno(), False)
    while time.monotonic() < deadline and port is None:
        chunk = proc.stderr.read() or b""
        err += chunk
        m = re.search(rb"http://127\.0\.0\.1:(\d+)/metrics", err)
        port = int(m.group(1)) if m else None
        time.sleep(0.05)
    repro = " ".join(shlex.quote(a) for a in argv)

    def record(name, verdict, detail):
        results.append(("5 monitor --serve", name, verdict, detail, repro))

    if port is None:
        proc.kill()
        record("server start", "other", f"no port announced: {err[-500:]!r}")
        return results

    def request(raw, *, timeout=8.0, slow=None):
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        try:
            if slow:
                for b in raw:
                    s.sendall(bytes([b]))
                    time.sleep(slow)
            else:
                s.sendall(raw)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            return data
        except (socket.timeout, ConnectionError, BrokenPipeError) as e:
            return f"<{type(e).__name__}>".encode()
        finally:
            s.close()

    def healthy(name):
        # Past its bound of open connections the server answers 503 at once, and it closes a
        # connection that sends no request within its read timeout (2 s): a good request must be
        # served within a few seconds, whatever the other clients do.
        t = time.monotonic()
        while True:
            r = request(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                        timeout=10)
            if not r.startswith(b"HTTP/1.1 503") or time.monotonic() - t > 5:
                break
            time.sleep(0.2)
        if proc.poll() is not None:
            record(name, "crash", f"server exited {proc.returncode}")
            return False
        if not r.startswith(b"HTTP/1.1 200"):
            record(name, "hang" if r.startswith(b"<") else "other",
                   f"a good request after it got {r[:120]!r} in {time.monotonic() - t:.1f}s")
            return False
        record(name, "ok", f"then a good request served in {time.monotonic() - t:.2f}s")
        return True

    rng = ctx.rng
    bad_lines = [b"", b"\r\n", b"GET\r\n\r\n", b"GET /metrics\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
                 b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999999999\r\n\r\n",
                 b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                 b"GET " + b"/" * 100000 + b" HTTP/1.1\r\n\r\n",
                 b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 20000 + b"\r\n",
                 b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 1000000 + b"\r\n\r\n",
                 b"\x00\xff\xfe" * 1000, b"GET /%00%ff HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                 b"GET /metrics HTTP/1.1\nHost: 127.0.0.1\n\n",
                 b"GET /metrics?" + b"a=1&" * 20000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                 b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nRange: bytes=0-1,-5,9999999999-\r\n\r\n"]
    hosts = [b"", b"evil.example", b"127.0.0.1:1", b"[::1", b"[::1]:99999999", b"localhost:-1",
             b"127.0.0.1:" + b"9" * 1000, b"\xff\xfe", b"a" * 100000, b"127.0.0.1, evil",
             b"[" + b":" * 1000 + b"]", b"127.0.0.1\x00evil"]
    for i, raw in enumerate(bad_lines):
        request(raw)
        healthy(f"malformed request #{i}: {raw[:40]!r}")
    for h in hosts:
        r = request(b"GET /metrics HTTP/1.1\r\nHost: " + h + b"\r\nConnection: close\r\n\r\n")
        status = r[:12]
        if status.startswith(b"HTTP/1.1 200"):
            record(f"Host {h[:30]!r}", "other", "served 200 to a Host that does not name it")
        healthy(f"Host {h[:30]!r} ({status!r})")
    # Slowloris: many clients dribbling bytes, then a good request must still be served.
    slow = []
    for _ in range(40):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            slow.append(s)
        except OSError:
            break
    t_end = time.monotonic() + 6
    while time.monotonic() < t_end:
        for s in slow:
            try:
                s.sendall(b"X: " + bytes([rng.randrange(97, 123)]) + b"\r\n")
            except OSError:
                pass
        time.sleep(0.5)
    healthy(f"slowloris x{len(slow)} for 6 s")
    for s in slow:
        s.close()
    # Many idle connections.
    idle = []
    for _ in range(300):
        try:
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            break
    time.sleep(1)
    healthy(f"{len(idle)} idle connections open")
    for s in idle:
        s.close()
    # Clients that read nothing of a large response, and a reset mid-request.
    for i in range(20):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 50)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    healthy("50 pipelined requests, then a reset without reading")
    proc.send_signal(signal.SIGINT)
    try:
        _, rest = proc.communicate(timeout=20)
        err += rest or b""
        if SANITIZER.search(err):
            record("SIGINT at the end", "crash", err[-1500:].decode("utf-8", "replace"))
        elif proc.returncode not in (0, 1, 2, 130):
            record("SIGINT at the end", "crash" if proc.returncode < 0 else "other",
                   f"exit {proc.returncode}: {err[-400:]!r}")
        else:
            record("SIGINT at the end", "ok", f"exit {proc.returncode}")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        record("SIGINT at the end", "hang", "did not stop within 20 s of SIGINT")
    return results


# ---------------------------------------------------------------------------------------------
# Family 6: odd output paths


def family_outputs(ctx):
    d = ctx.tmp("f6")
    cases = []
    precious = b'{"precious": true}\n'

    def fresh(name):
        sub = os.path.join(d, f"{len(cases)}")
        os.makedirs(sub)
        return sub

    def keep_check(path, content):
        def check(rc, out, err):
            now = open(path, "rb").read() if os.path.exists(path) else None
            return None if now == content else f"{path} overwritten (exit {rc})"
        return check

    producers = {
        "report": lambda o: [ctx.dlprobe, "report", ctx.bench_json, "-o", o],
        "report.md": lambda o: [ctx.dlprobe, "report", ctx.bench_json, "-o", o],
        "memory": lambda o: [ctx.dlprobe, "memory", "--predict-only", "--calibration",
                             ctx.memory_json, *TINY, "--batch", "2", "--json", o],
        "bench": lambda o: [ctx.dlprobe, "bench", "--device", "cpu", *TINY_BENCH, "--json", o],
        "run": lambda o: [ctx.dlprobe, "run", "-q", "--json", o, "--", "echo", "5 img/s"],
        "step": lambda o: [ctx.dlprobe, "step", "--device", "cpu", "--model", "resnet18",
                           "--weights", ctx.weights, "--input", ctx.batch, "--output", o],
    }
    for pname, make in producers.items():
        ext = ".md" if pname == "report.md" else ".html" if pname == "report" else (
            ".safetensors" if pname == "step" else ".json")
        sub = fresh(pname)
        cases.append(Case("6 output paths", f"{pname}: to a directory", make(sub), timeout=60))
        ro = os.path.join(sub, "ro")
        os.makedirs(ro)
        os.chmod(ro, 0o500)
        cases.append(Case("6 output paths", f"{pname}: in an unwritable directory",
                          make(os.path.join(ro, "x" + ext)), timeout=60,
                          codes=(0, 1, 2)))  # root can still write; then it must be valid
        target = os.path.join(sub, "precious" + ext)
        open(target, "wb").write(precious)
        cases.append(Case("6 output paths", f"{pname}: over an existing file", make(target),
                          timeout=60, check=keep_check(target, precious)))
        link_target = os.path.join(sub, "linked" + ext)
        open(link_target, "wb").write(precious)
        link = os.path.join(sub, "link" + ext)
        os.symlink(link_target, link)
        cases.append(Case("6 output paths", f"{pname}: through a symlink to an existing file",
                          make(link), timeout=60, check=keep_check(link_target, precious)))
        dangling = os.path.join(sub, "dangling" + ext)
        os.symlink(os.path.join(sub, "nowhere", "x"), dangling)
        cases.append(Case("6 output paths", f"{pname}: through a dangling symlink",
                          make(dangling), timeout=60))
        cases.append(Case("6 output paths", f"{pname}: /dev/full", make("/dev/full"), timeout=60,
                          check=lambda rc, o, e: "exit 0 although /dev/full took nothing"
                          if rc == 0 else None))
        cases.append(Case("6 output paths", f"{pname}: '-'", make("-"), timeout=60))
        empty = os.path.join(sub, "empty" + ext)
        open(empty, "wb").close()
        cases.append(Case("6 output paths", f"{pname}: over an empty file", make(empty),
                          timeout=60, check=absent_or_valid(empty) if ext == ".json" else None))
    # Two outputs to one file.
    sub = fresh("same")
    same = os.path.join(sub, "same.json")
    for name, argv in [
            ("bench --json X --csv X", [ctx.dlprobe, "bench", "--device", "cpu", *TINY_BENCH,
                                        "--json", same, "--csv", same]),
            ("bench --json - --md -", [ctx.dlprobe, "bench", "--device", "cpu", *TINY_BENCH,
                                       "--json", "-", "--md", "-"]),
            ("run --json X --details-json X", [ctx.dlprobe, "run", "-q", "--json", same,
                                               "--details-json", same, "--", "true"]),
            ("run --json - --details-json -", [ctx.dlprobe, "run", "-q", "--json", "-",
                                               "--details-json", "-", "--", "true"]),
            ("step --output X --state-output X",
             [ctx.dlprobe, "step", "--device", "cpu", "--model", "resnet18", "--weights",
              ctx.weights, "--input", ctx.batch, "--output", same, "--state-output", same]),
            ("step --state-output over its own --weights",
             [ctx.dlprobe, "step", "--device", "cpu", "--model", "resnet18", "--weights",
              ctx.weights_copy, "--input", ctx.batch, "--output", os.path.join(sub, "g.st"),
              "--state-output", ctx.weights_copy]),
            ("report -o over its own input",
             [ctx.dlprobe, "report", ctx.bench_copy, "-o", ctx.bench_copy]),
            ("memory --json over its own --calibration",
             [ctx.dlprobe, "memory", "--predict-only", "--calibration", ctx.memory_copy, *TINY,
              "--batch", "2", "--json", ctx.memory_copy])]:
        cases.append(Case("6 output paths", name, argv, timeout=60))
    for path, original in [(ctx.weights_copy, open(ctx.weights, "rb").read()),
                           (ctx.bench_copy, open(ctx.bench_json, "rb").read()),
                           (ctx.memory_copy, open(ctx.memory_json, "rb").read())]:
        cases[-1 if path == ctx.memory_copy else -2 if path == ctx.bench_copy else -3].check = \
            keep_check(path, original)
    # Standard output on a full device: what a command prints there is its result (compare's
    # verdicts and JSON, doctor's report, the tables), so exit 0 would say it was delivered.
    dl = shlex.quote(ctx.dlprobe)
    for name, cmd in [
            ("compare > /dev/full", f"{dl} compare {ctx.bench_json} {ctx.bench_json}"),
            ("compare --json > /dev/full", f"{dl} compare --json {ctx.bench_json} {ctx.bench_json}"),
            ("doctor --json > /dev/full", f"{dl} doctor --json"),
            ("memory --predict-only > /dev/full",
             f"{dl} memory --predict-only --calibration {ctx.memory_json} {' '.join(TINY)} "
             "--batch 2"),
            ("bench table > /dev/full", f"{dl} bench --device cpu {' '.join(TINY_BENCH)}"),
            ("memory --json - > /dev/full",
             f"{dl} memory --predict-only --calibration {ctx.memory_json} {' '.join(TINY)} "
             "--batch 2 --json -"),
            ("run --json - > /dev/full", f"{dl} run -q --json - -- echo '5 img/s'")]:
        cases.append(Case("6 output paths", name, ["bash", "-c", f"{cmd} > /dev/full"],
                          timeout=60, check=lambda rc, o, e: "exit 0 although standard output "
                          "took nothing" if rc == 0 else None))
    return cases


# ---------------------------------------------------------------------------------------------
# Family 7: Ctrl-C in bench --device cpu sweeps


def family_bench_interrupt(ctx, count):
    rng, d = ctx.rng, ctx.tmp("f7")
    cases = []

    def sweep(j):
        return [ctx.dlprobe, "bench", "--device", "cpu", *TINY_BENCH[:8], "--batch", "2,3,4,5",
                "--steps", "1", "--warmup", "0", "--min-time", "0s", "--warmup-time", "0s",
                "--no-ceiling", "--json", j]

    # The signal lands within the sweep's length on this machine, timed once uninterrupted.
    t0 = time.monotonic()
    subprocess.run(sweep(os.path.join(d, "timing.json")), env=dict(os.environ, **SAN_ENV),
                   capture_output=True)
    length = time.monotonic() - t0
    for k in range(count):
        j = os.path.join(d, f"{k}.json")
        after = round(rng.uniform(0.05, 1.0) * length, 2)
        argv = sweep(j)

        def check(rc, out, err, j=j):
            # Progress prints each configuration's line ("[k/4] ...: N img/s") as it finishes.
            finished = len(re.findall(rb"^\[\d+/4\] .* img/s", err, re.M))
            if not os.path.exists(j):
                return None if finished == 0 else f"{j} missing, {finished} finished"
            return json_file_problem(j, want_configs=finished)

        cases.append(Case("7 bench Ctrl-C", f"SIGINT after {after}s", argv, timeout=60,
                          interrupt=(signal.SIGINT, after), check=check, codes=(0, 1, 2, 130)))
    return cases


# ---------------------------------------------------------------------------------------------


class Context:
    def __init__(self, args):
        self.dlprobe = os.path.abspath(args.dlprobe)
        self.fake_nvml = os.path.abspath(args.fake_nvml)
        self.rng = random.Random(args.seed)
        self.root = tempfile.mkdtemp(prefix="dlprobe-hostile-")

    def tmp(self, name):
        path = os.path.join(self.root, name)
        os.makedirs(path, exist_ok=True)
        return path

    def setup(self, repo):
        d = self.tmp("base")
        self.bench_json = os.path.join(d, "bench.json")
        self.memory_json = os.path.join(d, "memory.json")
        env = dict(os.environ, **SAN_ENV)
        subprocess.run([self.dlprobe, "bench", "--device", "cpu", *TINY_BENCH[:8], "--batch",
                        "2,4", *TINY_BENCH[10:], "--json", self.bench_json], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        subprocess.run([self.dlprobe, "memory", "--device", "cpu", *TINY, "--batch", "2",
                        "--warmup", "0", "--json", self.memory_json], check=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rng = random.Random(0)
        self.weights_parts = safetensors(resnet18_state(), rng)
        self.batch_parts = safetensors({"images": ("F32", [2, 3, 32, 32]),
                                        "labels": ("I64", [2])}, rng)
        self.weights = os.path.join(d, "weights.safetensors")
        self.batch = os.path.join(d, "batch.safetensors")
        open(self.weights, "wb").write(encode_st(*self.weights_parts))
        open(self.batch, "wb").write(encode_st(*self.batch_parts))
        self.weights_copy = os.path.join(d, "weights-copy.safetensors")
        self.bench_copy = os.path.join(d, "bench-copy.json")
        self.memory_copy = os.path.join(d, "memory-copy.json")
        for src, dst in [(self.weights, self.weights_copy), (self.bench_json, self.bench_copy),
                         (self.memory_json, self.memory_copy)]:
            shutil.copy(src, dst)
        check = subprocess.run([self.dlprobe, "step", "--device", "cpu", "--model", "resnet18",
                                "--weights", self.weights, "--input", self.batch, "--output",
                                os.path.join(d, "grads.safetensors")], env=env,
                               capture_output=True)
        if check.returncode != 0:
            sys.exit(f"the base safetensors do not run: {check.stderr.decode()[-500:]}")
        self.nvml_script = os.path.join(d, "nvml.txt")
        header = open(os.path.join(repo, "tests/monitor/fake_script.h")).read()
        m = re.search(r'kH200Script = R"\((.*?)\)";', header, re.S)
        open(self.nvml_script, "w").write(m.group(1) if m else "")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dlprobe", default=os.path.join(repo, "build-test/dlprobe"))
    ap.add_argument("--fake-nvml", default=os.path.join(
        repo, "build-test/tests/monitor/fake_nvml/libfake_nvml.so"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--families", default="1,2,3,4,5,6,7", help="which families, e.g. 1,3")
    ap.add_argument("--cli-cases", type=int, default=600, help="command lines in family 2")
    ap.add_argument("--interrupts", type=int, default=8, help="Ctrl-C cases in family 7")
    ap.add_argument("--failures", default="hostile-failures.json")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--all", action="store_true", help="also write the passing cases")
    args = ap.parse_args()
    ctx = Context(args)
    ctx.setup(repo)
    want = set(args.families.split(","))
    gens = [("1", lambda: family_results(ctx)), ("2", lambda: family_cli(ctx, args.cli_cases)),
            ("3", lambda: family_safetensors(ctx)), ("4", lambda: family_run(ctx)),
            ("5", None), ("6", lambda: family_outputs(ctx)),
            ("7", lambda: family_bench_interrupt(ctx, args.interrupts))]
    results = []  # (family, name, verdict, detail, repro)
    for key, gen in gens:
        if key not in want:
            continue
        t0 = time.monotonic()
        if gen is None:
            results += family_serve(ctx)
        else:
            for case in gen():
                verdict, detail = run_case(case)
                results.append((case.family, case.name, verdict, detail, case.repro()))
                if verdict != "ok":
                    print(f"  {verdict}: {case.family} / {case.name}: {detail[:300]}",
                          file=sys.stderr)
        print(f"family {key}: {time.monotonic() - t0:.0f}s", file=sys.stderr)
    table = {}
    for fam, _, verdict, _, _ in results:
        row = table.setdefault(fam, {"cases": 0, "crash": 0, "hang": 0, "lost": 0, "other": 0})
        row["cases"] += 1
        if verdict != "ok":
            row[verdict] += 1
    print(f"{'family':24} {'cases':>6} {'crashes':>8} {'hangs':>6} {'lost':>6} {'other':>6}")
    total = {"cases": 0, "crash": 0, "hang": 0, "lost": 0, "other": 0}
    for fam in sorted(table):
        r = table[fam]
        print(f"{fam:24} {r['cases']:6} {r['crash']:8} {r['hang']:6} {r['lost']:6} {r['other']:6}")
        for k in total:
            total[k] += r[k]
    print(f"{'total':24} {total['cases']:6} {total['crash']:8} {total['hang']:6} "
          f"{total['lost']:6} {total['other']:6}")
    failures = [{"family": f, "case": n, "verdict": v, "detail": d, "reproduce": r}
                for f, n, v, d, r in results if v != "ok" or args.all]
    with open(args.failures, "w") as f:
        json.dump({"seed": args.seed, "table": table, "failures": failures}, f, indent=1)
    if not args.keep:
        for dirpath, dirnames, _ in os.walk(ctx.root):
            for name in dirnames:
                os.chmod(os.path.join(dirpath, name), 0o700)
        shutil.rmtree(ctx.root, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
