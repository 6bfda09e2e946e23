#!/usr/bin/env python3
"""One `dlprobe run` of a script that prints no step lines, against the script's own figure and
`nvidia-smi dmon -s u -o DT` recorded over the same seconds: prints the script's throughput and
dlprobe's, the window dlprobe used (steps or the steady phase it found, with its phases), its
findings, and the GPU utilisation over that window from both, with the checks of
docs/external.md's targets (throughput equal to the script's, utilisation within --tolerance
points of dmon's). Exits 1 when a check fails.

dmon stamps each line with the second of its reading (local time, the fraction cut off), so a
line is taken as the middle of its second; the launch's wall-clock time comes from the caller
(taken just before `dlprobe run`), so the comparison is good to about a second at each end.
"""
import argparse
import datetime
import json
import re
import statistics
import sys


def read_dmon(path, gpu):
    rows = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 4 or parts[0].startswith("#"):
                continue
            try:
                stamp = datetime.datetime.strptime(parts[0] + " " + parts[1], "%Y%m%d %H:%M:%S")
                index, sm = int(parts[2]), float(parts[3])
            except ValueError:
                continue  # "-" where a field is not supported
            if index == gpu:
                rows.append((stamp.timestamp() + 0.5, sm))
    return rows


def script_throughput(path):
    figure = None
    if path:
        with open(path, errors="replace") as f:
            for line in f:
                m = re.search(r"Throughput: ([0-9.]+) samples/sec", line)
                if m:
                    figure = float(m.group(1))
    return figure


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", required=True)
    p.add_argument("--details", required=True, help="dlprobe run --details-json")
    p.add_argument("--dmon", required=True, help="nvidia-smi dmon -s u -o DT output")
    p.add_argument("--launch-epoch", type=float, required=True)
    p.add_argument("--stdout-log", default="")
    p.add_argument("--tolerance", type=float, default=5.0, help="utilisation points")
    args = p.parse_args()

    try:
        with open(args.details) as f:
            run = json.load(f)["runs"][0]
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"{args.name}: FAIL no details ({e})")
        return 1
    ok = True
    mine = script_throughput(args.stdout_log)
    theirs = run["throughput"]["items_per_s"]
    print(f"{args.name}: outcome {run['outcome']}")
    print(f"  script's throughput  {mine}")
    print(f"  dlprobe's throughput {theirs} (source {run['throughput']['source']})")
    if mine is None or theirs is None or abs(theirs - mine) > 0.01 * mine:
        print("  FAIL throughput differs from the script's (or is missing)")
        ok = False
    w = run.get("window", {})
    ph = w.get("phases", {})
    print(f"  window: {w.get('source')} {w.get('start_s')}..{w.get('end_s')} s; phases: series "
          f"{ph.get('series')}, level {ph.get('level_pct')}%, start-up ends "
          f"{ph.get('startup_end_s')} s{'; ' + ph['why_none'] if ph.get('why_none') else ''}")
    print(f"  wall {run['wall_s']:.1f} s")
    for f in run["findings"]:
        print(f"  finding [{f['severity']}] {f['id']}: {f['title']} -- {f['evidence']}")
    gpus = run["gpu"].get("gpus_used") or [0]
    dmon = read_dmon(args.dmon, gpus[0])
    util = run["gpu"]["util_median_pct"]
    print(f"  dlprobe median GPU utilisation over the window: {util}")
    if w.get("start_s") is None:
        print("  no window: nothing to compare with dmon")
        return 0 if ok else 1
    start = args.launch_epoch + w["start_s"]
    end = args.launch_epoch + w["end_s"]
    inside = [sm for t, sm in dmon if start <= t <= end]
    whole = [sm for t, sm in dmon if args.launch_epoch <= t <= args.launch_epoch + run["wall_s"]]
    if whole:
        print(f"  dmon sm% over the whole run: median {statistics.median(whole):.0f} "
              f"({len(whole)} lines)")
    if not inside:
        print("  FAIL no dmon line inside the window")
        return 1
    dmon_median = statistics.median(inside)
    print(f"  dmon sm% over the window: median {dmon_median:.0f}, mean "
          f"{statistics.mean(inside):.0f}, min {min(inside):.0f}, max {max(inside):.0f} "
          f"({len(inside)} lines)")
    if util is None or abs(util - dmon_median) > args.tolerance:
        print(f"  FAIL utilisation differs from dmon's by more than {args.tolerance} points")
        ok = False
    ids = {f["id"] for f in run["findings"]}
    if dmon_median >= 70 and ids & {"host_bound", "gpu_underused"}:
        print("  FAIL a utilisation finding that dmon's window contradicts")
        ok = False
    print(f"  {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
