"""Many analysts on one database: N processes x M DP queries, admin commands, one kill -9.

Each worker process opens its own guarded connection and runs DP counts with random filters
(new statistics are charged, repeats are free); meanwhile admin commands run in a loop (`sqlsdc
audit`, `sqlsdc budget`, `sqlsdc budget grant` of ε 1/2, `sqlsdc policy apply` of the same
policy as a new version), and one worker is killed with SIGKILL part-way. Afterwards the
script checks that nothing is lost and no budget is exceeded:

- every worker but the killed one ended cleanly; every failure a worker saw was sqlsdc's own
  budget refusal (no engine error, no lock error); every admin command succeeded;
- every answered query has an ``accepted`` audit entry; every grant is in the budget's history
  and every applied policy is a version of its own;
- the spend ledger adds up to what the budget reports as spent, and that is within the limit
  (the policy's, raised by the grants);
- every charge has an audit entry (the charge writes it); at most one (the killed worker's
  last) is still the entry its charge wrote: paid, never shown.

The summary also gives the admin commands' wall time (``admin_seconds``: start-up and the
wait for a turn), an opening of the file by this script right after each (``admin_turn_seconds``)
and the analysts' statements per second.

Usage:
    python benchmarks/load_test.py                      # 16 processes x 100 queries
    python benchmarks/load_test.py --processes 4 --queries 10
    python benchmarks/load_test.py --admin-pause 5      # admin commands 5 s apart
Exit status 0 when every check holds; a JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

LIMIT = Fraction(30)  # the analyst's epsilon: sixty new statistics at 1/2
GRANT = Fraction(1, 2)  # what each `budget grant` of the admin loop adds: one statistic more
AGES = 100  # distinct filters: 100 statistics, more than the budget pays for


def document() -> dict:
    return {
        "tables": {
            "persons": {
                "privacy_unit": "pid",
                "columns": {
                    "pid": {"role": "identifier"},
                    "region": {"role": "dimension", "domain": ["N", "S", "E", "W"]},
                    "age": {"role": "dimension"},
                },
                "protection": {
                    "counts": {"method": "dp", "spend": {"epsilon": "1/2"}},
                    "magnitudes": {"method": "dp", "spend": {"epsilon": "1/2"}},
                },
            },
        },
        "users": {"admin": {"role": "admin"}, "ana": {"role": "analyst"}},
        "budgets": [{"user": "ana", "epsilon": str(LIMIT)}],
    }


def build(path: Path) -> None:
    import duckdb
    import numpy as np
    import pandas as pd

    import sqlsdc

    rng = np.random.default_rng(3)
    persons = pd.DataFrame({"pid": np.arange(5000), "region": rng.choice(list("NSEW"), 5000),
                            "age": rng.integers(0, AGES, 5000)})  # fmt: skip
    con = duckdb.connect(str(path))
    con.register("frame", persons)
    con.execute("CREATE TABLE persons AS SELECT * FROM frame")
    con.close()
    sqlsdc.init(path, document())


def worker(db: str, seed: int, queries: int, pause: float) -> None:
    """Run DP queries; one line per query: ``ok ID``, ``budget`` or ``error TYPE``."""
    import sqlsdc
    from sqlsdc.errors import BudgetExhausted

    rng = random.Random(seed)
    with sqlsdc.connect(db, "ana") as con:
        for _ in range(queries):
            age = rng.randrange(AGES)
            sql = f"SELECT region, COUNT(*) FROM persons WHERE age >= {age} GROUP BY region"
            try:
                cursor = con.execute(sql)
                cursor.fetchall()
                print(f"ok {cursor.query_id}", flush=True)
            except BudgetExhausted:
                print("budget", flush=True)
            except Exception as error:  # noqa: BLE001 - reported to the parent, which fails
                print(f"error {type(error).__module__}.{type(error).__name__}: {error}",
                      flush=True)  # fmt: skip
            if pause:
                time.sleep(rng.uniform(0, pause))


def run(db: Path, processes: int, queries: int, pause: float, kill: bool = True,
        admin_pause: float = 0.0) -> dict:  # fmt: skip
    from sqlsdc.engines.duckdb import open_database

    start = time.perf_counter()
    me = str(Path(__file__).resolve())
    workers = [  # worker 0, the victim, has more to do, so that it is killed mid-run
        subprocess.Popen(
            [
                sys.executable,
                me,
                "worker",
                str(db),
                str(i),
                str(queries * (10 if i == 0 else 1)),
                str(pause),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(processes)
    ]
    victim = workers[0]
    first = victim.stdout.readline()  # the victim has answered a query: kill it now
    if kill:
        os.kill(victim.pid, signal.SIGKILL)
    killed = kill
    policy = db.with_name("policy.json")  # JSON is YAML: the same policy, applied again
    policy.write_text(json.dumps(document()))
    sqlsdc = [sys.executable, "-m", "sqlsdc.cli"]  # this interpreter's, whatever PATH says
    admin = [[*sqlsdc, "audit", str(db), "--limit", "5", "--format", "json"],
             [*sqlsdc, "budget", str(db), "grant", "--for", "ana", "--epsilon", str(GRANT),
              "--reason", "load test", "--as", "admin"],
             [*sqlsdc, "policy", "apply", str(db), str(policy), "--as", "admin"],
             [*sqlsdc, "budget", str(db), "--format", "json"]]  # fmt: skip
    admin_failures, admin_runs, done_by_kind = [], 0, {"grant": 0, "apply": 0}
    admin_seconds: list[float] = []  # each admin command, start to end (its wait for a turn)
    turn_seconds: list[float] = []  # an admin's opening of the file in this process, alone
    while any(w.poll() is None for w in workers[1:]) or admin_runs < len(admin):
        command = admin[admin_runs % len(admin)]
        began = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        admin_seconds.append(time.perf_counter() - began)
        admin_runs += 1
        began = time.perf_counter()  # the turn alone, without a command's start-up
        open_database(db, read_only=True).close()
        turn_seconds.append(time.perf_counter() - began)
        time.sleep(admin_pause)
        if done.returncode != 0:
            admin_failures.append(f"{' '.join(command[3:5])}: {done.stderr.strip()[-300:]}")
        elif "grant" in command or "apply" in command:
            done_by_kind["grant" if "grant" in command else "apply"] += 1
    outputs = []
    for w in workers:
        out, err = w.communicate(timeout=600)
        out = first + out if w is victim else out
        outputs.append((w.returncode, out.splitlines(), err))
    elapsed = time.perf_counter() - start
    summary = check(db, outputs, admin_failures, admin_runs, done_by_kind, killed, elapsed)
    for name, seconds in (("admin_seconds", admin_seconds), ("admin_turn_seconds", turn_seconds)):
        seconds.sort()
        summary[name] = {"median": round(seconds[len(seconds) // 2], 2),
                         "max": round(seconds[-1], 2)}  # fmt: skip
    return summary


def check(db: Path, outputs, admin_failures, admin_runs, done_by_kind, killed, elapsed) -> dict:
    import sqlsdc
    from sqlsdc.catalog import budget, budget_admin, store
    from sqlsdc.engines.duckdb import open_database

    problems = list(admin_failures)
    answered: list[int] = []
    refused = 0
    for i, (code, lines, err) in enumerate(outputs):
        if i == 0 and killed:
            if code != -signal.SIGKILL:
                problems.append(f"worker 0 was not killed (exit {code})")
        elif code != 0:
            problems.append(f"worker {i} exited {code}: {err.strip()[-300:]}")
        for line in lines:
            if line.startswith("ok "):
                answered.append(int(line.split()[1]))
            elif line == "budget":
                refused += 1
            else:
                problems.append(f"worker {i}: {line}")
    con = open_database(db, read_only=True)
    try:
        entries = con.execute("SELECT query_id, decision, reason FROM sqlsdc.audit").fetchall()
        audit = {q: (decision, reason) for q, decision, reason in entries}
        ledger = budget_admin.spend_ledger(con, limit=10**9)
        policy = sqlsdc.policy.load_policy(document())
        (status,) = [s for s in budget.budget_status(con, budget.policy_limits(policy))
                     if s.key == budget.BudgetKey("ana")]  # fmt: skip
        grants = [e for e in budget_admin.budget_events(con) if e["action"] == "grant"]
        version = store.current_policy(con)[0]
    finally:
        con.close()
    limit = LIMIT + GRANT * done_by_kind["grant"]
    if len(grants) != done_by_kind["grant"] or status.limit.epsilon != limit:
        problems.append(f"{done_by_kind['grant']} grants made, {len(grants)} recorded; limit "
                        f"{status.limit.epsilon}, expected {limit}")  # fmt: skip
    if version != 1 + done_by_kind["apply"]:
        problems.append(f"{done_by_kind['apply']} policies applied, policy version {version}")
    lost = [q for q in answered if audit.get(q, ("",))[0] != "accepted"]
    if lost:
        problems.append(f"{len(lost)} answered queries have no accepted audit entry: {lost[:5]}")
    total = sum((Fraction(r["epsilon"]) for r in ledger), Fraction(0))
    if total != status.spent.epsilon:
        problems.append(f"ledger adds up to {total}, budget reports {status.spent.epsilon}")
    if status.spent.epsilon > limit:
        problems.append(f"spent {status.spent.epsilon} > limit {limit}")
    unaudited = [r["query_id"] for r in ledger if r["query_id"] not in audit]
    if unaudited:
        problems.append(f"charges without an audit entry: {unaudited}")
    pending = [q for q, (_, reason) in audit.items() if reason == store.CHARGED_PENDING]
    if len(pending) > (1 if killed else 0):
        problems.append(f"charges left without their outcome: {pending}")
    return {
        "processes": len(outputs),
        "answered": len(answered),
        "budget_refusals": refused,
        "admin_commands": admin_runs,
        "killed": killed,
        "charges": len(ledger),
        "charged_unanswered": len(pending),
        "spent": str(status.spent.epsilon),
        "limit": str(limit),
        "grants": done_by_kind["grant"],
        "policies_applied": done_by_kind["apply"],
        "seconds": round(elapsed, 1),
        "queries_per_second": round(len(answered) / elapsed, 1),
        "statements_per_second": round((len(answered) + refused) / elapsed, 1),
        "problems": problems,
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--pause", type=float, default=0.0, help="max seconds between queries")
    parser.add_argument("--keep", type=Path, help="build the database here and keep it")
    parser.add_argument("--no-kill", action="store_true", help="kill no worker")
    parser.add_argument("--admin-pause", type=float, default=0.0,
                        help="seconds between admin commands (default: back to back)")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        db = (args.keep or Path(folder)) / "load.duckdb"
        db.parent.mkdir(parents=True, exist_ok=True)
        db.unlink(missing_ok=True)
        build(db)
        summary = run(db, args.processes, args.queries, args.pause, kill=not args.no_kill,
                      admin_pause=args.admin_pause)  # fmt: skip
    print(json.dumps(summary, indent=2))
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
