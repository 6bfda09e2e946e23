"""Compares `dlprobe monitor --csv` with `nvidia-smi dmon -s pm -o DT` recorded over the same time.

dmon prints one line a second; each is compared with the mean of dlprobe's samples in the second
before it. Prints per-second and whole-window agreement for board power and memory used, and exits
1 when the window means differ by more than --tolerance (default 2 %).
"""
import argparse
import csv
import datetime
import statistics
import sys


def read_dlprobe(path):
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("row", "gpu") not in ("gpu", ""):
                continue  # per-process rows
            if not row["power_w"] or not row["mem_used_mib"]:
                continue
            rows.append((float(row["unix_s"]), float(row["power_w"]), float(row["mem_used_mib"])))
    return rows


def read_dmon(path):
    rows = []
    header = None
    with open(path) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "#Date":
                header = parts
                continue
            if parts[0].startswith("#") or header is None:
                continue
            fields = dict(zip(header, parts))
            stamp = datetime.datetime.strptime(parts[0] + " " + parts[1], "%Y%m%d %H:%M:%S")
            t = stamp.replace(tzinfo=datetime.timezone.utc).timestamp()
            try:
                rows.append((t, float(fields["pwr"]), float(fields["fb"])))
            except (KeyError, ValueError):
                continue
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dlprobe_csv")
    parser.add_argument("dmon_txt")
    parser.add_argument("--tolerance", type=float, default=0.02)
    args = parser.parse_args()

    ours = read_dlprobe(args.dlprobe_csv)
    theirs = read_dmon(args.dmon_txt)
    if not ours or not theirs:
        print("monitor_vs_dmon: no data to compare", file=sys.stderr)
        return 2
    pairs = []
    for t, pwr, fb in theirs:
        window = [r for r in ours if t - 1.0 <= r[0] < t]
        if len(window) < 3:
            continue
        pairs.append((pwr, statistics.fmean(r[1] for r in window), fb,
                      statistics.fmean(r[2] for r in window)))
    if len(pairs) < 5:
        print(f"monitor_vs_dmon: only {len(pairs)} overlapping seconds", file=sys.stderr)
        return 2
    dmon_p = statistics.fmean(p[0] for p in pairs)
    ours_p = statistics.fmean(p[1] for p in pairs)
    dmon_m = statistics.fmean(p[2] for p in pairs)
    ours_m = statistics.fmean(p[3] for p in pairs)
    per_sec_p = [abs(p[1] - p[0]) / p[0] for p in pairs if p[0] > 0]
    per_sec_m = [abs(p[3] - p[2]) / p[2] for p in pairs if p[2] > 0]
    dp = abs(ours_p - dmon_p) / dmon_p
    dm = abs(ours_m - dmon_m) / dmon_m if dmon_m else 0.0
    print(f"seconds compared: {len(pairs)}")
    print(f"power W     : dmon {dmon_p:8.1f}  dlprobe {ours_p:8.1f}  window diff {dp * 100:5.2f} %"
          f"  per-second median diff {statistics.median(per_sec_p) * 100:5.2f} %")
    print(f"mem used MiB: dmon {dmon_m:8.0f}  dlprobe {ours_m:8.0f}  window diff {dm * 100:5.2f} %"
          f"  per-second median diff {statistics.median(per_sec_m) * 100 if per_sec_m else 0:5.2f} %")
    ok = dp <= args.tolerance and dm <= args.tolerance
    print("agreement within tolerance" if ok else "DISAGREEMENT beyond tolerance")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
