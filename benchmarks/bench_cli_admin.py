"""CPU time of admin CLI commands, each a new process: what opening the database costs them.

Usage:
    python benchmarks/bench_cli_admin.py [--db demo.duckdb] [--repeat 15] [--tree DIR ...]
        [--writes]

Runs ``sqlsdc outputs DB`` and ``sqlsdc audit DB --limit 5``, and with ``--writes`` the commands
that write ``sqlsdc budget DB grant`` and ``sqlsdc policy apply DB`` (session 42), each with the
acting admin found in the policy (no ``--as``), and prints the median, min and max CPU time
(user + system, of the child process) per command. Each ``--tree`` is put first on
``PYTHONPATH`` (a copy of the source laid out as installed: ``DIR/sqlsdc`` with ``cli``,
``udfs`` and ``schemas`` inside) and the trees are run alternately, so that an A/B comparison
sees the same load; without ``--tree`` the installed sqlsdc runs. Without ``--db`` a demo
database of 20,000 persons is built in a temporary folder."""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

COMMANDS = {"outputs": ["outputs", "{db}"], "audit --limit 5": ["audit", "{db}", "--limit", "5"]}
WRITES = {
    "budget grant": ["budget", "{db}", "grant", "--for", "analyst", "--epsilon", "1/1000",
                     "--reason", "bench"],
    "policy apply": ["policy", "apply", "{db}", "{policy}"],
}  # fmt: skip
POLICY = Path(__file__).resolve().parents[1] / "schemas" / "examples" / "demo.yaml"


def cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--tree", action="append", default=[])
    parser.add_argument("--writes", action="store_true", help="the commands that write")
    args = parser.parse_args()
    db = args.db
    if db is None:
        from sqlsdc.demo.build import build_demo_database

        db = str(Path(tempfile.mkdtemp()) / "demo.duckdb")
        build_demo_database(db, persons=20_000, seed=7)
    trees = args.tree or [None]
    times: dict[tuple, list[float]] = {}
    for _ in range(args.repeat):
        for name, command in (WRITES if args.writes else COMMANDS).items():
            for tree in trees:
                env = dict(os.environ)
                if tree is not None:
                    env["PYTHONPATH"] = os.pathsep.join([tree, env.get("PYTHONPATH", "")])
                argv = [sys.executable, "-c", "from sqlsdc.cli.main import main; main()"]
                argv += [a.format(db=db, policy=POLICY) for a in command]
                times.setdefault((name, tree), []).append(cpu_seconds(argv, env))
    for (name, tree), runs in times.items():
        print(f"{name:16s} {tree or 'installed':24s} median {statistics.median(runs):.3f} s  "
              f"min {min(runs):.3f}  max {max(runs):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
