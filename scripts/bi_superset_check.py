"""Apache Superset against ``sqlsdc serve``, through Superset's own code: what its UI does when
someone adds the database, syncs a dataset and draws charts.

Run with the Python of a Superset virtualenv (``scripts/bi_superset.sh`` makes the server, the
metadata database and the call); it imports Superset, not sqlsdc.

1. "Test connection" (``TestConnectionDatabaseCommand``, the button of the database dialog);
2. dataset sync: schema and table lists, then ``SqlaTable.fetch_metadata`` (column names and
   types from the catalog, and Superset's default ``COUNT(*)`` metric);
3. chart queries as Superset writes them (``SqlaTable.get_query_str`` and ``query``): counts by
   region (plain, sorted, filtered), ``SUM`` and ``AVG`` metrics, two dimensions;
4. what the policy refuses arrives as Superset's query error with the guard's message: grouping
   by an identifier, a custom SQL metric over a column the catalog does not show, and a
   row-level query as SQL Lab would send it.

Usage: python scripts/bi_superset_check.py SQLALCHEMY_URI  (SUPERSET_HOME holds an upgraded
metadata database). Prints one line per check, with the SQL Superset sent; exits 1 when a
check does not hold.
"""

from __future__ import annotations

import sys

COUNT_BY_REGION = {
    "groupby": ["region"], "metrics": ["count"], "columns": [], "filter": [], "extras": {},
    "is_timeseries": False, "row_limit": 10000, "granularity": None, "from_dttm": None,
    "to_dttm": None, "orderby": [],
}  # fmt: skip
"""A bar chart of the number of persons by region, as Superset's chart data API builds it."""


def _metric(aggregate: str, column: str) -> dict:
    return {"expressionType": "SIMPLE", "column": {"column_name": column},
            "aggregate": aggregate, "label": f"{aggregate}({column})"}  # fmt: skip


CHARTS = {
    "count by region": {},
    "sorted by count": {"orderby": [["count", False]]},
    "filtered (sex = F)": {
        "filter": [{"col": "sex", "op": "==", "val": "F"}],
        "orderby": [["count", False]],
    },  # fmt: skip
    "SUM(income) by region": {"metrics": [_metric("SUM", "income")]},
    "AVG(income) by region, sex": {
        "metrics": [_metric("AVG", "income")],
        "groupby": ["region", "sex"],
    },  # fmt: skip
}
REFUSED = {
    "group by an identifier": ({"groupby": ["person_id"]}, "cannot be grouped by"),
    "custom SQL metric over a column not in the catalog": (
        {"metrics": [{"expressionType": "SQL", "sqlExpression": "SUM(__rkey)", "label": "k"}]},
        "__rkey",
    ),
}


def main(uri: str) -> int:
    from superset.app import create_app

    app = create_app()
    failures = []

    def check(name: str, holds: bool, detail: str = "") -> None:
        print(f"{'ok  ' if holds else 'FAIL'} {name}{': ' + detail if detail else ''}")
        if not holds:
            failures.append(name)

    with app.app_context():
        from superset import db
        from superset.commands.database.test_connection import TestConnectionDatabaseCommand
        from superset.connectors.sqla.models import SqlaTable
        from superset.models.core import Database

        try:
            TestConnectionDatabaseCommand({"sqlalchemy_uri": uri, "database_name": "sqlsdc"}).run()
            check("test connection", True)
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            check("test connection", False, f"{type(e).__name__}: {e}")
            return 1

        database = Database(database_name="sqlsdc demo", sqlalchemy_uri=uri)
        db.session.add(database)
        db.session.commit()
        schemas = database.get_all_schema_names()
        check("schemas", "public" in schemas and "sqlsdc" not in schemas, str(sorted(schemas)))
        names = database.get_all_table_names_in_schema(catalog=None, schema="public")
        tables = {name for name, _, _ in names}
        check("tables", "persons" in tables, str(sorted(tables)))

        table = SqlaTable(table_name="persons", schema="public", database=database)
        db.session.add(table)
        db.session.commit()
        table.fetch_metadata()
        columns = {c.column_name: str(c.type) for c in table.columns}
        check("dataset sync (columns)", "region" in columns and "__rkey" not in columns,
              ", ".join(f"{k} {v}" for k, v in columns.items()))  # fmt: skip
        check("dataset sync (metrics)", [m.metric_name for m in table.metrics] == ["count"])

        for name, change in CHARTS.items():
            query = dict(COUNT_BY_REGION, **change)
            sql = " ".join(table.get_query_str(query).split())
            result = table.query(query)
            check(f"chart {name}", result.status == "success" and len(result.df) > 0,
                  f"{sql} -> {len(result.df)} rows" if result.status == "success"
                  else f"{sql} -> {result.error_message}")  # fmt: skip
        for name, (change, expected) in REFUSED.items():
            query = dict(COUNT_BY_REGION, **change)
            sql = " ".join(table.get_query_str(query).split())
            result = table.query(query)
            message = (result.error_message or "").splitlines()[0] if result.error_message else ""
            check(f"refused: {name}", result.status == "failed" and expected in message,
                  f"{sql} -> {message}")  # fmt: skip

        try:
            database.get_df("SELECT * FROM public.persons LIMIT 5", schema="public")
            check("refused: row-level query (SQL Lab)", False, "rows were returned")
        except Exception as e:  # noqa: BLE001 - the refusal expected
            message = str(getattr(e, "orig", e)).splitlines()[0]
            check("refused: row-level query (SQL Lab)", "InsufficientPrivilege" in
                  type(getattr(e, "orig", e)).__name__, message)  # fmt: skip
    print(f"{len(failures)} failed" if failures else "all Superset checks hold")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
