"""DP side by side: sqlsdc, OpenDP, SmartNoise SQL and PipelineDP on the same five questions.

The data are the demo's ``persons`` and ``benefits`` tables (``sqlsdc demo --persons N``), with
NULL incomes set to 0 and three derived keys (``age10``: 10-year age band, ``age2``: 2-year age
band, ``month`` as text) so that every system sees the same columns. Every system gets the same
ε (and δ where a question needs it) per question and the same bounds:

  Q1  count of persons by region (8 public keys)                        ε = 1
  Q2  average income by region, income in [0, 300000]                   ε = 1
  Q3  sum of benefit amounts by month, amount in [0, 3000], up to 24
      rows per person: a per-person total cap of 24 rows               ε = 1
  Q4  count by municipality × age10 without public keys (private
      partition selection)                                              ε = 1, δ = 1e-6
  Q5  sum of income by municipality × age2 (9,456 public keys)          ε = 1

sqlsdc runs here (its own virtualenv); the peers run in a subprocess with another interpreter
(``--peer-python``), see ``peers.py``. Each system answers each question ``--reps`` times;
sqlsdc's noise is keyed by the server secret, so the harness replaces the secret before each
repetition (and asks as a new user), which gives independent noise.

Per system and question: median seconds (sqlsdc: ``execute`` + ``fetchall`` on an open
connection; peers: from an in-memory data frame to the released cells), mean absolute error and
bias (mean of released − exact) over released cells against the exact *unbounded* answer,
recall (share of non-empty exact cells released; Q4: of the groups of 11–15 persons), and for
sqlsdc the coverage of ``cursor.cell_accuracy()``'s 95 % intervals: the share of released cells
whose interval holds the exact *bounded* answer (noise off) and the exact unbounded answer.

Usage: python benchmarks/peers/run.py --peer-python /path/to/venv/bin/python [--reps 10]
       [--persons 100000] [--workdir DIR] [--systems sqlsdc,opendp,smartnoise,pipelinedp]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import duckdb

import sqlsdc
from sqlsdc.engines.duckdb import open_database

HERE = Path(__file__).resolve().parent
EPSILON, DELTA = 1.0, 1e-6
INCOME, AMOUNT = [0, 300000], [0, 3000]
UNIT_ROWS = 24  # the most rows a person has in the demo's benefits (per-person total cap)


def questions(keys: dict, rows: dict) -> list[dict]:
    """The five questions as data: what each system computes and the public keys, if any.

    ``max_length`` (OpenDP's public bound on a table's rows) is the table's size: a looser one
    widens OpenDP's float sums (1,000,000 instead of 100,000 made Q5's noise 5 times larger).
    """
    base = {"epsilon": EPSILON, "delta": None, "unit_rows": 1}
    qs = [
        {**base, "id": "Q1", "table": "persons", "by": ["region"], "agg": "count",
         "measure": None, "bounds": None, "keys": keys["Q1"]},
        {**base, "id": "Q2", "table": "persons", "by": ["region"], "agg": "avg",
         "measure": "income", "bounds": INCOME, "keys": keys["Q2"]},
        {**base, "id": "Q3", "table": "benefits", "by": ["paymonth"], "agg": "sum",
         "measure": "amount", "bounds": AMOUNT, "keys": keys["Q3"], "unit_rows": UNIT_ROWS},
        {**base, "id": "Q4", "table": "persons", "by": ["municipality", "age10"],
         "agg": "count", "measure": None, "bounds": None, "keys": None, "delta": DELTA},
        {**base, "id": "Q5", "table": "persons", "by": ["municipality", "age2"], "agg": "sum",
         "measure": "income", "bounds": INCOME, "keys": keys["Q5"]},
    ]  # fmt: skip
    return [{**q, "max_length": rows[q["table"]]} for q in qs]


def sql_of(q: dict, table: str | None = None) -> str:
    agg = {"count": "COUNT(*)", "sum": f"SUM({q['measure']})", "avg": f"AVG({q['measure']})"}
    by = ", ".join(q["by"])
    return f"SELECT {by}, {agg[q['agg']]} AS v FROM {table or q['table']} GROUP BY {by}"


# --- data -------------------------------------------------------------------------------------


def prepare(workdir: Path, persons: int) -> dict:
    """Build the demo data, export the harness tables to Parquet, return the domains."""
    demo = workdir / "demo.duckdb"
    if not demo.exists():
        subprocess.run(["sqlsdc", "demo", "--db", str(demo), "--persons", str(persons)],
                       check=True, capture_output=True)  # fmt: skip
    con = duckdb.connect(str(demo), read_only=True)
    con.execute(f"""COPY (SELECT person_id AS pid, region, municipality,
        'a' || lpad(CAST(age // 10 * 10 AS VARCHAR), 2, '0') AS age10,
        'b' || lpad(CAST(age // 2 AS VARCHAR), 2, '0') AS age2,
        COALESCE(income, 0) AS income FROM persons ORDER BY pid)
        TO '{workdir}/persons.parquet'""")
    con.execute(f"""COPY (SELECT person_id AS pid, 'm' || lpad(CAST(month AS VARCHAR), 2, '0')
        AS paymonth, amount FROM benefits ORDER BY pid) TO '{workdir}/benefits.parquet'""")
    domain = {
        c: [r[0] for r in con.execute(f"SELECT DISTINCT {c} FROM persons ORDER BY 1").fetchall()]
        for c in ("region", "municipality")
    }
    domain["rows"] = {t: con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                      for t in ("persons", "benefits")}  # fmt: skip
    con.close()
    domain["age10"] = [f"a{a:02d}" for a in range(0, 120, 10)]
    domain["age2"] = [f"b{a:02d}" for a in range(0, 48)]
    domain["paymonth"] = [f"m{m:02d}" for m in range(1, 13)]
    return domain


def public_keys(domain: dict) -> dict:
    return {
        "Q1": [[r] for r in domain["region"]],
        "Q2": [[r] for r in domain["region"]],
        "Q3": [[m] for m in domain["paymonth"]],
        "Q5": [[m, a] for m in domain["municipality"] for a in domain["age2"]],
    }


def policy(domain: dict, users: int) -> dict:
    """The sqlsdc policy of the harness: the same ε, δ and bounds as the peers get."""
    dims = {c: {"role": "dimension", "domain": domain[c]}
            for c in ("region", "municipality", "age10", "age2")}  # fmt: skip
    persons = {
        "pid": {"role": "identifier"},
        **dims,
        "income": {"role": "measure", "bounds": INCOME},
    }
    dp = {"method": "dp", "spend": {"epsilon": EPSILON}}
    half = {"method": "dp", "spend": {"epsilon": EPSILON / 2}}
    return {
        "tables": {
            "persons": {
                "privacy_unit": "pid", "columns": persons, "dp": {"granularity": 1},
                "protection": {"counts": dp, "magnitudes": dp},
            },
            # Q4: the same rows with private groups; ε/2 for the counts, ε/2 and δ to select
            "persons_p": {
                "privacy_unit": "pid", "columns": persons,
                "protection": {"counts": half, "magnitudes": half},
                "dp": {"granularity": 1, "groups": "private",
                       "selection": {"epsilon": EPSILON / 2, "delta": DELTA}},
            },
            "benefits": {
                "privacy_unit": "pid",
                "columns": {
                    "pid": {"role": "identifier"},
                    "paymonth": {"role": "dimension", "domain": domain["paymonth"]},
                    "amount": {"role": "measure", "bounds": AMOUNT},
                },
                "protection": {"counts": dp, "magnitudes": dp},
                "dp": {"max_groups": 12, "max_rows": UNIT_ROWS,
                       "max_rows_per_unit": UNIT_ROWS, "granularity": 1},
            },
        },
        "users": {"admin": {"role": "admin"},
                  **{f"u{i}": {"role": "analyst"} for i in range(users)}},
        "budgets": [{"user": "*", "epsilon": 1e6, "delta": 0.5}],
    }  # fmt: skip


def build_sqlsdc(workdir: Path, domain: dict, users: int) -> Path:
    path = workdir / "harness.duckdb"
    path.unlink(missing_ok=True)
    con = open_database(path)
    con.execute(f"CREATE TABLE persons AS SELECT * FROM '{workdir}/persons.parquet'")
    con.execute(f"CREATE TABLE persons_p AS SELECT * FROM '{workdir}/persons.parquet'")
    con.execute(f"CREATE TABLE benefits AS SELECT * FROM '{workdir}/benefits.parquet'")
    con.close()
    sqlsdc.init(path, policy(domain, users))
    return path


def new_secret(path: Path) -> None:
    """A fresh PRF secret: the next repetition draws independent noise (harness only)."""
    con = open_database(path)
    con.execute("UPDATE sqlsdc.secrets SET material = ? WHERE name = 'prf'", [os.urandom(32)])
    con.close()


# --- running ----------------------------------------------------------------------------------


def key(values) -> str:
    return "|".join(str(v) for v in values)


def run_sqlsdc(path: Path, qs: list[dict], reps: int) -> tuple[list[dict], dict]:
    table = {"Q4": "persons_p"}
    bounded = {}
    with sqlsdc.connect(path, "admin") as con:
        con.set_dp_noise(False)
        for q in qs:
            rows = con.execute(sql_of(q, table.get(q["id"]))).fetchall()
            bounded[q["id"]] = {key(r[:-1]): float(r[-1]) for r in rows if r[-1] is not None}
    runs = []
    for rep in range(reps):
        new_secret(path)
        con = sqlsdc.connect(path, f"u{rep}")
        for q in qs:
            sql = sql_of(q, table.get(q["id"]))
            start = time.perf_counter()
            cur = con.execute(sql)
            rows = cur.fetchall()
            seconds = time.perf_counter() - start
            accuracy = cur.cell_accuracy()
            intervals = {
                key(rows[int(a.row)][:-1]): (float(a.low), float(a.high))
                for a in accuracy.itertuples()
                if a.column == "v"
            }
            cells = {key(r[:-1]): float(r[-1]) for r in rows if r[-1] is not None}
            runs.append({"system": "sqlsdc", "q": q["id"], "rep": rep, "seconds": seconds,
                         "cells": cells, "intervals": intervals, "error": None})  # fmt: skip
        con.close()
    return runs, bounded


def run_peer(python: str, workdir: Path, name: str, reps: int) -> list[dict]:
    done = subprocess.run([python, str(HERE / "peers.py"), str(workdir), name, str(reps)],
                          capture_output=True, text=True)  # fmt: skip
    out = workdir / f"peer-{name}.json"
    if done.returncode or not out.exists():
        tail = (done.stderr or "").strip().splitlines()[-1:] or ["no output"]
        return [{"system": name, "q": "*", "rep": 0, "seconds": 0, "cells": {},
                 "error": f"peer failed: {tail[0]}"}]  # fmt: skip
    return json.loads(out.read_text())


def exact_answers(workdir: Path, qs: list[dict]) -> dict:
    con = duckdb.connect()
    con.execute(f"CREATE VIEW persons AS SELECT * FROM '{workdir}/persons.parquet'")
    con.execute(f"CREATE VIEW benefits AS SELECT * FROM '{workdir}/benefits.parquet'")
    answers = {}
    for q in qs:
        answers[q["id"]] = {key(r[:-1]): float(r[-1]) for r in con.execute(sql_of(q)).fetchall()}
    con.close()
    return answers


# --- the table --------------------------------------------------------------------------------


def summarise(runs: list[dict], qs: list[dict], exact: dict, bounded: dict) -> list[dict]:
    rows = []
    for system in dict.fromkeys(r["system"] for r in runs):
        for q in qs:
            mine = [r for r in runs if r["system"] == system and r["q"] in (q["id"], "*")]
            failed = next((r["error"] for r in mine if r["error"]), None)
            if failed:
                rows.append({"system": system, "q": q["id"], "error": failed})
                continue
            truth = exact[q["id"]]
            keys = q["keys"]
            domain = {key(k) for k in keys} if keys is not None else set(truth)
            if q["id"] == "Q4":
                target = {k for k, v in truth.items() if 11 <= v <= 15}
            else:
                target = {k for k, v in truth.items() if v != 0 or q["agg"] != "count"}
                target = {k for k in target if k in domain}
            errors, released, covered_b, covered_t, intervals = [], 0, 0, 0, 0
            for r in mine:
                for k, v in r["cells"].items():
                    errors.append(v - truth.get(k, 0.0))
                    if "intervals" in r and k in r["intervals"]:
                        low, high = r["intervals"][k]
                        intervals += 1
                        covered_b += low <= bounded[q["id"]].get(k, 0.0) <= high
                        covered_t += low <= truth.get(k, 0.0) <= high
                released += len(target & set(r["cells"]))
            rows.append({
                "system": system, "q": q["id"],
                "seconds": statistics.median(r["seconds"] for r in mine),
                "mae": statistics.fmean(abs(e) for e in errors) if errors else float("nan"),
                "mae_se": (statistics.stdev(abs(e) for e in errors) / len(errors) ** 0.5
                           if len(errors) > 1 else float("nan")),
                "bias": statistics.fmean(errors) if errors else float("nan"),
                "recall": released / (len(target) * len(mine)) if target else float("nan"),
                "cover_bounded": covered_b / intervals if intervals else None,
                "cover_exact": covered_t / intervals if intervals else None,
                "cells": len(errors) / len(mine),
            })  # fmt: skip
    return rows


def fmt(x: float) -> str:
    return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def print_table(rows: list[dict]) -> None:
    print("| question | system | median s | cells | mean abs. error (± s.e.) | bias | recall "
          "| 95% coverage (bounded / exact) |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in sorted(rows, key=lambda r: r["q"]):
        if "error" in r:
            print(f"| {r['q']} | {r['system']} | — | — | — | — | — | {r['error']} |")
            continue
        cover = ("—" if r["cover_bounded"] is None
                 else f"{r['cover_bounded']:.1%} / {r['cover_exact']:.1%}")  # fmt: skip
        print(
            f"| {r['q']} | {r['system']} | {r['seconds']:.3f} | {r['cells']:,.0f} | "
            f"{fmt(r['mae'])} ± {fmt(r['mae_se'])} | {fmt(r['bias'])} | {r['recall']:.1%} | "
            f"{cover} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", required=True, help="interpreter with the peers")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--persons", type=int, default=100_000)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--systems", default="sqlsdc,opendp,smartnoise,pipelinedp")
    parser.add_argument("--questions", default="Q1,Q2,Q3,Q4,Q5", help="e.g. Q1,Q2")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="peers-"))
    workdir.mkdir(parents=True, exist_ok=True)
    domain = prepare(workdir, args.persons)
    asked = args.questions.split(",")
    qs = [q for q in questions(public_keys(domain), domain["rows"]) if q["id"] in asked]
    (workdir / "questions.json").write_text(json.dumps(qs))
    exact = exact_answers(workdir, qs)
    systems = args.systems.split(",")
    runs, bounded = [], {}
    if "sqlsdc" in systems:
        path = build_sqlsdc(workdir, domain, args.reps)
        runs, bounded = run_sqlsdc(path, qs, args.reps)
    for name in systems:
        if name != "sqlsdc":
            runs += run_peer(args.peer_python, workdir, name, args.reps)
    (workdir / "runs.json").write_text(json.dumps(runs))
    print(f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, sqlsdc {sqlsdc.__version__}, {args.reps} repetitions, "
          f"{args.persons:,} persons; work directory {workdir}")  # fmt: skip
    print_table(summarise(runs, qs, exact, bounded))


if __name__ == "__main__":
    main()
