"""An ENUM column's labels are values of the data: the types an analyst is shown name them
VARCHAR (red team s47g: ``Connection.analyst_schema`` listed every label of an ENUM built from
the data's values, a category no row has among them)."""

from __future__ import annotations

import duckdb

import sqlsdc
from sqlsdc.engines.duckdb_schema import shown_type


def test_an_enum_column_is_shown_to_an_analyst_as_varchar(fresh_demo_db):
    con = duckdb.connect(str(fresh_demo_db))
    try:
        schemes = [row[0] for row in con.execute("SELECT DISTINCT scheme FROM benefits").fetchall()]
        labels = ", ".join(f"'{label}'" for label in [*schemes, "rare_scheme"])
        con.execute(f"CREATE TYPE scheme_kind AS ENUM ({labels})")
        con.execute("ALTER TABLE benefits ALTER scheme TYPE scheme_kind")
    finally:
        con.close()
    with sqlsdc.connect(fresh_demo_db, user="analyst") as analyst:
        shown = analyst.analyst_schema["benefits"]
    assert shown["scheme"] == "VARCHAR"
    assert "rare_scheme" not in repr(shown)


def test_enums_nested_in_other_types_are_shown_as_varchar():
    assert shown_type("ENUM('a)''b', 'c')[]") == "VARCHAR[]"
    assert shown_type("STRUCT(x ENUM('p'), y INTEGER)") == "STRUCT(x VARCHAR, y INTEGER)"
    assert shown_type("MAP(VARCHAR, ENUM('q'))") == "MAP(VARCHAR, VARCHAR)"
    assert shown_type("DECIMAL(18,3)") == "DECIMAL(18,3)"
