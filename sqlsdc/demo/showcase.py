"""The queries ``sqlsdc demo`` runs: raw next to protected, then refusals with their reasons.

The raw side exists only because the demo owns its synthetic data; it is computed with an
unguarded connection, never through the guard.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

import sqlsdc
from sqlsdc.engines import duckdb as engine


@dataclass(frozen=True)
class Example:
    title: str
    sql: str
    note: str = ""


PROTECTED = (
    Example(
        "Persons by region (cell key method: small deterministic noise)",
        "SELECT region, COUNT(*) AS persons FROM persons GROUP BY region ORDER BY region",
        "the same cell shows the same value in every query: repeating it cannot average the "
        "noise away",
    ),
    Example(
        "Persons and mean income in the smallest municipalities, by sex",
        "SELECT municipality, sex, COUNT(*) AS persons, AVG(income) AS mean_income "
        "FROM persons WHERE municipality IN ('R01-M013', 'R05-M009', 'R07-M010', 'R03-M020') "
        "GROUP BY municipality, sex ORDER BY municipality, sex",
        "no count of 1 or 2 is published; small cells carry relatively more noise",
    ),
    Example(
        "Households by tenure with a ROLLUP total, in one region",
        "SELECT region, tenure, COUNT(*) AS households, SUM(size) AS members "
        "FROM households WHERE region = 'R01' GROUP BY ROLLUP (region, tenure) "
        "ORDER BY region NULLS LAST, tenure NULLS LAST",
        "totals are perturbed like every other cell, from their own records' keys",
    ),
    Example(
        "Turnover of large enterprises by activity (NACE) in region R02",
        "SELECT nace, COUNT(*) AS enterprises, SUM(turnover) AS turnover FROM enterprises "
        "WHERE region = 'R02' AND size_class = 'large' GROUP BY nace ORDER BY nace",
        "each enterprise's turnover enters times its permanent factor (unit noise), and the "
        "cell's noise is built from the two largest such contributions",
    ),
    Example(
        "Benefit recipients and payments by scheme (differential privacy)",
        "SELECT scheme, COUNT(DISTINCT person_id) AS recipients, SUM(amount) AS paid "
        "FROM benefits GROUP BY scheme ORDER BY scheme",
        "exact discrete Laplace noise from a keyed PRF, charged to the analyst's budget once: "
        "asking again returns the same values for free; each person counts in at most 2 cells "
        "with at most 12 payments",
    ),
    Example(
        "Persons per 1,000 inhabitants of the public population figure (join with a public table)",
        "SELECT r.name, COUNT(*) * 1000.0 / r.population AS per_1000 FROM persons p "
        "JOIN regions r ON p.region = r.region GROUP BY r.name, r.population ORDER BY r.name",
    ),
)

REFUSED = (
    Example("Row-level output", "SELECT * FROM persons LIMIT 5"),
    Example(
        "A maximum reveals one person's income",
        "SELECT region, MAX(income) FROM persons GROUP BY region",
    ),
    Example("Singling out by identifier", "SELECT AVG(income) FROM persons WHERE person_id = 42"),
    Example("Grouping by a measure", "SELECT income, COUNT(*) FROM persons GROUP BY income"),
    Example("Reading a file", "SELECT * FROM read_csv('/etc/passwd')"),
)


def run_showcase(db: str, echo: Callable[[str], None], user: str = "analyst") -> None:
    raw = engine.open_database(db)
    try:
        with sqlsdc.connect(db, user=user) as con:
            for example in PROTECTED:
                echo(f"\n== {example.title}")
                echo(f"   {example.sql}")
                if example.note:
                    echo(f"   ({example.note})")
                cursor = con.execute(example.sql)
                echo(_side_by_side(raw.execute(example.sql).df(), cursor))
                if cursor.explain().dp_stages:
                    echo(_dp_summary(con, cursor))
            echo("\n== Refused queries (a refusal says what would be allowed instead)")
            for example in REFUSED:
                try:
                    con.execute(example.sql)
                    echo(f"-- {example.title}: ACCEPTED (unexpected)")
                except sqlsdc.PolicyViolation as refusal:
                    echo(f"-- {example.title}\n   {example.sql}\n   refused: {refusal}")
    finally:
        raw.close()


def _dp_summary(con, cursor) -> str:
    """95% intervals of the noisy cells and the budget the user has left."""
    accuracy = cursor.cell_accuracy()
    keys = cursor.df().iloc[:, 0].tolist()
    lines = ["   95% intervals (noise only; bounding is part of the query's definition):"]
    for row in accuracy.itertuples(index=False):
        lines.append(f"     {keys[row.row]:>14} {row.column:>10}: {row.value:>14,.0f}  "
                     f"[{row.low:,.0f}, {row.high:,.0f}]")  # fmt: skip
    cost = cursor.explain().dp_cost.describe()
    lines.append(f"   this query costs at most {cost} (cells seen before are free)")
    for status in con.remaining_budget():
        if status.limit.epsilon is not None:
            lines.append(f"   budget of {status.key.describe()}: spent ε = "
                         f"{float(status.spent.epsilon):g}, remaining ε = "
                         f"{float(status.remaining.epsilon):g}")  # fmt: skip
    return "\n".join(lines)


def _side_by_side(raw: pd.DataFrame, cursor) -> str:
    protected, status = cursor.df().convert_dtypes(), cursor.cell_status()
    raw = raw.convert_dtypes()
    table = pd.DataFrame()
    for name in protected.columns:
        kinds = set(status[name])
        if kinds <= {"key", "public"}:
            table[name] = protected[name]
            continue
        table[f"{name} (raw)"] = raw[name]
        table[f"{name} (protected)"] = protected[name]
        table[f"{name} status"] = status[name]
    for column in table.columns:
        if str(table[column].dtype) == "Float64":
            table[column] = table[column].round(1)
    return table.astype(object).where(table.notna(), "NULL").to_string(index=False)
