"""CLI start-up: wall time of `sqlsdc --help` and `sqlsdc CMD --help` (median of N runs).

Each run is a new process, as a user's shell starts it. Usage:

    python benchmarks/bench_startup.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = (
    ["--help"],
    ["query", "--help"],
    ["protect", "--help"],
    ["demo", "--help"],
    ["budget", "--help"],
)


def wall_times(argv: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    entry = shutil.which("sqlsdc") or sys.exit("sqlsdc is not on PATH: pip install -e .")
    print(f"| command | median s | min s | max s |  (n = {args.repeat})")
    print("|---|---:|---:|---:|")
    for command in COMMANDS:
        times = wall_times([entry, *command], args.repeat)
        print(
            f"| `sqlsdc {' '.join(command)}` | {statistics.median(times):.2f} "
            f"| {min(times):.2f} | {max(times):.2f} |"
        )


if __name__ == "__main__":
    main()
