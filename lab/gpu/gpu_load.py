"""A GPU load with known phases for checking dlprobe's telemetry against nvidia-smi.

Holds a fixed block of device memory and runs bf16 matrix products in phases of different duty
cycle, so power moves while memory stays put. Runs for --seconds and exits.
"""
import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--hold-gib", type=float, default=20.0)
    args = parser.parse_args()

    dev = torch.device("cuda")
    hold = torch.empty(int(args.hold_gib * (1 << 30)), dtype=torch.uint8, device=dev)
    hold.fill_(1)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    torch.cuda.synchronize()
    start = time.monotonic()
    # Each phase: (seconds, fraction of the time busy).
    phases = [(7.0, 1.0), (6.0, 0.3), (7.0, 1.0), (6.0, 0.0)]
    while time.monotonic() - start < args.seconds:
        for seconds, duty in phases:
            phase_end = time.monotonic() + seconds
            while time.monotonic() < phase_end:
                busy_end = time.monotonic() + 0.1 * duty
                while time.monotonic() < busy_end:
                    for _ in range(4):
                        a @ b
                    torch.cuda.synchronize()
                time.sleep(0.1 * (1.0 - duty))
            if time.monotonic() - start >= args.seconds:
                break
    del hold
    print(f"gpu_load: ran {time.monotonic() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
