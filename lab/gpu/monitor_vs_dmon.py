"""Compares `dlprobe monitor --csv` with `nvidia-smi dmon -s pm -o DT` recorded over the same time.

Both read the same NVML counters. dmon stamps each line with the second of its reading, the
fraction cut off, and its readings drift within that second (it even skips a stamp now and then),
so a line can only be placed somewhere in [stamp, stamp + 1 s). Each line is compared with the
mean of dlprobe's samples in that second when the value held steady over it (max/min within
--steady); lines that fall on a transition (load starting or stopping) are counted and left out,
since no sub-second time exists to compare them at. Prints per-line and whole-window agreement for
board power and memory used, and exits 1 when the window means differ by more than --tolerance
(default 2 %).
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


def steady(values, limit):
    lo, hi = min(values), max(values)
    return hi == lo or (lo > 0 and hi / lo - 1.0 <= limit)


def pair(ours, theirs, limit):
    """(dmon power, dlprobe power, dmon MiB, dlprobe MiB) per steady line, and the lines left out."""
    pairs, skipped = [], 0
    for t, pwr, fb in theirs:
        window = [r for r in ours if t <= r[0] < t + 1.0]
        if len(window) < 3:
            continue  # outside dlprobe's recording
        powers = [r[1] for r in window]
        mems = [r[2] for r in window]
        if not (steady(powers, limit) and steady(mems, limit)):
            skipped += 1
            continue
        pairs.append((pwr, statistics.fmean(powers), fb, statistics.fmean(mems)))
    return pairs, skipped


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dlprobe_csv")
    parser.add_argument("dmon_txt")
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--steady", type=float, default=0.05,
                        help="max/min - 1 over a second for it to count as steady")
    args = parser.parse_args()

    ours = read_dlprobe(args.dlprobe_csv)
    theirs = read_dmon(args.dmon_txt)
    if not ours or not theirs:
        print("monitor_vs_dmon: no data to compare", file=sys.stderr)
        return 2

    pairs, skipped = pair(ours, theirs, args.steady)
    if len(pairs) < 5:
        print(f"monitor_vs_dmon: only {len(pairs)} steady lines to compare", file=sys.stderr)
        return 2
    dmon_p = statistics.fmean(p[0] for p in pairs)
    ours_p = statistics.fmean(p[1] for p in pairs)
    dmon_m = statistics.fmean(p[2] for p in pairs)
    ours_m = statistics.fmean(p[3] for p in pairs)
    line_p = [abs(p[1] - p[0]) / p[0] for p in pairs if p[0] > 0]
    line_m = [abs(p[3] - p[2]) / p[2] for p in pairs if p[2] > 0]
    dp = abs(ours_p - dmon_p) / dmon_p
    dm = abs(ours_m - dmon_m) / dmon_m if dmon_m else 0.0
    print(f"dmon lines compared: {len(pairs)}; on a transition, left out: {skipped}")
    print(f"power W     : dmon {dmon_p:8.1f}  dlprobe {ours_p:8.1f}  window diff {dp * 100:5.2f} %"
          f"  per-line median diff {statistics.median(line_p) * 100:5.2f} %")
    print(f"mem used MiB: dmon {dmon_m:8.0f}  dlprobe {ours_m:8.0f}  window diff {dm * 100:5.2f} %"
          f"  per-line median diff {statistics.median(line_m) * 100 if line_m else 0:5.2f} %")
    ok = dp <= args.tolerance and dm <= args.tolerance
    print("agreement within tolerance" if ok else "DISAGREEMENT beyond tolerance")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
