"""The small DP ``events`` table of the Spark red-team files: 600 rows of 60 persons, a
dimension ``k`` of 3 values and ``v`` of ``values`` values, counts under DP at ε = 1/10."""

from __future__ import annotations


def events_sql(values: int) -> str:
    """The statement that creates ``events`` (``v`` is ``i % values``)."""
    return (
        "CREATE TABLE events AS SELECT (i % 60)::BIGINT AS pid, (i % 3)::INTEGER AS k, "
        f"(i % {values})::INTEGER AS v FROM range(600) r(i)"
    )


def events_policy(values: int, analysts: tuple[str, ...]) -> dict:
    """A policy of ``events`` alone: an admin, the ``analysts``, ε = 1,000 each."""
    return {
        "tables": {
            "events": {
                "privacy_unit": "pid",
                "columns": {
                    "pid": {"role": "identifier"},
                    "k": {"role": "dimension", "domain": [0, 1, 2]},
                    "v": {"role": "dimension", "domain": list(range(values))},
                },
                "protection": {"counts": {"method": "dp", "spend": {"epsilon": "1/10"}}},
                "dp": {"max_groups": 3, "max_rows": 10},
            }
        },
        "users": {"admin": {"role": "admin"}, **{a: {"role": "analyst"} for a in analysts}},
        "budgets": [{"user": "*", "epsilon": 1000}],
    }
