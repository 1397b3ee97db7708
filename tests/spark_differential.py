"""A differential tester of the Spark engine: guarded queries run on DuckDB and on Spark over the
same data, policy and secret, compared cell by cell (issue 17, must-have 6).

For each query accepted on DuckDB it compares, exactly: the column names, the Arrow type of
each column, every value (floats bit for bit, NaN equal to NaN), the ledger rows of the
release (fingerprint, cell, column, mechanism, status) and, under DP, the budget spent. A
query that Spark refuses as not portable (:class:`~sqlsdc.errors.NotSupportedError`) before it
releases anything is a refusal, not a difference. Used by ``tests/test_spark_differential.py``
and runnable by hand over the query corpora of the test files::

    python tests/spark_differential.py        # prints every difference and the refusals
"""

from __future__ import annotations

import ast
import math
import re
import shutil
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa

import sqlsdc
from sqlsdc.engines.spark import SparkEngine
from sqlsdc.errors import Error, NotSupportedError
from sqlsdc.guard.spark import run_protected

TESTS = Path(__file__).parent


@dataclass
class Outcome:
    """What the differential run of a corpus found."""

    same: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # query -> Spark's reason
    differ: dict[str, str] = field(default_factory=dict)  # query -> the first difference


def _key(value) -> tuple:
    if value is None:
        return (2, 0)
    if isinstance(value, float):
        return (1, 0) if math.isnan(value) else (0, value)
    return (0, value)


def _rows(table: pa.Table) -> list[tuple]:
    return sorted(
        zip(*(c.to_pylist() for c in table.columns), strict=True),
        key=lambda row: tuple(_key(v) for v in row),
    )


def _bits(value):
    """A value compared exactly: a float by its bits (NaN by its one spelling), a Decimal by
    its digits and exponent (1.50 is not 1.5: the type's scale differs)."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else struct.pack(">d", value)
    if isinstance(value, Decimal):
        return ("decimal", value.as_tuple())
    return value


def difference(duck: pa.Table, spark: pa.Table) -> str:
    """The first difference between two results ("" if none); rows compared as sets (sorted)."""
    if duck.column_names != spark.column_names:
        return f"columns {duck.column_names} vs {spark.column_names}"
    for name, a, b in zip(duck.column_names, duck.schema.types, spark.schema.types, strict=True):
        if a != b:
            return f"type of {name}: DuckDB {a}, Spark {b}"
    if duck.num_rows != spark.num_rows:
        return f"{duck.num_rows} rows vs {spark.num_rows}"
    for want, have in zip(_rows(duck), _rows(spark), strict=True):
        if [_bits(v) for v in want] != [_bits(v) for v in have]:
            return f"row {want!r} vs {have!r}"
    return ""


def _catalog(path: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.sql(sql).fetchall()
    finally:
        con.close()


def _ledger(path: Path, query_id: int) -> list[tuple]:
    return _catalog(
        path,
        "SELECT fingerprint, cell, column_name, mechanism, status FROM sqlsdc.ledger "
        f"WHERE query_id = {query_id} ORDER BY cell, column_name",
    )


def _spent(path: Path, user: str) -> list[tuple]:
    return _catalog(
        path,
        f"SELECT epsilon, rho, cells FROM sqlsdc.budget_spend WHERE user_name = '{user}' "
        "ORDER BY seq",
    )


def _last_query_id(path: Path) -> int:
    return _catalog(path, "SELECT max(query_id) FROM sqlsdc.audit")[0][0]


def compare(path: Path, engine: SparkEngine, sql: str, duck_user: str, spark_user: str) -> str:
    """Run ``sql`` as ``duck_user`` on DuckDB, then as ``spark_user`` on Spark; the first
    difference ("" if none). Raises what DuckDB raises (a refused query is no case) and
    NotSupportedError where Spark refuses."""
    with sqlsdc.connect(path, duck_user) as con:
        cursor = con.execute(sql)
        duck, duck_id = cursor.arrow(), cursor.query_id
    before = _spent(path, spark_user)
    refusal = None
    with sqlsdc.connect(path, spark_user) as con:
        try:
            spark = run_protected(con, engine, sql)
        except NotSupportedError as e:
            refusal = e
        except Error as e:  # accepted on DuckDB
            return f"{type(e).__name__} on Spark: {e} {getattr(e, 'detail', '')}"[:600]
    if refusal is not None:
        if _spent(path, spark_user) != before:
            return "refused on Spark after the budget was charged"
        raise refusal
    spark_id = _last_query_id(path)
    found = difference(duck, spark)
    if found:
        return found
    if _ledger(path, duck_id) != _ledger(path, spark_id):
        return "ledger rows differ"
    spent = _spent(path, spark_user)
    if spent != before and spent[-1:] != _spent(path, duck_user)[-1:]:
        return f"charged {spent[-1]} on Spark, {_spent(path, duck_user)[-1]} on DuckDB"
    return ""


def run_corpus(
    path: Path,
    engine: SparkEngine,
    queries: Iterable[str],
    duck_user: str,
    spark_user: str,
    report=lambda kind, sql, why: None,
) -> Outcome:
    """:func:`compare` every query DuckDB accepts (others are skipped); ``report(kind, sql,
    why)`` is told each outcome as it comes (``same``, ``refused``, ``differ``)."""
    outcome = Outcome()
    for sql in queries:
        try:
            found = compare(path, engine, sql, duck_user, spark_user)
        except NotSupportedError as e:
            outcome.refused[sql] = str(e)
            report("refused", sql, str(e))
            continue
        except Error:
            continue  # refused by the guard on DuckDB: not a case
        if found:
            outcome.differ[sql] = found
            report("differ", sql, found)
        else:
            outcome.same.append(sql)
            report("same", sql, "")
    return outcome


def load_tables(path: Path, engine: SparkEngine) -> None:
    """Copy every table of the database at ``path`` (the catalog's ptables and mix too) to
    Spark."""
    names = [
        name if schema == "main" else f"{schema}.{name}"
        for schema, name in _catalog(
            path,
            "SELECT schema_name, table_name FROM duckdb_tables() "
            "WHERE schema_name = 'main' OR table_name IN ('ptable_entries', 'ckm_mix')",
        )
    ]
    engine.load_duckdb(path, names)


# --- the corpora ------------------------------------------------------------------------------


def _string(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string(node.left), _string(node.right)
        return left + right if left is not None and right is not None else None
    return None


_QUERY = re.compile(r"\s*(SELECT|WITH)\s", re.IGNORECASE)


def harvest(files: Iterable[Path], tables: set[str]) -> list[str]:
    """The literal SELECT statements of test files that read one of ``tables`` (in order, once
    each)."""
    found: dict[str, None] = {}
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            text = _string(node)
            if text and _QUERY.match(text) and "{" not in text:
                words = set(re.findall(r"[a-z_]+", text.lower()))
                if words & tables:
                    found.setdefault(text.strip().rstrip(";"), None)
    return list(found)


def fixture_inputs(name: str) -> list[str]:
    """The input queries of a golden rewrite fixture file (tests/fixtures/*.sql)."""
    from test_rewrite_fixtures import load_pairs

    return [sql for _title, sql, _expected in load_pairs(name)]


def _main() -> None:  # pragma: no cover - a tool
    """``python tests/spark_differential.py [threshold] [ckm] [dp] [--queries FILE]
    [--folder DIR]``: the corpora named (all three by default) over the queries of the test
    files (or of FILE, one a line); databases are built in DIR (kept) or a temporary folder."""
    import argparse
    import sys
    import tempfile

    sys.path.insert(0, str(TESTS))
    from conftest import threshold_policy
    from spark_session import local_session
    from test_dp_query import dp_document, make_db

    from sqlsdc.demo.build import build_demo_database

    parser = argparse.ArgumentParser()
    parser.add_argument("corpora", nargs="*", default=["threshold", "ckm", "dp"])
    parser.add_argument("--queries")
    parser.add_argument("--folder")
    args = parser.parse_args()
    folder = Path(args.folder or tempfile.mkdtemp(prefix="sqlsdc-diff-"))
    folder.mkdir(exist_ok=True)
    files = sorted(TESTS.glob("test_*.py")) + sorted((TESTS / "security").glob("test_*.py"))
    builders = {
        "threshold": lambda p: build_demo_database(
            p, persons=20_000, seed=7, policy=threshold_policy()
        ),
        "ckm": lambda p: build_demo_database(p, persons=20_000, seed=7),
        "dp": lambda p: make_db(p, dp_document()),
    }
    session = local_session("sqlsdc-differential")
    try:
        for name in args.corpora:
            template = folder / f"{name}.template.duckdb"
            if not template.exists():
                builders[name](template)
            path = folder / f"{name}.duckdb"
            shutil.copy(template, path)
            users = ("ana", "bob") if name == "dp" else ("analyst", "analyst")
            engine = SparkEngine(session.newSession())
            load_tables(path, engine)
            tables = {t.split(".")[-1] for t in engine.schemas} - {"ptable_entries", "ckm_mix"}
            if args.queries:
                queries = [q for q in Path(args.queries).read_text().splitlines() if q.strip()]
            else:
                queries = harvest(files, tables)
                if name != "dp":
                    queries = fixture_inputs(f"{name}.sql") + queries
            print(f"== {name}: {len(queries)} queries", flush=True)

            def report(kind, sql, why):
                print(f"{kind.upper()} {sql}" + (f"\n    {why[:300]}" if why else ""), flush=True)

            outcome = run_corpus(path, engine, queries, *users, report)
            print(f"== {name}: {len(outcome.same)} same, {len(outcome.refused)} refused, "
                  f"{len(outcome.differ)} differ", flush=True)  # fmt: skip
            engine.close()
    finally:
        session.stop()
        if not args.folder:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover
    _main()
