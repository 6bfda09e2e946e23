#!/usr/bin/env python3
"""Checks what `dlprobe run` reported for a workload against independent readings (its acceptance
checks, run by lab/gpu/external.sh on the GPU machine). Standard library only.

  run    one run: the peak GPU memory dlprobe reports against nvidia-smi's reading of the same
         processes over the same time (within --tolerance percent), and the throughput dlprobe
         computed against the figure the script printed itself (its last images_per_s line)
  sweep  a sweep: every point ran, at least one ran out of memory and was reported as such, and
         the sweep findings name it

Each prints its verdict on one line per check and appends a JSON object to --json-out.

nvidia-smi logs, as external.sh starts them (-lms 100, csv, noheader, nounits):
  apps  --query-compute-apps=timestamp,pid,process_name,used_memory   (or without timestamp)
  gpu   --query-gpu=timestamp,index,memory.used
"""
import argparse
import json
import sys

MIB = 1024 * 1024


def read_details(path):
    with open(path) as f:
        doc = json.load(f)
    if doc.get("schema") != "dlprobe.run/1":
        raise ValueError(f"{path}: not a dlprobe.run/1 file")
    return doc


def apps_peak(path, exclude):
    """Peak MiB of the compute processes nvidia-smi listed, leaving out `exclude` (the pids there
    before the workload started): per sample (rows of one timestamp) summed over pids when the
    log has timestamps, else the largest single pid. Returns (MiB, pids, how)."""
    rows = []
    with open(path) as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 4:
                stamp, pid, _, used = parts
            elif len(parts) == 3:
                stamp, (pid, _, used) = None, parts
            else:
                continue
            try:
                if int(pid) not in exclude:
                    rows.append((stamp, int(pid), float(used)))
            except ValueError:
                continue  # "[N/A]", "[Not Supported]"
    if not rows:
        return None, [], "nvidia-smi listed no new compute process"
    pids = sorted({r[1] for r in rows})
    if rows[0][0] is not None:
        per_sample = {}
        for stamp, _, used in rows:
            per_sample[stamp] = per_sample.get(stamp, 0.0) + used
        return max(per_sample.values()), pids, "the workload's pids summed per sample"
    per_pid = {}
    for _, pid, used in rows:
        per_pid[pid] = max(per_pid.get(pid, 0.0), used)
    return max(per_pid.values()), pids, "largest single pid (no timestamps in the log)"


def device_peak(path):
    """Device-wide used MiB: the peak over the log minus its first sample (before the start)."""
    used = []
    with open(path) as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            try:
                used.append(float(parts[-1]))
            except (ValueError, IndexError):
                continue
    if len(used) < 2:
        return None
    return max(used) - used[0]


def script_rate(path):
    """The last rate the workload printed itself ({"dlprobe": {"images_per_s": X}})."""
    rate = None
    with open(path, errors="replace") as f:
        for line in f:
            at = line.find('{"dlprobe"')
            if at < 0:
                continue
            try:
                fields = json.loads(line[at:])["dlprobe"]
            except (ValueError, KeyError, TypeError):
                continue
            for key in ("images_per_s", "items_per_s", "samples_per_s"):
                if key in fields and "step" not in fields:
                    rate = float(fields[key])
    return rate


def pct(a, b):
    return 100.0 * (a - b) / b


def check_run(args):
    doc = read_details(args.details)
    if not doc["runs"]:
        print(f"{args.name}: FAIL no run in {args.details}")
        return {"name": args.name, "ok": False, "error": "no run"}
    r = doc["runs"][0]
    g = r["gpu"]
    out = {"name": args.name, "outcome": r["outcome"], "attribution": g["attribution"],
           "findings": [f["id"] for f in r["findings"]], "ok": True,
           "gpu_util_median_pct": g["util_median_pct"],
           "host_cpu_median_pct": r["host"]["cpu_median_pct"],
           "busiest_process_median_pct": r["host"]["busiest_process_median_pct"],
           "framework_peak_mib": (r["framework"]["peak_bytes"] or 0) / MIB or None}
    if r["outcome"] != "ok":
        out["ok"] = False
        print(f"{args.name}: FAIL the run ended {r['outcome']}: {r['error_line'] or ''}")

    dl = g["peak_bytes"] / MIB if g["peak_bytes"] is not None else None
    out["dlprobe_peak_mib"] = dl
    if g["attribution"] in ("process_tree", "new_processes"):
        exclude = {int(x) for x in args.exclude_pids.split(",") if x.strip().isdigit()}
        nv, pids, how = apps_peak(args.smi_apps, exclude)
    else:
        nv, pids, how = device_peak(args.smi_gpu), [], "device-wide used minus before the start"
    out.update({"nvidia_smi_peak_mib": nv, "nvidia_smi_pids": pids, "nvidia_smi_how": how})
    if dl is None or nv is None or nv <= 0:
        out["ok"] = False
        print(f"{args.name}: FAIL peak memory: dlprobe {dl}, nvidia-smi {nv} ({how})")
    else:
        diff = pct(dl, nv)
        within = abs(diff) <= args.tolerance
        out.update({"memory_diff_pct": diff, "memory_within_tolerance": within})
        out["ok"] = out["ok"] and within
        print(f"{args.name}: {'PASS' if within else 'FAIL'} peak GPU memory: dlprobe {dl:.0f} MiB "
              f"({g['attribution']}), nvidia-smi {nv:.0f} MiB ({how}; pids {pids}): "
              f"{diff:+.2f} % (bound {args.tolerance:g} %)")

    mine = r["throughput"]["items_per_s"]
    theirs = script_rate(args.stdout_log)
    out.update({"dlprobe_items_per_s": mine, "script_images_per_s": theirs,
                "throughput_source": r["throughput"]["source"],
                "steps_measured": r["throughput"]["steps_measured"]})
    if mine is None or theirs is None:
        out["ok"] = False
        print(f"{args.name}: FAIL throughput: dlprobe {mine}, script {theirs}")
    else:
        diff = pct(mine, theirs)
        # Same definition on both sides (batch * steps / sum of step times), printed to 17
        # digits by the script: only rounding may differ.
        same = abs(diff) <= 0.01
        out.update({"throughput_diff_pct": diff})
        out["ok"] = out["ok"] and same
        print(f"{args.name}: {'PASS' if same else 'FAIL'} throughput: dlprobe {mine:.1f} items/s "
              f"from {r['throughput']['steps_measured']} steps, the script printed "
              f"{theirs:.1f} ({diff:+.4f} %)")
    util = g["util_median_pct"]
    print(f"{args.name}: findings {', '.join(out['findings']) or 'none'}; GPU util median over "
          f"the measured steps {util if util is None else f'{util:.0f} %'}, workload CPU median "
          f"{r['host']['cpu_median_pct']} % (busiest process "
          f"{r['host']['busiest_process_median_pct']} %)")
    return out


def check_sweep(args):
    doc = read_details(args.details)
    expected = args.points
    runs = doc["runs"]
    rows = []
    for r in runs:
        rows.append({"params": r["params"], "outcome": r["outcome"],
                     "items_per_s": r["throughput"]["items_per_s"],
                     "gpu_peak_mib": (r["gpu"]["peak_bytes"] or 0) / MIB or None,
                     "framework_peak_mib": (r["framework"]["peak_bytes"] or 0) / MIB or None,
                     "oom_line": (r["oom"] or {}).get("line")})
    sweep_ids = [f["id"] for f in doc["sweep_findings"]]
    ooms = [x for x in rows if x["outcome"] == "oom"]
    oks = [x for x in rows if x["outcome"] == "ok"]
    ok = len(runs) == expected and bool(ooms) and bool(oks) and "oom_batch" in sweep_ids
    for x in rows:
        ips = x["items_per_s"]
        print(f"{args.name}: {' '.join(f'{k}={v}' for k, v in x['params'].items()):<12} "
              f"{x['outcome']:<8} {'-' if ips is None else f'{ips:9.1f} items/s'}"
              + (f"  {x['oom_line'][:100]}" if x["oom_line"] else ""))
    print(f"{args.name}: {'PASS' if ok else 'FAIL'} sweep: {len(runs)} of {expected} points ran, "
          f"{len(oks)} ok, {len(ooms)} out of memory; sweep findings {', '.join(sweep_ids) or 'none'}")
    return {"name": args.name, "ok": ok, "points": rows, "sweep_findings": sweep_ids}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run")
    run.add_argument("--name", required=True)
    run.add_argument("--details", required=True, help="dlprobe run --details-json file")
    run.add_argument("--smi-apps", required=True)
    run.add_argument("--smi-gpu", required=True)
    run.add_argument("--stdout-log", required=True, help="the run's --log-dir stdout log")
    run.add_argument("--exclude-pids", default="",
                     help="comma-separated pids on the GPU before the workload started")
    run.add_argument("--tolerance", type=float, default=2.0, help="percent (default 2)")
    run.add_argument("--json-out")
    sweep = sub.add_parser("sweep")
    sweep.add_argument("--name", required=True)
    sweep.add_argument("--details", required=True)
    sweep.add_argument("--points", type=int, required=True, help="sweep points expected")
    sweep.add_argument("--json-out")
    args = p.parse_args()
    try:
        out = check_run(args) if args.what == "run" else check_sweep(args)
    except (OSError, ValueError, KeyError) as e:
        print(f"{args.name}: FAIL {e}")
        out = {"name": args.name, "ok": False, "error": str(e)}
    if args.json_out:
        with open(args.json_out, "a") as f:
            f.write(json.dumps(out) + "\n")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
