#!/usr/bin/env python3
"""Nsight Compute's raw CSV (`ncu --csv --page raw`) as one row a kernel, the slowest first:
launches and time, and whichever of these metrics the run collected: grid and block size, SM and
DRAM throughput and warps active (% of peak, the mean over launches), DRAM bytes read and written
and the bandwidth they imply. --per N divides launches, time and bytes by N (the steps a run
profiled)."""
import argparse
import collections
import csv
import sys

TIME = "gpu__time_duration.sum"
PERCENTS = [("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM%"),
            ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM%"),
            ("sm__warps_active.avg.pct_of_peak_sustained_active", "warps%")]
BYTES = ["dram__bytes_read.sum", "dram__bytes_write.sum"]
SECONDS = {"ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3}
SIZES = {"byte": 1, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9}


def number(text):
    return float(text.replace(",", "")) if text.strip() else 0.0  # ncu writes 1,234.5


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("csv")
    parser.add_argument("--per", type=int, default=1, help="divide by this many steps")
    parser.add_argument("--width", type=int, default=70, help="characters of a kernel's name")
    args = parser.parse_args()
    try:
        with open(args.csv, newline="") as f:
            rows = [r for r in csv.reader(f) if r]
    except OSError as e:
        sys.exit(f"ncu_table: {args.csv}: {e.strerror}")
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head is None:
        # ncu writes no table when the profiled program fails or no kernel matched its filter.
        sys.exit(f"ncu_table: {args.csv}: no kernel table (did ncu or the program fail? see its "
                 "stderr)")
    names = rows[head]
    col = {n: names.index(n) for n in names}
    unit = {n: rows[head + 1][col[n]] for n in names}
    percents = [(m, label) for m, label in PERCENTS if m in col]
    has_bytes = all(m in col for m in BYTES)
    sizes = [m for m in ("launch__grid_size", "launch__block_size") if m in col]
    kernels = collections.OrderedDict()
    for r in rows[head + 2:]:
        if len(r) != len(names):
            continue
        # The full name: template arguments tell variants apart (dtype, pack, fused ReLU).
        k = kernels.setdefault(r[col["Kernel Name"]],
                               {"n": 0, "t": 0.0, "b": 0.0, "p": [0.0] * len(percents),
                                "sizes": [r[col[m]] for m in sizes]})
        k["n"] += 1
        k["t"] += number(r[col[TIME]]) * SECONDS[unit[TIME]]
        if has_bytes:
            k["b"] += sum(number(r[col[m]]) * SIZES[unit[m]] for m in BYTES)
        for i, (m, _) in enumerate(percents):
            k["p"][i] += number(r[col[m]])
    total = sum(k["t"] for k in kernels.values()) / args.per
    print(f"{len(kernels)} kernels, {sum(k['n'] for k in kernels.values()) // args.per} launches, "
          f"{total * 1e3:.3f} ms" + (f" per step (of {args.per} profiled)" if args.per > 1 else ""))
    header = f"{'kernel':{args.width}} {'calls':>6} {'ms':>8} {'us/call':>8}"
    header += "".join(f" {'grid' if m == 'launch__grid_size' else 'block':>6}" for m in sizes)
    header += f" {'GB':>7} {'TB/s':>5}" if has_bytes else ""
    header += "".join(f" {label:>6}" for _, label in percents)
    print(header)
    for name, k in sorted(kernels.items(), key=lambda kv: -kv[1]["t"]):
        line = (f"{name[:args.width]:{args.width}} {k['n'] // args.per:6d} "
                f"{k['t'] / args.per * 1e3:8.3f} {k['t'] / k['n'] * 1e6:8.1f}")
        line += "".join(f" {s:>6}" for s in k["sizes"])
        if has_bytes:
            line += f" {k['b'] / args.per / 1e9:7.2f} {k['b'] / k['t'] / 1e12 if k['t'] else 0:5.2f}"
        line += "".join(f" {p / k['n']:6.1f}" for p in k["p"])
        print(line)


if __name__ == "__main__":
    main()
