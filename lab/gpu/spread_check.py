#!/usr/bin/env python3
"""Whether separate processes' throughputs lie within the spread between runs that a
`dlprobe bench --repeat N` results file reports (run_spread: min, max and the t interval of the
mean), and within its interval within the steps. Prints one line per process and a verdict.

    python3 lab/gpu/spread_check.py repeat.json process1.json process2.json ...
"""
import json
import sys


def throughput(path):
    c = json.load(open(path))["configurations"][0]
    return c["statistics"]["throughput"], c


def main():
    repeat, c = throughput(sys.argv[1])
    spread = c.get("run_spread") or {}
    stats = c["statistics"]
    print(f"--repeat run: {repeat:,.1f} img/s; within the steps "
          f"[{stats['throughput_ci_low']:,.1f}, {stats['throughput_ci_high']:,.1f}]; "
          f"between runs {json.dumps(spread)}")
    low = spread.get("ci_low")
    high = spread.get("ci_high")
    if low is None or high is None:
        print("no spread between runs in the file")
        return 1
    inside = 0
    for path in sys.argv[2:]:
        got, _ = throughput(path)
        ok = low <= got <= high
        inside += ok
        within_steps = stats["throughput_ci_low"] <= got <= stats["throughput_ci_high"]
        print(f"{path}: {got:,.1f} img/s {'inside' if ok else 'OUTSIDE'} the t interval "
              f"[{low:,.1f}, {high:,.1f}]; {'inside' if within_steps else 'outside'} the interval "
              f"within the steps; {'inside' if spread['min'] <= got <= spread['max'] else 'outside'}"
              f" [min, max] of the runs")
    print(f"{inside} of {len(sys.argv) - 2} separate processes inside the spread between runs")
    return 0 if inside == len(sys.argv) - 2 else 1


if __name__ == "__main__":
    sys.exit(main())
