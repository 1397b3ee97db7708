"""Red team s49b: session 48's back-end job changes (tail coding of syntheses, linked files,
the fast path of the differencing checks, small counts' random rounding, keyed_changes, CTA).

Found (fixed): **a synthesis of fewer than 10 values shows their mean, of one its value.**
:mod:`sqlsdc.synth.tails` codes a measure's 5 largest and 5 smallest values to their means;
fewer than 10 values are all coded to their one mean. ``parametric`` then draws that value
only, and ``cart``'s smoothing leaves a value most draws hold where it is (synthpop's 70 %
rule): on the CLI demo (20,000 persons) ``SELECT sex, income FROM persons WHERE municipality
= 'R01-M008' AND age = 58`` (5 persons) stored 50 records of 182,231.944 each, their mean to
the cent, with either method; ``... AND income > 500000`` (1 person) 50 records of 706,147.09,
R01's largest income; the same 5 persons and the 2 women among them (27,178.415) gave the 3
men's total, 856,802.89, by difference. The job now refuses a coded column with 1 to 9
values (:func:`sqlsdc.synth.tails.refuse_few_values`).

Held (one line each; the CLI demo of 20,000 persons unless said):
"""

from __future__ import annotations

import duckdb
import pytest

from sqlsdc.errors import SynthesisError


def _few(db, people: int) -> tuple[str, list[float]]:
    """A WHERE on persons holding the ``people`` largest incomes of the municipality of R01's
    largest income, and their incomes (the tester's reading)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        ((municipality,),) = con.execute(
            "SELECT municipality FROM persons WHERE region = 'R01' "
            "ORDER BY income DESC NULLS LAST LIMIT 1"
        ).fetchall()
        where = f"municipality = '{municipality}' AND income IS NOT NULL"
        ids = [i for (i,) in con.execute(
            f"SELECT person_id FROM persons WHERE {where} ORDER BY income DESC"
        ).fetchall()][:people]  # fmt: skip
        where += f" AND person_id IN ({', '.join(map(str, ids))})"
        incomes = [
            v for (v,) in con.execute(f"SELECT income FROM persons WHERE {where}").fetchall()
        ]
    finally:
        con.close()
    return where, incomes


def _shown(db, name: str) -> list[float]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return [
            v for (v,) in con.execute(f"SELECT DISTINCT income FROM protected.{name}").fetchall()
        ]
    finally:
        con.close()


@pytest.mark.parametrize("method", ["parametric", "cart"])
@pytest.mark.parametrize("people", [1, 5])
def test_a_synthesis_of_fewer_than_ten_values_is_refused(fresh_demo_db, method, people):
    """Failed on main: every synthetic income was the mean of the ``people`` incomes to the
    cent (one person: her income), with both methods."""
    from sqlsdc.synth import synthesize

    where, incomes = _few(fresh_demo_db, people)
    assert len(incomes) == people
    try:
        synthesize(fresh_demo_db, user="admin", into="few", method=method, rows=50, seed=1,
                   sql=f"SELECT sex, income FROM persons WHERE {where}")  # fmt: skip
    except SynthesisError as refusal:
        assert f"income has {people} value(s)" in str(refusal)
    else:  # main: [their mean] (one person: [her income])
        mean = round(sum(incomes) / people, 3)
        assert mean not in [round(v, 3) for v in _shown(fresh_demo_db, "few")], mean
    con = duckdb.connect(str(fresh_demo_db), read_only=True)
    try:  # nothing stored
        assert not con.execute(
            "SELECT 1 FROM duckdb_tables() WHERE schema_name = 'protected' AND table_name = 'few'"
        ).fetchall()
    finally:
        con.close()


def test_ten_values_or_more_are_synthesised_as_coded_means(fresh_demo_db):
    """The guard's other side: 10 values are coded to the mean of the 5 smallest and of the 5
    largest, never one person's value, and stored."""
    from sqlsdc.synth import synthesize

    con = duckdb.connect(str(fresh_demo_db), read_only=True)
    try:
        ids = [i for (i,) in con.execute(
            "SELECT person_id FROM persons WHERE region = 'R01' AND income IS NOT NULL "
            "ORDER BY person_id LIMIT 10"
        ).fetchall()]  # fmt: skip
    finally:
        con.close()
    where = f"person_id IN ({', '.join(map(str, ids))})"
    synthesize(fresh_demo_db, user="admin", into="ten", method="parametric", rows=200, seed=1,
               sql=f"SELECT sex, income FROM persons WHERE {where}")  # fmt: skip
    con = duckdb.connect(str(fresh_demo_db), read_only=True)
    try:
        incomes = sorted(v for (v,) in con.execute(
            f"SELECT income FROM persons WHERE {where}"
        ).fetchall())  # fmt: skip
    finally:
        con.close()
    low, high = sum(incomes[:5]) / 5, sum(incomes[5:]) / 5
    shown = _shown(fresh_demo_db, "ten")
    assert min(shown) == pytest.approx(low) and max(shown) == pytest.approx(high)
    assert not set(incomes) & set(shown)
