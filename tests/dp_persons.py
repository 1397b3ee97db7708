"""The policy of the small DP ``persons`` table (``pid``, ``region``, ``age``) that the
concurrency and charge-fault tests build: each COUNT and SUM spends ε = 1/2, and the analyst
``ana`` has ``budget`` to spend."""

from pathlib import Path

import duckdb

import sqlsdc


def build(path: Path, budget=30) -> Path:
    """4,000 persons (regions N, S, E, W in turn; ages 0-89) under :func:`document`'s policy,
    at ``path``."""
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE persons AS SELECT i AS pid, ['N', 'S', 'E', 'W'][1 + i % 4] AS "
                "region, i % 90 AS age FROM range(4000) t(i)")  # fmt: skip
    con.close()
    sqlsdc.init(path, document(budget))
    return path


def document(budget) -> dict:
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
        "budgets": [{"user": "ana", "epsilon": str(budget)}],
    }
