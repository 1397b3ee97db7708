"""Many users on one database, mixed (red team s37): CKM and DP queries from single-connection
processes, threads sharing a connection, threads with a connection each, an idle holder and a
process of slow statements; admin commands interleaved (policy apply alternating two versions,
budget grant/set/reset, rekey, protect, publish, audit, budget); kill -9 of random analyst
processes and of some admin commands (apply, grant, rekey, reset) at random moments.

Afterwards (``check``) it verifies from the database and the workers' lines: every answered
query has its accepted audit entry under its user; no raw (non-sqlsdc) exception reached a
worker; every charge has an audit entry at the charge's policy version, and its ε is a multiple
of the DP spend of that version (the two versions spend 1/10 and 1/4 per count: a charge
priced under a stale policy shows); after each apply the runner saw, no later query or charge is
at an older version, and no occupation query (hidden in version B) was answered under B; a
replay of charges and budget events in ``seq`` order keeps every budget within its limit at
every charge. Admin command and query latencies are summarised.

Usage:
    python benchmarks/load_test_mixed.py run FOLDER [--processes 16] [--queries 100] [--kills 6]
    python benchmarks/load_test_mixed.py check FOLDER      # again, on a kept FOLDER
Exit status 0 when no problem is found.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from fractions import Fraction
from pathlib import Path

PY = sys.executable
ME = str(Path(__file__).resolve())
USERS = ["analyst", "a1", "a2", "a3"]
COST = {"A": Fraction(1, 10), "B": Fraction(1, 4)}  # benefits counts spend per variant


def variant(doc: dict, which: str) -> dict:
    d = copy.deepcopy(doc)
    d["tables"]["benefits"]["protection"]["counts"]["spend"]["epsilon"] = str(COST[which])
    # variant B hides persons.occupation: a CKM query on it is refused under B
    if which == "B":
        d["tables"]["persons"]["columns"].pop("occupation", None)
    for u in USERS[1:]:
        d["users"][u] = {"role": "analyst"}
    d["budgets"] = (
        [b for b in d["budgets"] if b.get("user") != "*"]
        + [{"user": u, "epsilon": 3} for u in USERS[1:]]
        + [{"user": "*", "table": "benefits", "epsilon": 12}]
    )
    d.setdefault("limits", {})["statement_timeout_seconds"] = 20
    d["description"] = f"variant {which}"
    return d


def build(folder: Path) -> Path:
    db = folder / "s.duckdb"
    subprocess.run(
        [PY, "-m", "sqlsdc.cli", "demo", "--db", str(db), "--persons", "20000", "--no-queries"],
        check=True,
        capture_output=True,
    )
    out = subprocess.run(
        [PY, "-m", "sqlsdc.cli", "policy", "show", str(db), "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    doc = json.loads(out)["policy"]
    for w in "AB":
        (folder / f"policy_{w}.json").write_text(json.dumps(variant(doc, w)))
    subprocess.run(
        [PY, "-m", "sqlsdc.cli", "policy", "apply", str(db), str(folder / "policy_A.json")],
        check=True,
        capture_output=True,
    )
    return db


def query(rng: random.Random) -> tuple[str, str]:
    k = rng.random()
    if k < 0.45:
        m = rng.randint(1, 12)
        return "dp", f"SELECT scheme, COUNT(*) FROM benefits WHERE month >= {m} GROUP BY scheme"
    if k < 0.55:
        return "dp", "SELECT region, COUNT(*) FROM benefits GROUP BY region"
    if k < 0.8:
        a = rng.randint(0, 100)
        return (
            "ckm",
            f"SELECT region, sex, COUNT(*), SUM(income) FROM persons WHERE age >= {a} "
            "GROUP BY region, sex",
        )
    if k < 0.9:
        return "ckm_occ", "SELECT occupation, COUNT(*) FROM persons GROUP BY occupation"
    return (
        "ckm",
        "SELECT h.tenure, COUNT(*) FROM persons p JOIN households h "
        "ON p.household_id = h.household_id GROUP BY h.tenure",
    )


def classify(error: BaseException) -> str:
    from sqlsdc.errors import BudgetExhausted, Error

    name = f"{type(error).__module__}.{type(error).__name__}"
    text = str(error).replace("\n", " ")[:300]
    if isinstance(error, BudgetExhausted):
        return "budget"
    if not isinstance(error, Error):
        return f"RAW {name}: {text}"
    return f"err {name}: {text}"


def worker(db: str, seed: int, queries: int, mode: str, threads: int) -> None:
    import sqlsdc

    rng0 = random.Random(seed)
    out_lock = threading.Lock()

    def say(line: str) -> None:
        with out_lock:
            print(line, flush=True)

    def run(con, rng, user, n):
        for _ in range(n):
            kind, sql = query(rng)
            t = time.perf_counter()
            try:
                cur = con.execute(sql)
                cur.fetchall()
                say(f"ok {user} {kind} {cur.query_id} {time.perf_counter() - t:.3f}")
            except BaseException as e:  # noqa
                c = classify(e)
                if c.startswith("RAW"):
                    c += " | " + "".join(traceback.format_exception(e))[-800:].replace("\n", " / ")
                say(f"{c} ~ {user} {kind} {time.perf_counter() - t:.3f}")

    user = USERS[seed % len(USERS)]
    if mode == "single":
        with sqlsdc.connect(db, user) as con:
            run(con, rng0, user, queries)
    elif mode == "shared":
        with sqlsdc.connect(db, user) as con:
            ts = [
                threading.Thread(
                    target=run, args=(con, random.Random(seed * 100 + i), user, queries // threads)
                )
                for i in range(threads)
            ]
            [t.start() for t in ts]
            [t.join() for t in ts]
    elif mode == "own":

        def own(i):
            u = USERS[(seed + i) % len(USERS)]
            try:
                with sqlsdc.connect(db, u) as con:
                    run(con, random.Random(seed * 100 + i), u, queries // threads)
            except BaseException as e:  # noqa
                say(f"{classify(e)} ~ {u} connect 0")

        ts = [threading.Thread(target=own, args=(i,)) for i in range(threads)]
        [t.start() for t in ts]
        [t.join() for t in ts]
    elif mode == "idle":
        with sqlsdc.connect(db, user) as con:
            run(con, rng0, user, 2)
            time.sleep(queries)  # queries = seconds idle here
            run(con, rng0, user, 3)
    elif mode == "slow":
        big = (
            "SELECT region, COUNT(*) FROM persons WHERE "
            + " OR ".join(f"(age = {i % 110} AND sex = 'F')" for i in range(2500))
            + " GROUP BY region"
        )
        with sqlsdc.connect(db, user) as con:
            for j in range(queries):
                sql = (
                    big
                    if j % 2
                    else "SELECT municipality, age, occupation, education, COUNT(*), "
                    "SUM(income) FROM persons GROUP BY ALL"
                )
                t = time.perf_counter()
                try:
                    cur = con.execute(sql)
                    cur.fetchall()
                    say(f"ok {user} slow {cur.query_id} {time.perf_counter() - t:.3f}")
                except BaseException as e:  # noqa
                    say(f"{classify(e)} ~ {user} slow {time.perf_counter() - t:.3f}")


ADMIN = ["apply", "grant", "set", "reset", "rekey", "protect", "publish", "audit", "budget"]


def admin_command(kind: str, db: Path, folder: Path, rng: random.Random, state: dict) -> list[str]:
    s = [PY, "-m", "sqlsdc.cli"]
    user = rng.choice(USERS)
    if kind == "apply":
        state["next"] = "B" if state.get("next", "B") == "A" else "A"
        return [*s, "policy", "apply", str(db), str(folder / f"policy_{state['next']}.json")]
    if kind == "grant":
        return [*s, "budget", str(db), "grant", "--for", user, "--epsilon", "1/2", "--reason", "st"]
    if kind == "set":
        return [
            *s,
            "budget",
            str(db),
            "set",
            "--for",
            user,
            "--epsilon",
            str(rng.choice([2, 3, 4])),
            "--reason",
            "st",
        ]
    if kind == "reset":
        return [*s, "budget", str(db), "reset", "--for", user, "--reason", "st"]
    if kind == "rekey":
        return [*s, "rekey", str(db), "--table", "households", "--yes"]
    if kind == "protect":  # the same cells again: the table is replaced
        return [
            *s,
            "protect",
            str(db),
            "--method",
            "round",
            "--base",
            "5",
            "--into",
            "rounded",
            "--replace",
            "--sql",
            "SELECT region, sex, COUNT(*) FROM persons GROUP BY region, sex",
        ]
    if kind == "publish":
        return [
            *s,
            "publish",
            str(db),
            str(folder / "pub.duckdb"),
            "--force",
            "--for",
            "analyst",
            "--query",
            "x=SELECT region, COUNT(*) AS n FROM persons GROUP BY region",
        ]
    if kind == "audit":
        return [*s, "audit", str(db), "--limit", "3", "--format", "json"]
    return [*s, "budget", str(db), "--format", "json"]


def snapshot(db: Path) -> tuple[int, int, int]:
    from sqlsdc.engines.duckdb import open_database

    con = open_database(db, read_only=True)
    try:
        q = con.execute("SELECT coalesce(max(query_id), 0) FROM sqlsdc.audit").fetchone()[0]
        s = con.execute("SELECT coalesce(max(seq), 0) FROM sqlsdc.budget_spend").fetchone()[0]
        v = con.execute("SELECT max(version) FROM sqlsdc.policy_versions").fetchone()[0]
    finally:
        con.close()
    return q, s, v


def main() -> int:
    if sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
        return 0
    if sys.argv[1] == "check":
        return 1 if check(Path(sys.argv[2])) else 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["run"])
    p.add_argument("folder", type=Path)
    p.add_argument("--processes", type=int, default=16)
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--kills", type=int, default=6)
    p.add_argument("--admin-kills", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--duration", type=float, default=600)
    a = p.parse_args()
    rng = random.Random(a.seed)
    a.folder.mkdir(parents=True, exist_ok=True)
    db = build(a.folder)
    modes = ["single"] * a.processes
    modes[1], modes[2], modes[3], modes[4] = "shared", "own", "idle", "slow"
    procs = {}
    start = time.monotonic()

    def spawn(i, mode):
        q = {"idle": 40, "slow": 10}.get(mode, a.queries)
        procs[i] = (
            subprocess.Popen(
                [PY, ME, "worker", str(db), str(i), str(q), mode, "4"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
            mode,
        )

    for i, m in enumerate(modes):
        spawn(i, m)
    outputs = {}
    readers = {}

    def reader(i, proc):
        outputs[i] = proc.communicate()

    for i, (proc, _) in list(procs.items()):
        readers[i] = threading.Thread(target=reader, args=(i, proc))
        readers[i].start()
    killed = []
    kill_at = sorted(rng.uniform(3, 60) for _ in range(a.kills))
    state, admin_log, observed = {}, [], []
    next_id = a.processes
    while (
        any(pr.poll() is None for pr, _ in procs.values()) and time.monotonic() - start < a.duration
    ):
        now = time.monotonic() - start
        while kill_at and now > kill_at[0]:
            kill_at.pop(0)
            live = [i for i, (pr, m) in procs.items() if pr.poll() is None and m == "single"]
            if live:
                v = rng.choice(live)
                os.kill(procs[v][0].pid, signal.SIGKILL)
                killed.append(v)
                spawn(next_id, "single")
                readers[next_id] = threading.Thread(
                    target=reader, args=(next_id, procs[next_id][0])
                )
                readers[next_id].start()
                next_id += 1
        kind = rng.choice(ADMIN)
        cmd = admin_command(kind, db, a.folder, rng, state)
        t = time.perf_counter()
        pr = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        kill_admin = (
            state.get("akills", 0) < a.admin_kills
            and kind in ("apply", "grant", "rekey", "reset")
            and rng.random() < 0.3
        )
        if kill_admin:
            time.sleep(rng.uniform(0.5, 4))
            pr.send_signal(signal.SIGKILL)
            state["akills"] = state.get("akills", 0) + 1
        try:
            out, err = pr.communicate(timeout=200)
        except subprocess.TimeoutExpired:
            pr.kill()
            out, err = pr.communicate()
            err = "TIMEOUT " + err
        took = time.perf_counter() - t
        if kind == "apply" and kill_admin and pr.returncode == -9:
            state["next"] = "B" if state["next"] == "A" else "A"  # may or may not have applied
        admin_log.append(
            {
                "kind": kind,
                "rc": pr.returncode,
                "s": round(took, 2),
                "killed": kill_admin,
                "err": err.strip()[-400:] if pr.returncode not in (0,) else "",
            }
        )
        if kind == "apply" and pr.returncode == 0:
            observed.append((snapshot(db), state["next"]))
        time.sleep(rng.uniform(0, 1.0))
    for pr, _ in procs.values():
        if pr.poll() is None:
            pr.kill()
    for th in readers.values():
        th.join()
    result = {
        "elapsed": round(time.monotonic() - start, 1),
        "killed": killed,
        "admin": admin_log,
        "observed_applies": observed,
        "outputs": {
            i: {
                "mode": procs[i][1],
                "rc": procs[i][0].returncode,
                "out": outputs[i][0],
                "err": outputs[i][1][-2000:],
            }
            for i in procs
        },
    }
    (a.folder / "result.json").write_text(json.dumps(result))
    print("done", result["elapsed"])
    return 1 if check(a.folder) else 0


def check(folder: Path) -> list[str]:
    import duckdb

    r = json.loads((folder / "result.json").read_text())

    con = duckdb.connect(str(folder / "s.duckdb"), read_only=True)
    problems = []
    audit = {
        q: (u, v, d, reason)
        for q, u, v, d, reason in con.execute(
            "SELECT query_id, user_name, policy_version, decision, reason FROM sqlsdc.audit"
        ).fetchall()
    }
    versions = {
        v: json.loads(doc)["description"][-1]
        for v, doc in con.execute("SELECT version, document FROM sqlsdc.policy_versions").fetchall()
    }
    spend = con.execute(
        "SELECT seq, query_id, user_name, tables, epsilon, policy_version "
        "FROM sqlsdc.budget_spend ORDER BY seq"
    ).fetchall()
    events = con.execute(
        "SELECT seq, action, user_name, table_name, epsilon FROM sqlsdc.budget_events ORDER BY seq"
    ).fetchall()

    # answered queries, errors
    answered, errs, latency = [], Counter(), {"ckm": [], "dp": [], "ckm_occ": [], "slow": []}
    for i, o in r["outputs"].items():
        for line in o["out"].splitlines():
            if line.startswith("ok "):
                _, user, kind, qid, t = line.split()
                answered.append((int(qid), user, kind))
                latency[kind].append(float(t))
            elif line.startswith("budget"):
                errs["budget"] += 1
            else:
                msg = line.split(" ~ ")[0]
                errs[msg[:160]] += 1
                if line.startswith("RAW"):
                    problems.append(f"raw exception in {i}: {line[:1500]}")
        if o["rc"] not in (0, -9, None) or (o["err"].strip() and "Traceback" in o["err"]):
            problems.append(f"worker {i} {o['mode']} rc {o['rc']}: {o['err'][-600:]}")
    for q, user, kind in answered:
        if q not in audit or audit[q][2] != "accepted" or audit[q][0] != user:
            problems.append(f"answered {q} {user} {kind}: audit {audit.get(q)}")
        elif kind == "ckm_occ" and versions[audit[q][1]] == "B":
            problems.append(f"answered {q} occupation under variant B (version {audit[q][1]})")
    # every charge audited, pending count
    pending = [q for q, a in audit.items() if a[3] and "charged; the process stopped" in a[3]]
    for s in spend:
        if s[1] not in audit:
            problems.append(f"charge without audit {s}")
    # cost consistent with the version charged under
    for seq, q, _user, _tables, eps, v in spend:
        e = Fraction(eps)
        c = COST[versions[v]]
        if (e / c).denominator != 1:
            problems.append(
                f"charge {seq} q{q} eps {e} not a multiple of {c} (version {v} {versions[v]})"
            )
        if q in audit and audit[q][1] != v:
            problems.append(f"charge {seq} q{q} version {v} but audit version {audit[q][1]}")
    # stale policy: after an observed apply, later ids must be at that version or newer
    for (maxq, maxs, v), _which in r["observed_applies"]:
        for q, a in audit.items():
            if q > maxq and a[1] is not None and a[1] < v:
                problems.append(
                    f"query {q} audited at version {a[1]} after version {v} was applied "
                    f"(seen at q {maxq})"
                )
        for seq, _q, _user, _tables, _eps, pv in spend:
            if seq > maxs and pv < v:
                problems.append(f"charge {seq} at version {pv} after version {v} applied")
    # budget replay: policy limits per user (policy identical across variants)
    limits = {("analyst", "*"): Fraction(10), ("*", "benefits"): Fraction(12)}
    for u in USERS[1:]:
        limits[(u, "*")] = Fraction(3)
    used = {k: Fraction(0) for k in limits}
    merged = sorted([(s[0], "spend", s) for s in spend] + [(e[0], "event", e) for e in events])
    for seq, what, row in merged:
        if what == "event":
            _, action, user, table, eps = row
            key = (user, table)
            if action == "grant":
                limits[key] = limits.get(key, Fraction(0)) + Fraction(eps)
            elif action == "set":
                limits[key] = Fraction(eps)
            elif action == "reset":
                used[key] = Fraction(0)
            continue
        _, q, user, tables, eps, v = row
        for key in list(limits):
            if key[0] in ("*", user) and (key[1] == "*" or key[1] in tables):
                used[key] = used.get(key, Fraction(0)) + Fraction(eps)
                if used[key] > limits[key]:
                    problems.append(
                        f"charge {seq} q{q} {user}: {key} spent {used[key]} > limit {limits[key]}"
                    )
    print(
        "answered",
        len(answered),
        "charges",
        len(spend),
        "events",
        len(events),
        "pending",
        len(pending),
        "versions",
        len(versions),
        "killed",
        r["killed"],
    )
    print("errors", dict(errs.most_common(20)))
    adm = Counter((a["kind"], a["rc"]) for a in r["admin"])
    print("admin", dict(adm))
    for a in r["admin"]:
        if a["rc"] != 0 and not a["killed"]:
            problems.append(f"admin {a['kind']} rc {a['rc']} {a['s']}s: {a['err']}")
    print(
        "admin max s",
        max((a["s"] for a in r["admin"]), default=0),
        "median",
        sorted(a["s"] for a in r["admin"])[len(r["admin"]) // 2] if r["admin"] else 0,
    )
    for k, v in latency.items():
        if v:
            v.sort()
            print(
                k, "n", len(v), "median", v[len(v) // 2], "p95", v[int(len(v) * 0.95)], "max", v[-1]
            )
    print("PROBLEMS", len(problems))
    for p in problems[:40]:
        print(" -", p)
    return problems


if __name__ == "__main__":
    sys.exit(main())
