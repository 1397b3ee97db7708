"""A sweep for error oracles: every function the guard accepts, on every type a table may hold.

An error oracle is a query the guard accepts that fails in the engine for some confidential
values and not for others: whether it fails tells a person's value. Here pid 7 (in group
``b``) holds the extreme value of each column (the smallest and largest integers of every
width, the widest DECIMALs, NaN, ±infinity, -0.0 and denormals, empty, long and odd Unicode
text, the first and last DATE and TIMESTAMP of each precision, infinities, 24:00, huge
INTERVALs, BLOB, UUID, ENUM, BIT, nested types and JSON); everyone else holds an ordinary one.
Every expression of :data:`TEMPLATES` the guard accepts on a column is evaluated in the rows
of group ``a`` and of group ``b`` only (a CASE on the group, which DuckDB evaluates lazily),
as a group key and in HAVING, and over measures inside SUM; each shape must end alike for
both groups: answered, refused or failed. The expressions the guard accepts are found by
explaining them (no engine), then run together, one query per column and group.

What the sweep found (session 31), each fixed in the guard and kept below as a case:
comparing or mixing HUGEINT, UHUGEINT or DECIMAL(38, s) values with other exact numbers
(``hugeint > 0.5``: the common DECIMAL needs more than 38 digits; ``uhugeint = bigint``: no
common type), :mod:`sqlsdc.planner.exact_mixing`; ``TRY_CAST`` of a BIGNUM to an integer
(DuckDB's internal error, which also invalidates the database), :mod:`sqlsdc.planner.totality`;
``CAST`` of a BIT string to DOUBLE (BIT was typed as an integer); ``EXTRACT(nanosecond)`` of
dates and timestamps far from today, ``EXTRACT(timezone)`` of a DATE, and STRFTIME's ISO week
formats of the earliest dates, :mod:`sqlsdc.planner.temporal_parts`; a SUM or AVG of a
HUGEINT or DECIMAL(38) measure cast to DOUBLE inside a CASE (the cell key method added up the
measure itself), :mod:`sqlsdc.planner.aggregates`; released dates and timestamps outside
Python's range raised in ``fetchall``/``df`` (the threshold rule releases the keys of the
cells it suppresses), :mod:`sqlsdc.guard.values`.

The full exploration (about 280 expressions, 66 columns, WHERE/key/HAVING/COUNT/SUM/AVG shapes,
CKM, DP and threshold: some 100,000 queries) was a script; this module keeps a representative
set that runs in seconds.
"""

from __future__ import annotations

import datetime

import duckdb
import pytest

import sqlsdc
from tests.security.test_redteam_s28e import CKM, DP

THRESHOLD = {"counts": {"method": "threshold"}, "magnitudes": {"method": "threshold"}}
ROWS = 200

# name: (type, ordinary value as SQL over i, the extreme value pid 7 holds)
INTEGERS = {
    "ti_min": ("TINYINT", "-128"),
    "in_min": ("INTEGER", "-2147483648"),
    "bi_min": ("BIGINT", "-9223372036854775808"),
    "hi_min": ("HUGEINT", "-170141183460469231731687303715884105728"),
    "hi_max": ("HUGEINT", "170141183460469231731687303715884105727"),
    "ub_max": ("UBIGINT", "18446744073709551615"),
    "uh_max": ("UHUGEINT", "340282366920938463463374607431768211455"),
    "de4": ("DECIMAL(4,1)", "-999.9"),
    "de18": ("DECIMAL(18,3)", "999999999999999.999"),
    "de38": ("DECIMAL(38,10)", "-9999999999999999999999999999.9999999999"),
    "de38_0": ("DECIMAL(38,0)", "99999999999999999999999999999999999999"),
    "fl_nan": ("FLOAT", "'nan'"),
    "db_nan": ("DOUBLE", "'nan'"),
    "db_inf": ("DOUBLE", "'-inf'"),
    "db_nz": ("DOUBLE", "-0.0"),
    "db_den": ("DOUBLE", "5e-324"),
    "db_max": ("DOUBLE", "1.7976931348623157e308"),
}
NUMBERS = {
    name: (kind, f"CAST(i % 50 AS {kind})", value) for name, (kind, value) in INTEGERS.items()
}
TEXT = "'v' || (i % 20)"
DAYS = "DATE '2020-01-01' + CAST(i % 700 AS INTEGER)"
HOURS = "TIMESTAMP '2020-01-01' + to_hours(i)"
CLOCK = "TIME '12:00:00' + to_seconds(i % 600)"
OTHERS = {
    "bn": ("BIGNUM", "CAST(i % 50 AS BIGNUM)", "CAST(repeat('9', 400) AS BIGNUM)"),
    "vc_empty": ("VARCHAR", TEXT, "''"),
    "vc_long": ("VARCHAR", TEXT, "repeat('x', 20000)"),
    "vc_odd": ("VARCHAR", TEXT, "'ß\u0130\u0301\U0001f600\u202e' || chr(0)"),
    "vc_num": ("VARCHAR", "CAST(i % 20 AS VARCHAR)", "'99999999999999999999'"),
    "bo": ("BOOLEAN", "i % 3 = 0", "NULL"),
    "da_max": ("DATE", DAYS, "DATE '5877641-06-25'"),
    "da_min": ("DATE", DAYS, "DATE '-5877641-06-25'"),
    "da_inf": ("DATE", DAYS, "'infinity'"),
    "tm": ("TIME", CLOCK, "TIME '24:00:00'"),
    "tmz": ("TIMETZ", CLOCK, "'24:00:00-15:59'"),
    "ts_max": ("TIMESTAMP", HOURS, "TIMESTAMP '294247-01-10 04:00:54.775806'"),
    "ts_min": ("TIMESTAMP", HOURS, "TIMESTAMP '-290308-12-22'"),
    "ts_inf": ("TIMESTAMP", HOURS, "'-infinity'"),
    "tss_min": ("TIMESTAMP_S", HOURS, "TIMESTAMP '-290308-12-22'"),
    "tms_max": ("TIMESTAMP_MS", HOURS, "TIMESTAMP '294247-01-10 04:00:54.775'"),
    "tns_min": ("TIMESTAMP_NS", HOURS, "'1677-09-21 00:12:43.145224194'"),
    "tz_min": ("TIMESTAMPTZ", HOURS, "TIMESTAMP '-290308-12-22'"),
    "tz_inf": ("TIMESTAMPTZ", HOURS, "'infinity'"),
    "iv": ("INTERVAL", "to_days(CAST(i % 30 AS INTEGER))",
           "INTERVAL 178000000 YEAR + to_microseconds(9223372036854775807)"),
    "bl": ("BLOB", "CAST('b' || (i % 5) AS BLOB)", "'\\xFF\\x00\\xC3'::BLOB"),
    "uu": ("UUID", "CAST('00000000-0000-0000-0000-0000000000' || (i % 90 + 10) AS UUID)",
           "'ffffffff-ffff-ffff-ffff-ffffffffffff'"),
    "en": ("ENUM('x', 'y', 'z')", "CASE WHEN i % 2 = 0 THEN 'x' ELSE 'y' END", "'z'"),
    "bt": ("BIT", "CAST('101' AS BIT)", "CAST(repeat('1', 200) AS BIT)"),
    "li": ("INTEGER[]", "[CAST(i % 5 AS INTEGER)]", "[2147483647, NULL]"),
    "st": ("STRUCT(a INTEGER, b VARCHAR)", "{'a': CAST(i % 5 AS INTEGER), 'b': 'x'}",
           "{'a': -2147483648, 'b': ''}"),
    "mp": ("MAP(VARCHAR, INTEGER)", "MAP {'k': CAST(i % 5 AS INTEGER)}", "MAP {'': 1}"),
    "js": ("JSON", "CAST('{\"a\": ' || (i % 5) || '}' AS JSON)", "'[1e999]'"),
}  # fmt: skip
COLUMNS = NUMBERS | OTHERS
MEASURES = [name for name in NUMBERS]

ANY = [
    "{x}", "CAST({x} AS VARCHAR)", "CAST({x} AS DOUBLE)", "CAST({x} AS BIGINT)",
    "TRY_CAST({x} AS BIGINT)", "TRY_CAST({x} AS DECIMAL(38,0))", "TRY_CAST({x} AS TIMESTAMP)",
    "{x} = {x}", "{x} = 'a'", "COALESCE({x}, {x})", "GREATEST({x}, {x})",
    "LENGTH(CAST({x} AS VARCHAR))",
]  # fmt: skip
NUMERIC = [
    "{x} + 1e0", "{x} * 1e300", "-{x}", "{x} // 3", "{x} % 3", "ROUND({x}, 2)", "{x} > 0",
    "{x} > -1", "{x} > 0.5", "{x} IN (1, 0.5)", "{x} = bi_min", "{x} = hi_max", "{x} = de38_0",
    "COALESCE({x}, 0.5)", "CASE WHEN g = 'a' THEN {x} ELSE de38 END",
    "LN(CAST({x} AS DOUBLE))",
]  # fmt: skip
TEMPORAL = [
    "YEAR({x})", "EXTRACT(week FROM {x})", "EXTRACT(isoyear FROM {x})", "EXTRACT(epoch FROM {x})",
    "EXTRACT(nanosecond FROM {x})", "EXTRACT(timezone FROM {x})", "DATE_TRUNC('year', {x})",
    "DATE_TRUNC('isoyear', {x})", "STRFTIME({x}, '%Y-%m-%d')", "STRFTIME({x}, '%G')",
    "YEAR(DATE_TRUNC('month', {x}))", "STRFTIME(DATE_TRUNC('year', {x}), '%Y')",
    "COALESCE(DATE_TRUNC('year', {x}), {x})", "DATE_TRUNC('year', {x}) > TIMESTAMP '2020-01-01'",
    "{x} = ts_max", "{x} > DATE '2020-01-01'", "CAST(EXTRACT(epoch FROM {x}) AS BIGINT)",
]  # fmt: skip
STRINGS = [
    "LOWER({x})", "TRIM({x})", "SUBSTRING({x}, 2147483647, 2147483647)", "{x} ILIKE '%ß%'",
    "LENGTH({x}) * 1000000", "CAST(LENGTH({x}) AS DOUBLE) * 2e0", "TRY_CAST({x} AS INTEGER)",
]  # fmt: skip
TEMPORAL_COLUMNS = [n for n, (kind, *_) in OTHERS.items() if kind.startswith(("DATE", "TIME"))]


def templates(column: str) -> list[str]:
    """The expressions tried on ``column``: every type gets :data:`ANY`, and its own family's."""
    if column in NUMBERS:
        return ANY + NUMERIC
    if column in TEMPORAL_COLUMNS:
        return ANY + TEMPORAL
    if COLUMNS[column][0] == "VARCHAR":
        return ANY + STRINGS + TEMPORAL[:1]
    return ANY + NUMERIC[:2] + TEMPORAL[:1] + STRINGS[:1]


def build(path, protection, columns=COLUMNS) -> sqlsdc.Connection:
    """Table ``t`` (every column a dimension) and ``u`` (the numbers as measures); pid 7, in
    group b, holds each column's extreme value."""
    values = ", ".join(
        f"CASE WHEN i = 7 THEN CAST({extreme} AS {kind}) ELSE CAST({ordinary} AS {kind}) END "
        f"AS {name}"
        for name, (kind, ordinary, extreme) in columns.items()
    )
    measures = [c for c in MEASURES if c in columns]
    raw = duckdb.connect(str(path))
    raw.execute(
        "CREATE TABLE t AS SELECT i AS pid, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END AS g, "
        f"{values} FROM range({ROWS}) AS r(i)"
    )
    raw.execute(f"CREATE TABLE u AS SELECT pid, g, {', '.join(measures)} FROM t")
    raw.close()
    keys = {"pid": {"role": "identifier"}, "g": {"role": "dimension", "domain": ["a", "b"]}}
    bounds = {"bounds": [0, 100]} if protection is DP else {}
    tables = {
        "t": {"privacy_unit": "pid", "protection": protection,
              "columns": keys | {c: {"role": "dimension"} for c in columns}},
        "u": {"privacy_unit": "pid", "protection": protection,
              "columns": keys | {c: {"role": "measure", **bounds} for c in measures}},
    }  # fmt: skip
    if protection is DP:
        for table in tables.values():
            table["dp"] = {"granularity": 10}
    sqlsdc.init(path, {
        "tables": tables,
        "users": {"analyst": {"role": "analyst"}, "admin": {"role": "admin"}},
        "budgets": [{"user": "*", "epsilon": 1000, "rho": 100, "delta": "1e-3"}],
    })  # fmt: skip
    return sqlsdc.connect(path, user="analyst")


@pytest.fixture(scope="module")
def ckm(tmp_path_factory):
    with build(tmp_path_factory.mktemp("sweep") / "ckm.duckdb", CKM) as con:
        yield con


def outcome(con, sql: str) -> str:
    try:
        con.cursor().execute(sql).fetchall()
        return "answered"
    except sqlsdc.PolicyViolation:
        return "refused"
    except sqlsdc.OperationalError:
        return "failed"


def accepted(con, sql_of, expressions: list[str]) -> list[str]:
    """The expressions whose query the guard accepts (explained, not run)."""
    found = []
    for e in expressions:
        try:
            con.explain(sql_of(e=e))
            found.append(e)
        except sqlsdc.PolicyViolation:
            pass
    return found


@pytest.fixture(scope="module")
def dimensions(ckm) -> dict[str, list[str]]:
    """For each column, the expressions of :func:`templates` the guard accepts on it (the
    guard judges types, not values: the first column of each type stands for the others)."""
    where = "SELECT COUNT(*) FROM t WHERE ({e}) IS NULL"
    by_type: dict[str, list[str]] = {}
    for column, (kind, *_) in COLUMNS.items():
        if kind not in by_type:
            tried = {t.replace("{x}", column): t for t in templates(column)}
            by_type[kind] = [tried[e] for e in accepted(ckm, where.format, list(tried))]
    return {
        column: [t.replace("{x}", column) for t in by_type[kind]]
        for column, (kind, *_) in COLUMNS.items()
    }


SHAPES = {
    # evaluated in the rows of one group only: DuckDB evaluates a CASE branch lazily, per row
    "where": "SELECT COUNT(*) FROM t WHERE CASE WHEN g = '{g}' THEN {e} IS NULL ELSE false END",
    "key": "SELECT {e} AS k, COUNT(*) AS n FROM t WHERE g = '{g}' GROUP BY 1",
}


def together(expressions: list[str]) -> str:
    """One value that evaluates every expression (CONCAT evaluates all its arguments)."""
    return "CONCAT(" + ", ".join(f"({e}) IS NULL" for e in expressions) + ")"


def alike(run, parts: list[list[str]]) -> list[str]:
    """The expressions whose query ends differently for groups a and b: ``run(expressions,
    group)`` runs them together; a part that fails, or ends differently, is split up."""
    different = []
    for part in parts:
        outcomes = {run(part, g) for g in "ab"}
        if outcomes == {"failed"} or len(outcomes) > 1:
            if len(part) == 1:
                different += part if len(outcomes) > 1 else []
            else:
                different += alike(run, [part[: len(part) // 2], part[len(part) // 2 :]])
    return different


@pytest.mark.slow  # the whole sweep: ~2,000 explains and queries (~12 s of CPU); CI runs it
@pytest.mark.parametrize("shape", SHAPES)
def test_every_accepted_expression_ends_alike_for_both_groups(ckm, dimensions, shape):
    """Every expression the guard accepts on a column, evaluated in WHERE or as a group key,
    answers (or fails) for group b, where pid 7 holds the column's extreme value, as for
    group a. All expressions run together, and are split up if they fail."""
    assert all(dimensions.values())

    def run(expressions: list[str], group: str) -> str:
        return outcome(ckm, SHAPES[shape].format(g=group, e=together(expressions)))

    assert alike(run, [[e for column in dimensions.values() for e in column]]) == []


SUMMED = [
    "{x}", "CAST({x} AS DOUBLE)", "{x} * 1e300", "-{x}", "{x} // 3", "{x} % 3", "ROUND({x}, 2)",
    "COALESCE({x}, 0.5)", "CASE WHEN g = 'a' THEN {x} ELSE de38 END",
    "CASE WHEN g = 'b' THEN CAST({x} AS DOUBLE) END", "CASE WHEN g = 'b' THEN {x} * 2e0 END",
]  # fmt: skip


@pytest.mark.slow  # the whole sweep of measures (~5 s of CPU); CI runs it
def test_every_accepted_sum_ends_alike_for_both_groups(ckm):
    """Each expression of a measure the guard accepts inside SUM (the cell key method's
    magnitudes: top contributions, flex function, perturbation) answers for group b as for
    group a."""
    sql = "SELECT g, {e} FROM u WHERE g = '{g}' GROUP BY g"
    sums = {
        column: accepted(ckm, lambda e: sql.format(g="a", e=e),
                         [f"SUM({t.replace('{x}', column)})" for t in SUMMED])
        for column in MEASURES
    }  # fmt: skip
    assert sum(map(len, sums.values())) > len(MEASURES)

    def run(expressions: list[str], group: str) -> str:
        return outcome(ckm, sql.format(g=group, e=", ".join(expressions)))

    assert alike(run, [[s for column in sums.values() for s in column]]) == []


# --- the oracles the sweep found, one case each (all answered for a and failed for b before) ---

FOUND = [
    ("hi_max", "{x} > 0.5", "common DECIMAL"),
    ("de38_0", "{x} IN (1, 0.5)", "common DECIMAL"),
    ("de38", "CASE WHEN g = 'a' THEN {x} ELSE de38_0 END", "common DECIMAL"),
    ("de18", "{x} BETWEEN 0 AND de38_0", "common DECIMAL"),
    ("uh_max", "{x} = bi_min", "UHUGEINT"),
    ("uh_max", "COALESCE({x}, -1)", "UHUGEINT"),
    ("bn", "TRY_CAST({x} AS BIGINT)", "TRY_CAST"),
    ("bt", "CAST({x} AS DOUBLE)", "casting"),
    ("ts_min", "EXTRACT(nanosecond FROM {x})", "computed through casts"),
    ("da_max", "EXTRACT(nanosecond FROM {x})", "computed through casts"),
    ("tz_min", "EXTRACT(nanosecond FROM {x})", "computed through casts"),
    ("da_inf", "EXTRACT(timezone FROM {x})", "allowed parts"),
    ("da_min", "STRFTIME({x}, '%G')", "ISO|%G"),
    ("da_min", "STRFTIME({x}, 'week %V')", "%V"),
    ("tm", "YEAR({x})", "no date"),
]
SMALL = {c: COLUMNS[c] for c in {c for c, *_ in FOUND} | {"bi_min", "de38_0", "ts_max", "in_min"}}


@pytest.fixture(scope="module", params=["dp", "threshold"])
def other(request, tmp_path_factory):
    """The columns of :data:`FOUND` under differential privacy, and under the threshold rule."""
    protection = {"dp": DP, "threshold": THRESHOLD}[request.param]
    with build(tmp_path_factory.mktemp(request.param) / "t.duckdb", protection, SMALL) as con:
        yield con


@pytest.mark.parametrize("column", ["hi_max", "uh_max", "de38_0"])
def test_a_wide_measure_cast_to_double_inside_a_case_is_not_summed(ckm, column):
    """``SUM(CAST(hugeint AS DOUBLE))`` was refused, but not inside a CASE: the cell key
    method's magnitudes then added up the HUGEINT measure itself, which overflowed for the
    cell holding the extreme value (answered for a, failed for b)."""
    sql = "SELECT g, {f}(CASE WHEN g = '{g}' THEN CAST({c} AS DOUBLE) END) FROM u GROUP BY g"
    for f in ("SUM", "AVG"):
        for g in "ab":
            with pytest.raises(sqlsdc.PolicyViolation, match="HUGEINT or DECIMAL"):
                ckm.cursor().execute(sql.format(f=f, g=g, c=column))


@pytest.mark.parametrize(("column", "template", "reason"), FOUND)
def test_the_oracles_found_are_refused_for_both_groups(ckm, column, template, reason):
    """In WHERE, as a group key and in HAVING, for both groups: refused, with the reason."""
    e = template.replace("{x}", column)
    having = f"SELECT {column}, COUNT(*) FROM t WHERE g = '{{g}}' GROUP BY {column} HAVING {{e}}"
    for shape in (*SHAPES.values(), having):
        for g in "ab":
            with pytest.raises(sqlsdc.PolicyViolation, match=reason):
                ckm.cursor().execute(shape.format(g=g, e=f"({e}) IS NULL"))


@pytest.mark.parametrize(("column", "template", "reason"), FOUND)
def test_the_oracles_found_are_refused_under_dp_and_threshold(other, column, template, reason):
    e = template.replace("{x}", column)
    for g in "ab":
        with pytest.raises(sqlsdc.PolicyViolation, match=reason):
            other.cursor().execute(SHAPES["where"].format(g=g, e=f"({e}) IS NULL"))


COMMON = [
    "DATE_TRUNC('month', ts_max)", "DATE_TRUNC('year', tz_min)", "EXTRACT(year FROM da_max)",
    "EXTRACT(week FROM ts_min)", "EXTRACT(dow FROM da_min)", "YEAR(da_min)", "MONTH(ts_max)",
    "STRFTIME(da_min, '%Y-%m')", "STRFTIME(ts_max, '%G-W%V')", "CAST(hi_max AS VARCHAR)",
    "CAST(in_min AS DOUBLE)", "ROUND(CAST(bi_min AS DOUBLE), 2)", "COALESCE(in_min, 0)",
    "in_min > 0.5", "bi_min IN (1, 2)", "de18 > 0.5", "hi_max > 0", "uh_max > 0",
    "bi_min = hi_max", "TRY_CAST(vc_num AS INTEGER)", "EXTRACT(hour FROM tm)",
]  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES)
def test_common_shapes_on_common_types_are_answered(ckm, shape):
    """The fixes refuse no common BI shape: truncations, parts, casts to text and DOUBLE,
    ROUND, COALESCE and comparisons with literals, on the extreme values too."""
    for g in "ab":
        assert outcome(ckm, SHAPES[shape].format(g=g, e=together(COMMON))) == "answered"


EARLIEST = "-290308-12-22 00:00:00.000000"
TEXTS = {"da_max": "5877641-06-25", "ts_min": EARLIEST, "tz_min": EARLIEST,
         "da_inf": datetime.date.max, "tm": None}  # fmt: skip


@pytest.mark.parametrize("other", ["threshold"], indirect=True)
@pytest.mark.parametrize("column", TEXTS)
def test_released_keys_outside_pythons_range_come_back_as_text(other, column):
    """The threshold rule releases the keys of the cells it suppresses; a date, timestamp or
    time Python cannot hold raised OverflowError (a traceback) in fetchall or df for group b
    and not for a. Now it comes back as text, as DuckDB's own client returns it (infinity as
    Python's largest date)."""
    sql = f"SELECT {column}, COUNT(*) AS n FROM t WHERE g = '{{g}}' GROUP BY 1"
    for g in "ab":
        keys = [k for k, _n in other.cursor().execute(sql.format(g=g)).fetchall()]
        assert len(other.cursor().execute(sql.format(g=g)).df()) == len(keys)
        if TEXTS[column] is not None:
            assert (TEXTS[column] in keys) == (g == "b")
