"""Red-team round of session 34, with an analyst's connection only, against the last session's
"one spelling" of chosen values (``sqlsdc.rewrite.order``) and of released values
(``sqlsdc.guard.postprocess``).

The attack is red team s33c's: a CASE key moves the one person of R08-M019 (aged 66) into
R08-M001 when a guess about them holds, so a hidden group comes and goes and DuckDB's hash
tables give the shown groups another order; anything released that depends on that order
(rather than on the released values) answers the guess. What was found, and closed:

* **the sign of NaN**: DuckDB holds -NaN equal to NaN (``inf * 0`` is -NaN on x86, its negation
  NaN) and ``CAST(x AS VARCHAR)`` writes '-nan' and 'nan'; ``x + 0`` keeps the sign, so
  ``CAST(MIN(x) AS VARCHAR)`` over NaNs of both signs told which the engine read first: 'nan'
  when the person was 66, '-nan' when nobody matched (one run of the pair), and the released
  DOUBLEs kept their sign bit (``struct.pack`` shows it). MIN, MAX and the others now write
  NaN as the one NaN (``CASE WHEN isnan(x) THEN 'nan' ELSE x + 0 END``), and so does the
  post-processing of released values.
* **MEDIAN, QUANTILE_DISC and QUANTILE_CONT choose too**: a quantile returns the value at its
  rank among tied -0.0 and 0.0, and ``1 / MEDIAN(x)`` was -inf or inf as the engine read them
  (``-inf`` for the guess, ``inf`` for nobody in one run). They are written in one spelling
  like MIN.
* **a window's MIN over cells of its own query kept no spelling**: ``MIN(<cell value>) OVER
  ()`` in the aggregation's own SELECT (and MAX, MEDIAN, QUANTILE_DISC) was lifted by the
  rewrite into nodes without the analysis' types, so the spelling step skipped it; and
  ``MIN(x) OVER ()`` over a DOUBLE of a derived table was wrapped inside the window
  (``(MIN(x) + 0) OVER ()``, which DuckDB cannot bind), so every such query was refused. The
  window itself is now wrapped, with the type its value had in the analysis.
* **rows tied on -0.0 and 0.0 in a window's or a LIMIT's order**: ``ROW_NUMBER() OVER (ORDER
  BY x)`` with x -0.0 on SOME and 0.0 elsewhere numbered the tied rows in the engine's order,
  and an outer ``1 / x`` read which number each sign got: on the demo rows 12 and 14 swapped
  as the guess was right or not, in every run (noise-free, one query per guess); a LIMIT over
  such ties (and over a UNION ALL) kept the engine's choice. Such ties are now broken by the
  values' text (``CAST(x AS VARCHAR)``), a function of the value.
* **floating-point sums of NaNs of both signs**: ``SUM(x ORDER BY x)`` (red team s33c's
  order) ties NaN and -NaN, and the sum (AVG, STDDEV, VAR_POP) keeps the sign of the first it
  reads: STDDEV gave '-nan' or 'nan' as the guess was right or not. Their text orders them
  too.
* **the statuses of rows equal in every value**: the result was ordered by its values only,
  so rows such as (NULL published, NULL suppressed) came in the engine's order, and
  ``cursor.cell_status()`` listed their statuses in it (it varied from run to run). The hidden
  status and accuracy columns now break the result's ties too.
* **structs and lists were released as written**: ``(x, 1)`` and ``CAST('[' || CAST(x AS
  VARCHAR) || ']' AS DOUBLE[])`` came back with -0.0 and NaN signs inside, and MIN over them
  chose among equal ones. Released structs, lists and maps are written in one spelling
  throughout; MIN and the others over a type the guard cannot write in one spelling (a struct
  or a list, or a type sqlglot cannot tell) are refused.

Left open (strict xfail below, with red team s33c's GROUP BY/DISTINCT representatives): an
aggregate's DISTINCT (``SUM(DISTINCT x)``) keeps the first of NaNs of both signs it reads.

Tried and held (no test added): outer filters and projections over released keys that fail for
a hidden group's key (CAST to INTEGER/UUID/BIT/DATE, LN/SQRT/LOG of negatives, integer
overflow, ``//`` and ``%`` by 0): DuckDB does not push expressions that can throw below the
frame's filter, so they fail (or not) on released values only; COLLATE (refused); casts to
STRUCT (refused: COLUMNDEF), list literals ``[x]`` (refused: ARRAY); TIMETZ values of equal
instants (DuckDB holds them different); a MIN over DECIMAL or integers (one spelling).
"""

from __future__ import annotations

import math
import statistics
import struct

import pytest

import sqlsdc

RARE = "municipality = 'R08-M019' AND age = 66"  # one person of the demo (seed 7)
NOBODY = "municipality = 'R08-M019' AND age = 200"
SOME = "('R08-M003', 'R08-M005', 'R08-M008', 'R08-M011', 'R08-M013', 'R08-M018', 'R08-M021')"
_ZERO = "CAST(n AS DOUBLE) * 0"  # not a constant (DuckDB folds -0.0 and 0.0 into one)
_NAN = "(CAST(n AS DOUBLE) * 1e308 * 10 * 0)"  # inf * 0: NaN, not a constant either
# each is one sign on the municipalities of SOME and the other elsewhere: whatever the engine
# reads first, a chosen value of the two, written as it was read, differs
SIGNED = f"CASE WHEN k IN {SOME} THEN -({_ZERO}) ELSE {_ZERO} END"
UNSIGNED = f"CASE WHEN k IN {SOME} THEN {_ZERO} ELSE -({_ZERO}) END"
SIGNED_NAN = f"CASE WHEN k IN {SOME} THEN -{_NAN} ELSE {_NAN} END"
UNSIGNED_NAN = f"CASE WHEN k IN {SOME} THEN {_NAN} ELSE -{_NAN} END"


def _inner(condition: str) -> str:
    """The counts of region R08 by municipality, rows meeting ``condition`` counted in
    R08-M001 instead of their own municipality."""
    key = f"CASE WHEN {condition} THEN 'R08-M001' ELSE municipality END"
    return f"SELECT {key} AS k, COUNT(*) AS n FROM persons WHERE region = 'R08' GROUP BY k"


def _answer(con, condition: str, template: str) -> list:
    return con.execute(template.format(inner=_inner(condition))).fetchall()


@pytest.mark.parametrize(
    "template",
    [
        f"SELECT CAST(MIN({SIGNED_NAN}) AS VARCHAR), CAST(MIN({UNSIGNED_NAN}) AS VARCHAR) "
        "FROM ({inner}) t",
        f"SELECT CAST(MAX({SIGNED_NAN}) AS VARCHAR), CAST(MAX({UNSIGNED_NAN}) AS VARCHAR) "
        "FROM ({inner}) t",
        f"SELECT CAST(MEDIAN({SIGNED_NAN}) AS VARCHAR), CAST(MEDIAN({UNSIGNED_NAN}) AS VARCHAR) "
        "FROM ({inner}) t",
        f"SELECT k, CAST(FIRST_VALUE({SIGNED_NAN}) OVER (ORDER BY n >= 0) AS VARCHAR), "
        f"CAST(FIRST_VALUE({UNSIGNED_NAN}) OVER (ORDER BY n >= 0) AS VARCHAR) FROM ({{inner}}) t",
    ],
    ids=["min", "max", "median", "first_value"],
)
def test_nan_of_either_sign_is_chosen_in_one_spelling(ckm, template):
    """Before: ('nan', '-nan') or ('-nan', 'nan'), as the engine read a NaN of SOME first or
    not: one run gave 'nan' for MIN over SIGNED_NAN when the person was 66, '-nan' for nobody."""
    for condition in (RARE, NOBODY):
        for row in _answer(ckm, condition, template):
            assert set(row[-2:]) == {"nan"}


def test_released_nan_has_no_sign(ckm):
    """Before: the bits of the released NaNs were fff8... on SOME's rows and 7ff8... on the
    others, and so in rows the order ties (NaN = NaN) in the engine's order."""
    rows = _answer(ckm, NOBODY, f"SELECT k, {SIGNED_NAN} AS x FROM ({{inner}}) t")
    assert {struct.pack(">d", x).hex() for _, x in rows} == {"7ff8000000000000"}


@pytest.mark.parametrize(
    "template",
    [
        f"SELECT 1 / MEDIAN({SIGNED}), 1 / MEDIAN({UNSIGNED}) FROM ({{inner}}) t",
        f"SELECT 1 / QUANTILE_DISC({SIGNED}, 0.5), 1 / QUANTILE_DISC({UNSIGNED}, 0.5) "
        "FROM ({inner}) t",
        f"SELECT 1 / QUANTILE_CONT({SIGNED}, 0.5), 1 / QUANTILE_CONT({UNSIGNED}, 0.5) "
        "FROM ({inner}) t",
        f"SELECT 1 / MEDIAN(x), 1 / MEDIAN(y) FROM (SELECT {SIGNED} AS x, {UNSIGNED} AS y "
        "FROM ({inner}) t) u",
    ],
    ids=["median", "quantile_disc", "quantile_cont", "median_of_a_derived_table"],
)
def test_a_quantile_over_values_equal_to_sql_is_chosen_in_one_spelling(ckm, template):
    """Before: (-inf, inf) or (inf, -inf) as the engine read -0.0 or 0.0 at the median's rank:
    -inf for the guess and inf for nobody in one run."""
    for condition in (RARE, NOBODY):
        assert _answer(ckm, condition, template) == [(math.inf, math.inf)]


_CELL_SIGNED = (
    f"CASE WHEN municipality IN {SOME} THEN -(CAST(COUNT(*) AS DOUBLE) * 0) "
    "ELSE CAST(COUNT(*) AS DOUBLE) * 0 END"
)
_CELL_UNSIGNED = (
    f"CASE WHEN municipality IN {SOME} THEN CAST(COUNT(*) AS DOUBLE) * 0 "
    "ELSE -(CAST(COUNT(*) AS DOUBLE) * 0) END"
)


@pytest.mark.parametrize(
    "function",
    ["MIN({})", "MAX({})", "MEDIAN({})", "QUANTILE_DISC({}, 0.5)"],
    ids=["min", "max", "median", "quantile_disc"],
)
def test_a_window_over_its_own_cells_is_chosen_in_one_spelling(ckm, function):
    """Before: every row (inf, -inf): the window's value was the first the engine read."""
    signed, unsigned = function.format(_CELL_SIGNED), function.format(_CELL_UNSIGNED)
    rows = ckm.execute(
        f"SELECT municipality, 1 / {signed} OVER (), 1 / {unsigned} OVER () FROM persons "
        "WHERE region = 'R08' GROUP BY municipality"
    ).fetchall()
    assert {row[1:] for row in rows} == {(math.inf, math.inf)}


def test_a_window_min_over_released_doubles_is_answered(ckm):
    """Before: refused for every data ("DuckDB refuses the text of this statement"), the
    spelling written inside the window: ``(MIN(x) + 0) OVER ()``."""
    windows = "MIN(CAST(n AS DOUBLE)) OVER (), MAX(CAST(n AS DOUBLE)) OVER (ORDER BY k)"
    rows = _answer(ckm, NOBODY, f"SELECT k, {windows} FROM ({{inner}}) t")
    counts = dict(_answer(ckm, NOBODY, "SELECT k, n FROM ({inner}) t"))
    assert {row[1] for row in rows} == {float(min(counts.values()))}
    maxima = [row[2] for row in sorted(rows)]
    assert maxima == [
        float(max(n for k, n in counts.items() if k <= key)) for key in sorted(counts)
    ]


@pytest.mark.parametrize(
    "value",
    [
        f"({SIGNED}, 1)",
        f"({SIGNED_NAN}, k)",
        f"CAST('[' || CAST({SIGNED} AS VARCHAR) || ']' AS DOUBLE[])",
        f"CAST('[' || CAST({SIGNED_NAN} AS VARCHAR) || ']' AS DOUBLE[])",
    ],
    ids=["struct_zero", "struct_nan", "list_zero", "list_nan"],
)
def test_structs_and_lists_are_released_in_one_spelling(ckm, value):
    """Before: -0.0 on SOME's rows and 0.0 on the others (NaN's sign likewise), inside the
    struct or list; such rows tie in the released order (red team s33c's attack)."""
    rows = _answer(ckm, NOBODY, f"SELECT k, {value} AS x FROM ({{inner}}) t")

    def floats(x):
        if isinstance(x, dict):
            return [f for v in x.values() for f in floats(v)]
        if isinstance(x, list):
            return [f for v in x for f in floats(v)]
        return [x] if isinstance(x, float) else []

    assert {struct.pack(">d", f).hex() for _, x in rows for f in floats(x)} <= {
        "0000000000000000",
        "7ff8000000000000",
    }


@pytest.mark.parametrize(
    "value",
    [f"({SIGNED}, 1)", f"CAST('[' || CAST({SIGNED} AS VARCHAR) || ']' AS DOUBLE[])"],
    ids=["struct", "list"],
)
def test_min_over_a_struct_or_list_is_refused(ckm, value):
    """MIN picks the first of equal structs or lists, whose floats cannot be rewritten in one
    spelling in SQL alone: refused, for every data."""
    with pytest.raises(sqlsdc.PolicyViolation, match="returns one of the values it reads"):
        _answer(ckm, NOBODY, f"SELECT MIN({value}) FROM ({{inner}}) t")


def test_chosen_values_of_one_spelling_are_left_as_they_are(ckm):
    """Integers, decimals and strings have one spelling per value: MIN and MEDIAN of them
    are answered as before."""
    rows = _answer(ckm, NOBODY, "SELECT MIN(k), MAX(n), MIN(CAST(n AS DECIMAL(10, 2))), "
                                "MEDIAN(n), QUANTILE_DISC(n, 0.5) FROM ({inner}) t")  # fmt: skip
    counts = sorted(n for _, n in _answer(ckm, NOBODY, "SELECT k, n FROM ({inner}) t"))
    assert rows[0][0] == "R08-M001"
    assert rows[0][1] == counts[-1] and float(rows[0][2]) == counts[0]
    assert rows[0][3] == statistics.median(counts)
    assert rows[0][4] == counts[(len(counts) - 1) // 2]


@pytest.mark.parametrize(
    "template",
    [
        "SELECT rn, 1 / x FROM (SELECT x, ROW_NUMBER() OVER (ORDER BY x) AS rn "
        f"FROM (SELECT {SIGNED} AS x FROM ({{inner}}) t) u) v",
        f"SELECT rn, 1 / x FROM (SELECT {SIGNED} AS x, ROW_NUMBER() OVER (ORDER BY {SIGNED}) "
        "AS rn FROM ({inner}) t) v",
    ],
    ids=["derived", "same_scope"],
)
def test_a_window_numbers_values_equal_to_sql_by_their_spelling(ckm, template):
    """Before: the numbers of the -0.0 and 0.0 rows (tied in the window's ORDER BY x, x) were
    the engine's order: on the demo rows 12 and 14 swapped signs as the person's guessed age
    was right or not, in every run. Now -0.0 (text '-0.0') before 0.0."""
    for condition in (RARE, NOBODY):
        rows = sorted(_answer(ckm, condition, template))
        signs = [value for _, value in rows]
        assert signs == sorted(signs)  # every -inf (a -0.0) before every inf


@pytest.mark.parametrize(
    "template",
    [
        f"SELECT 1 / x FROM (SELECT {SIGNED} AS x FROM ({{inner}}) t ORDER BY x LIMIT 3) u",
        f"SELECT 1 / x FROM (SELECT {SIGNED} AS x FROM ({{inner}}) t ORDER BY x LIMIT 3 "
        "OFFSET 2) u",
        f"SELECT 1 / x FROM (SELECT {SIGNED} AS x FROM ({{inner}}) t UNION ALL SELECT 1.0 "
        "ORDER BY x LIMIT 3) u",
    ],
    ids=["limit", "offset", "union_all"],
)
def test_a_limit_keeps_values_equal_to_sql_by_their_spelling(ckm, template):
    """Before: which of the tied -0.0 and 0.0 rows a LIMIT kept was the engine's choice (the
    UNION ALL one gave (-inf, inf, inf) for the guess and three -inf for nobody in a run).
    Now the rows a LIMIT keeps are written in one spelling (0.0, rewrite.spelling)."""
    for condition in (RARE, NOBODY):
        assert _answer(ckm, condition, template) == [(math.inf,)] * 3


@pytest.mark.parametrize("function", ["SUM", "AVG", "STDDEV", "VAR_POP"])
def test_a_sum_of_nans_of_either_sign_does_not_read_the_engine_s_order(ckm, function):
    """``SUM(x ORDER BY x)`` ties NaN and -NaN, and the result keeps the sign of the NaN read
    first: STDDEV gave ('-nan', 'nan') for the guess and ('nan', '-nan') for nobody in a run.
    Now their text orders them too, so the answer is one function of the values."""
    template = (
        f"SELECT CAST({function}({SIGNED_NAN}) AS VARCHAR), "
        f"CAST({function}({UNSIGNED_NAN}) AS VARCHAR) FROM ({{inner}}) t"
    )
    answers = {tuple(_answer(ckm, condition, template)[0]) for condition in (RARE, NOBODY)}
    assert len(answers) == 1 and len(set(next(iter(answers)))) == 1


def test_the_status_of_rows_equal_in_every_value_comes_in_the_order_of_statuses(ckm):
    """Every row is (NULL, 0): NULLIF(x, x) is NULL, published where the average exists (the
    municipalities of SOME) and suppressed elsewhere. The result was ordered by the values
    only, so ``cell_status()`` listed the statuses of the tied rows in the engine's order,
    which varied from run to run ('ppppppssssssssssssssp', 'ppsssssspppppssssssss'): the
    order a hidden group moves (red team s33's attack) through the status. The hidden status
    columns now break the ties too."""
    average = f"AVG(CASE WHEN municipality IN {SOME} THEN income END)"
    for condition in (RARE, NOBODY):
        key = f"CASE WHEN {condition} THEN 'R08-M001' ELSE municipality END"
        cursor = ckm.cursor()
        cursor.execute(
            f"SELECT NULLIF({average}, {average}) AS v, COUNT(*) * 0 AS z FROM persons "
            f"WHERE region = 'R08' GROUP BY {key}"
        )
        assert set(cursor.fetchall()) == {(None, 0)}
        statuses = list(cursor.cell_status().iloc[:, 0])
        assert statuses == sorted(statuses) and len(set(statuses)) == 2


def test_a_distinct_aggregate_over_values_equal_to_sql_keeps_one_spelling(ckm):
    """SUM(DISTINCT) over SIGNED_NAN and over UNSIGNED_NAN (the same rows, signs swapped) gave
    ('-nan', 'nan') in every run: the representative of the one distinct NaN came from a
    municipality outside SOME, the first the engine read. Not shown to follow the person's
    guessed age on the demo, but the engine's order chooses it."""
    template = (
        f"SELECT CAST(SUM(DISTINCT {SIGNED_NAN}) AS VARCHAR), "
        f"CAST(SUM(DISTINCT {UNSIGNED_NAN}) AS VARCHAR) FROM ({{inner}}) t"
    )
    ((signed, unsigned),) = _answer(ckm, NOBODY, template)
    assert signed == unsigned == "nan"
