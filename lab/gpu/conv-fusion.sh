#!/usr/bin/env bash
# On a GPU machine over the bundle (scripts/gpu-bundle.sh): cuDNN's runtime fusion of a batch
# norm's apply and ReLU into the convolution after it (with the next batch norm's statistics in
# its epilogue) and into that convolution's weight gradient. First its test against the fp64
# reference (engine_cuda_test), then microbench/conv_fusion_gpu_bench.cpp over ResNet-50's
# bottleneck shapes: each operation alone, with the batch norm's passes before it (today's step;
# for the gradient, the recompute a step keeping only pre-norm tensors needs), and fused, at batch
# 256 and 32 (FILTER picks benchmarks by Google Benchmark's regex), and the fused calls with
# dlprobe's passes for the statistics and the prologue; then tables of what the fusion saves per
# shape and over the blocks that have those shapes, and of each fused call by who does its parts.
# Output in $OUT (or ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
. lab/gpu/common.sh
echo "== engine_cuda_test: the fused convolution against the reference"
timeout 300 "$bin/engine_cuda_test" --gtest_filter='*Fused*' 2>&1 | tail -n 30 | tee "$out/fused-test.txt"
echo "== bench_conv_fusion_gpu"
timeout 400 "$bin/bench_conv_fusion_gpu" --benchmark_format=json \
  --benchmark_out="$out/conv-fusion.json" --benchmark_out_format=json \
  ${FILTER:+--benchmark_filter="$FILTER"} >/dev/null 2>"$out/conv-fusion.err"
echo "exit $?"
tail -n 5 "$out/conv-fusion.err"
python3 - "$out/conv-fusion.json" <<'PY' | tee "$out/conv-fusion.txt"
import json, sys, collections
runs = json.load(open(sys.argv[1])).get("benchmarks", [])
# us per call by (label, variant); label "layer1 3x3 C=64 K=64 bs256".
t = collections.defaultdict(dict)
errors = []
for r in runs:
    variant = r["name"].split("/")[0]
    if r.get("error_occurred"):
        errors.append(f'{variant} {r.get("label", r["name"])}: {r.get("error_message", "")}')
        continue
    t[r["label"]][variant] = r["real_time"]
# Blocks per stage whose convolutions have these shapes (each stage's later blocks, stride 1).
blocks = {"layer1": 2, "layer2": 3, "layer3": 5, "layer4": 2}
def table(title, alone, unfused, fused):
    print(f'{title}\n{"shape":34} {"alone us":>9} {"unfused us":>11} {"fused us":>9} {"saved us":>9} {"fused/unfused":>13}')
    total = collections.defaultdict(lambda: [0.0, 0.0])
    for label, v in t.items():
        if not {alone, unfused, fused} <= v.keys():
            continue
        print(f'{label:34} {v[alone]:9.1f} {v[unfused]:11.1f} {v[fused]:9.1f} {v[unfused] - v[fused]:9.1f} {v[fused] / v[unfused]:13.3f}')
        k = blocks[label.split()[0]]
        total[label.split()[-1]][0] += k * v[unfused]
        total[label.split()[-1]][1] += k * v[fused]
    for batch, (u, f) in total.items():
        print(f'{batch}: over the stride-1 blocks after each stage\'s first, {u / 1e3:.2f} ms unfused '
              f'against {f / 1e3:.2f} ms fused ({(u - f) / 1e3:.2f} ms saved)')
    print()
table("forward: the convolution alone; batch norm + ReLU (statistics and apply) then the convolution; fused",
      "conv_alone", "bn_relu_then_conv", "fused")
print("statistics epilogue: the convolution alone, and with its output's sum and sum of squares")
print(f'{"shape":34} {"alone us":>9} {"with stats us":>14} {"added us":>9}')
for label, v in t.items():
    if {"conv_alone", "conv_stats"} <= v.keys():
        print(f'{label:34} {v["conv_alone"]:9.1f} {v["conv_stats"]:14.1f} {v["conv_stats"] - v["conv_alone"]:9.1f}')
print()
table("weight gradient: alone on the normalised input; its apply (running statistics) then the gradient; fused",
      "wgrad_alone", "bn_relu_apply_then_wgrad", "wgrad_fused")
# The fused calls with dlprobe's passes (bench --conv-sums / --conv-prologue pass) beside cuDNN's.
ways = [("fused", "cuDNN"), ("fused_sums_pass", "sums pass"), ("fused_prologue_pass", "prologue pass"),
        ("fused_both_passes", "both passes")]
print("fused forward (prologue and statistics), us a call, by who does them")
print(f'{"shape":34} ' + " ".join(f"{w:>14}" for _, w in ways))
for label, v in t.items():
    if any(k in v for k, _ in ways):
        print(f'{label:34} ' + " ".join(f'{v[k]:14.1f}' if k in v else f'{"-":>14}' for k, _ in ways))
print()
print("statistics alone (no prologue) and the fused weight gradient, us a call, cuDNN's or dlprobe's pass")
print(f'{"shape":34} {"conv_stats":>11} {"sums pass":>10} {"wgrad_fused":>12} {"prologue pass":>14}')
for label, v in t.items():
    cells = [v.get(k) for k in ("conv_stats", "conv_stats_sums_pass", "wgrad_fused", "wgrad_fused_prologue_pass")]
    if any(c is not None for c in cells):
        print(f'{label:34} ' + " ".join(f'{c:>{w}.1f}' if c is not None else f'{"-":>{w}}'
                                       for c, w in zip(cells, (11, 10, 12, 14))))
print()
for e in errors:
    print("error:", e)
PY
