"""What the guard decides and writes, dumped for an A/B comparison of two versions of it.

A speed-up of the guard must change nothing it outputs. This protects every SQL string of the
test suite (string constants of ``tests/`` that start like a query), the statements of
``bench_guard_size.py`` (chains and whole statements, 10 and 100 KB), CASE group keys grouped
by alias, position, ROLLUP, CUBE and written out, long chains of ranges and comparisons written in
several ways, and random nested conditions (seed 7), on three demo databases (cell key method,
threshold, suppression), and the test strings on two differential privacy databases (the
document of ``tests/test_dp_query.py``, and one with the bounding report, a unit row cap and
quantiles on its many-rows table), and writes for each statement the protected SQL,
fingerprint, population digest, output columns, tables and summed columns, each DP stage's
SQL, trees, histograms, population and statistics, or the refusal's class, message and SQL,
as JSON. Run it once per version (``PYTHONPATH=<other checkout>`` selects the other
sqlsdc) and compare the two files:

    python benchmarks/compare_guard.py dump /tmp/cmp main.json     # builds /tmp/cmp once
    python benchmarks/compare_guard.py dump /tmp/cmp branch.json
    python benchmarks/compare_guard.py diff main.json branch.json  # exit 1 if any differs

sqlglot words some parse errors differently from one process to the next (in any version):
refusals whose messages both contain "Required keyword" or "Expecting" are not compared.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from bench_guard_size import SHAPES, STATEMENTS, statement  # noqa: E402

import sqlsdc  # noqa: E402
from sqlsdc.demo.build import build_demo_database  # noqa: E402
from sqlsdc.guard.pipeline import protect  # noqa: E402
from sqlsdc.policy import load_policy  # noqa: E402

GROUPED = "SELECT region, COUNT(*) FROM persons WHERE {} GROUP BY region"
UNSTABLE = ("Required keyword", "Expecting")


def databases(folder: Path) -> dict[str, Path]:
    """The three demo databases (built once in ``folder``)."""
    from conftest import suppress_document, threshold_policy

    policies = {
        "ckm": None,
        "threshold": threshold_policy(),
        "suppress": load_policy(suppress_document(), name="suppress-demo"),
    }
    paths = {}
    for name, policy in policies.items():
        path = folder / f"{name}.duckdb"
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            build_demo_database(path, persons=20_000, seed=7, policy=policy)
        paths[name] = path
    return paths


def dp_databases(folder: Path) -> dict[str, Path]:
    """The DP databases (built once in ``folder``): the test suite's DP document, and the same
    with the bounding report, a unit row cap and epsilon spends (quantiles) on ``visits``."""
    from test_dp_query import dp_document, make_db

    report = dp_document()
    report["tables"]["persons"]["dp"]["bounding_report"] = {"epsilon": "1/2"}
    visits = report["tables"]["visits"]
    visits["columns"]["clinic"]["domain"] = ["a", "b", "c", "rare"]
    for kind in ("counts", "magnitudes"):
        visits["protection"][kind]["spend"] = {"epsilon": 1}
    visits["dp"] = {"max_groups": 2, "max_rows": 5, "max_rows_per_unit": 7,
                    "bounding_report": {"epsilon": "1/2"}}  # fmt: skip
    paths = {}
    for name, document in (("dp", dp_document()), ("dp-report", report)):
        path = folder / f"{name}.duckdb"
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            make_db(path, document)
        paths[name] = path
    return paths


def test_strings() -> set[str]:
    found = set()
    for file in (HERE.parent / "tests").rglob("*.py"):
        try:
            tree = ast.parse(file.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                head = node.value.strip()[:7].upper()
                if head.startswith(("SELECT", "WITH ", "(SELEC")):
                    found.add(node.value)
    return found


def _condition(rng: random.Random, depth: int) -> str:
    atoms = ["age = 6", "age = 6.0", "6 = age", "age >= 3.50", "region = 'b'", "age <> 2",
             "age IN (3, 1, 2, 1)", "region IN ('b', 'a')", "NOT age = 4", "income > 1e3",
             "age BETWEEN 3 AND 7", "age BETWEEN 7.5 AND 3", "region BETWEEN 'a' AND 'c'",
             "age NOT BETWEEN 1 AND 2", "income BETWEEN -1 AND 2.25", "age /* c */ = 7",
             "age BETWEEN 99999999999999999999 AND 1", "age < 100000000000",
             "sex = 'F'"]  # fmt: skip
    if depth == 0 or rng.random() < 0.3:
        return rng.choice(atoms)
    parts = [_condition(rng, depth - 1) for _ in range(rng.randint(2, 4))]
    return "(" + rng.choice([" OR ", " AND ", " OR "]).join(parts) + ")"


def generated() -> set[str]:
    """Long chains of ranges and comparisons, and random nested conditions."""
    found = {statement(shape, kb) for shape in (*SHAPES, *STATEMENTS) for kb in (10, 100)}
    case = "CASE " + " ".join(f"WHEN age = {i} THEN 'a{i % 7}'" for i in range(60)) + " END"
    for group in ("g, region", "ROLLUP (g, region)", "CUBE (g, sex)", "1, 2", f"{case}, region"):
        found.add(f"SELECT {case} AS g, region, COUNT(*), SUM(income), GROUPING(g) FROM persons "
                  f"GROUP BY {group}")  # fmt: skip
        found.add(f"SELECT {case} AS g, region, COUNT(*) AS n FROM persons WHERE age > 3 "
                  f"GROUP BY {group} HAVING COUNT(*) > 2 ORDER BY n")  # fmt: skip
    ranges = [
        lambda i: f"age BETWEEN {i} AND {i + 1}",
        lambda i: f"age BETWEEN {i}.5 AND {i + 1}e0",
        lambda i: f"age BETWEEN -{i} AND {i} + 1",
        lambda i: f"region BETWEEN 'r{i}' AND 'r{i + 1}'",
        lambda i: f"income BETWEEN {i * 1000} AND {i * 1000 + 999.99}",
        lambda i: f"p.age BETWEEN {i} AND {10**20 + i}",
        lambda i: f"age > {i}",
        lambda i: f"age >= {i}.25 AND age < {i + 1}",
        lambda i: f"(age BETWEEN {i} AND {i + 2} OR sex = 'F')",
        lambda i: f"birth_date BETWEEN DATE '2000-01-{i % 28 + 1:02d}' AND '2001-01-01'",
    ]
    for write in ranges:
        for n, connector in ((40, " OR "), (300, " AND "), (300, " OR ")):
            condition = connector.join(write(i) for i in range(n))
            sql = GROUPED.format(condition)
            if "p.age" in sql:
                sql = sql.replace("FROM persons", "FROM persons p")
            found.add(sql)
    found.add(
        "SELECT region, CAST(age AS DOUBLE) AS a, COUNT(*) FROM persons WHERE "
        + " OR ".join(f"a BETWEEN {i} AND {i + 2}" for i in range(40))
        + " GROUP BY region, age"
    )
    found.add(
        "SELECT r, SUM(x), COUNT(*) FROM (SELECT region AS r, age AS x, income FROM persons) q "
        "WHERE " + " AND ".join(f"x BETWEEN {i} AND {i + 100}.5" for i in range(30)) + " GROUP BY r"
    )
    rng = random.Random(7)
    padding = " OR ".join(f"age BETWEEN {i} AND {i + 3}" for i in range(400, 0, -1))
    for i in range(300):
        condition = _condition(rng, 4)
        found.add(GROUPED.format(condition if i % 2 else f"{condition} AND ({padding})"))
    return found


def outcome(sql: str, context) -> list:
    try:
        q = protect(sql, None, context)
    except Exception as e:  # noqa: BLE001 - the refusal is the outcome
        return ["refused", type(e).__name__, str(e), getattr(e, "sql", None)]
    columns = [c.to_dict() for c in q.columns]
    stages = [
        [s.sql, list(s.histograms), s.scope, [repr(x) for x in s.statistics], sorted(s.reads),
         {str(k): t.sql("duckdb") for k, t in s.trees.items()}]
        for s in q.dp_stages
    ]  # fmt: skip
    return ["ok", q.sql, q.fingerprint, q.population, columns, list(q.tables), list(q.summed),
            *([stages] if stages else [])]  # fmt: skip


def dump(folder: Path, out: Path) -> None:
    strings = test_strings()
    statements = sorted(strings | generated())
    results = {}
    runs = [(policy, path, "analyst", statements) for policy, path in databases(folder).items()]
    runs += [(name, path, "ana", sorted(strings)) for name, path in dp_databases(folder).items()]
    for policy, path, user, texts in runs:
        with sqlsdc.connect(path, user=user) as con:
            context = con._context
            for sql in texts:
                key = hashlib.sha256(sql.encode()).hexdigest()[:16]
                results[f"{policy}:{key}"] = outcome(sql, context)
    out.write_text(json.dumps(results, indent=0, default=str))
    accepted = sum(v[0] == "ok" for v in results.values())
    dp = sum(len(v) > 7 for v in results.values())
    print(f"{sqlsdc.__file__}: {len(statements)} statements x 3 policies and {len(strings)} x 2 "
          f"DP policies, {accepted} accepted, {dp} with DP stages")  # fmt: skip


def diff(a: Path, b: Path) -> int:
    left, right = json.loads(a.read_text()), json.loads(b.read_text())
    differ = []
    for key in sorted(left.keys() & right.keys()):
        x, y = left[key], right[key]
        unstable = all(v[0] == "refused" and any(u in v[2] for u in UNSTABLE) for v in (x, y))
        if x != y and not unstable:
            differ.append(key)
    both = len(left.keys() & right.keys())
    alone = len(left.keys() ^ right.keys())  # statements added to the tests in between
    print(f"{both} outcomes in both, {len(differ)} differ; {alone} in one only")
    for key in differ[:10]:
        print(key, "\n  ", str(left.get(key))[:300], "\n  ", str(right.get(key))[:300])
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    d = commands.add_parser("dump")
    d.add_argument("folder", type=Path)
    d.add_argument("out", type=Path)
    c = commands.add_parser("diff")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.command == "dump":
        dump(args.folder, args.out)
        return 0
    return diff(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
