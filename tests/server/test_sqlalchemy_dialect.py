"""The embedded SQLAlchemy dialect (sqlsdc.dialect) over a real demo database."""

from __future__ import annotations

import pytest

sqlalchemy = pytest.importorskip("sqlalchemy")
pd = pytest.importorskip("pandas")

import sqlsdc  # noqa: E402


@pytest.fixture
def engine(demo_db):
    engine = sqlalchemy.create_engine(f"sqlsdc:///{demo_db}?user=analyst")
    yield engine
    engine.dispose()


def test_read_sql_of_an_aggregate_matches_the_guarded_connection(engine, demo_db):
    sql = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY region"
    frame = pd.read_sql(sql, engine)
    with sqlsdc.connect(demo_db, user="analyst") as con:
        expected = con.execute(sql).df()
    assert frame["region"].tolist() == expected["region"].tolist()
    assert frame["n"].tolist() == expected["n"].tolist()  # the same protected cells (CKM)


def test_parameters_and_text_statements(engine):
    with engine.connect() as con:
        rows = con.execute(
            sqlalchemy.text("SELECT COUNT(*) AS n FROM persons WHERE region = :r"), {"r": "north"}
        ).fetchall()
    assert len(rows) == 1


def test_inspector_shows_only_visible_tables_and_columns(engine):
    inspector = sqlalchemy.inspect(engine)
    assert inspector.get_schema_names() == ["public"]
    assert inspector.get_table_names() == ["benefits", "enterprises", "households", "persons",
                                           "regions"]  # fmt: skip
    assert inspector.get_view_names() == []
    assert inspector.has_table("persons") and not inspector.has_table("secrets")
    columns = inspector.get_columns("persons")
    assert [c["name"] for c in columns] == ["person_id", "household_id", "region",
                                            "municipality", "sex", "age", "education",
                                            "occupation", "income", "weight"]  # fmt: skip
    assert isinstance(columns[-2]["type"], sqlalchemy.Float)
    assert columns[-2]["comment"].startswith("measure")
    assert inspector.get_pk_constraint("persons")["constrained_columns"] == []
    assert inspector.get_foreign_keys("persons") == []
    assert inspector.get_indexes("persons") == []
    assert inspector.get_table_comment("persons")["text"].startswith("confidential table")
    with pytest.raises(sqlalchemy.exc.NoSuchTableError):
        inspector.get_columns("secrets")


def test_table_reflection_and_core_select(engine):
    persons = sqlalchemy.Table("persons", sqlalchemy.MetaData(), autoload_with=engine)
    query = sqlalchemy.select(persons.c.sex, sqlalchemy.func.count().label("n")).group_by(
        persons.c.sex
    )
    with engine.connect() as con:
        assert {row.sex for row in con.execute(query)} == {"F", "M"}


def test_a_refused_query_raises_with_the_guards_message(engine, demo_db):
    sql = "SELECT income FROM persons"
    with sqlsdc.connect(demo_db, user="analyst") as con:
        with pytest.raises(sqlsdc.PolicyViolation) as guard:
            con.execute(sql)
    with engine.connect() as con:
        with pytest.raises(sqlalchemy.exc.ProgrammingError) as wrapped:
            con.exec_driver_sql(sql)
    assert isinstance(wrapped.value.orig, sqlsdc.PolicyViolation)
    assert isinstance(wrapped.value.orig, sqlsdc.ProgrammingError)
    assert str(wrapped.value.orig) == str(guard.value)


def test_pandas_read_sql_reaches_the_refusal_as_the_readme_says(engine):
    """The README caught sqlalchemy.exc.ProgrammingError around pd.read_sql, which pandas 3
    wraps in pandas.errors.DatabaseError: the example ended in a traceback."""
    import pandas as pd

    with pytest.raises((sqlalchemy.exc.ProgrammingError, pd.errors.DatabaseError)) as info:
        pd.read_sql("SELECT income FROM persons", engine)
    error = info.value
    refusal = getattr(error, "orig", None) or error.__cause__.orig
    assert isinstance(refusal, sqlsdc.PolicyViolation)


def test_the_url_needs_a_user(demo_db):
    with pytest.raises(sqlsdc.InterfaceError, match=r"\?user=analyst"):
        sqlalchemy.create_engine(f"sqlsdc:///{demo_db}")
