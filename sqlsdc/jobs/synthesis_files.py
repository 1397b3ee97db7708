"""Syntheses that may hold their source's counts exactly, checked as anonymised files are.

A synthesis drawn with replacement (``cart``'s default ``draw="random"`` and ``"bayes"``,
``parametric``'s model draws, the DP methods' noisy margins) reproduces no marginal or cell of
its source by construction: its counts carry the sampling noise of the draws, and a cell that
equals the original's does so by chance, unknown to its reader. ``cart`` with
``draw="balanced"`` (opt-in, :data:`EXACT_DRAWS`) takes each donor once per pass: with as many
records as originals its first variable's marginal is the original's, and so is a leaf's table
whenever its synthetic size equals its donors (red team s39c: ``SELECT sex, municipality, income
FROM persons`` gave all 350 municipality x sex cells, the 74 the live suppression pattern hides
among them). Drawn with replacement, a synthesis of more records in all than its source
(``rows``, ``copies``) averages its noise away: its counts over the factor converge to the
source's (red team s39d: 100 times the rows gave all 34 municipality totals under 10 persons),
so a non-DP synthesis larger than its source is such a file too, and so is one that, with the
non-DP syntheses of the same rows readers hold already (other names and seeds, versions
replaced or dropped since: :func:`earlier_draws`), draws more records in all than its source
(red team s42c: 100 syntheses of one source, each as large as it, average as one synthesis
100 times larger does). Which of its tables are exact
depends on the trees, so such a file counts as holding every column exactly (fail closed), as an
anonymised file with no perturbative step: it is refused when its cells give a cell of the
suppression pattern (:func:`sqlsdc.jobs.live_cells.refuse_live_file_cells`) or differ from an
exact table of its table by a few units
(:func:`sqlsdc.jobs.differencing.refuse_file_differences`), and, when its population is no WHERE
on one table, next to any exact table of a table it reads. Stored, it is one of the files a
policy switching suppression on and a later exact table of its table are checked against
(:func:`stored_exact_syntheses`, read by :mod:`sqlsdc.jobs.refusals`).
Every stored version counts, the replaced and dropped ones too (their readers keep them;
:mod:`sqlsdc.jobs.output_history`), and a synthesis whose population is no WHERE on one table
is refused next to a later exact table of a table it reads (:func:`opaque_syntheses`), as an
opaque anonymised file is (tests/jobs/test_synthesis_versions.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

import sqlglot
from sqlglot import exp

from sqlsdc.errors import SynthesisError
from sqlsdc.jobs.differencing import refuse_file_differences
from sqlsdc.jobs.exact_release import Release, kept
from sqlsdc.jobs.live_cells import refuse_live_file_cells
from sqlsdc.jobs.output_history import earlier_versions, stored_output_tables
from sqlsdc.jobs.record_files import file_release, opaque_refusal, opaque_tables, source_columns
from sqlsdc.jobs.session import OUTPUT_SCHEMA
from sqlsdc.jobs.stored_tables import exact_tables
from sqlsdc.policy import Policy

__all__ = [
    "DP_METHODS",
    "EXACT_DRAWS",
    "earlier_draws",
    "exact_synthesis",
    "opaque_syntheses",
    "refuse_exact_synthesis",
    "refuse_synthesis_size",
    "stored_exact_syntheses",
]

EXACT_DRAWS = ("balanced",)
"""``cart`` draws that may reproduce the source's counts exactly (:mod:`sqlsdc.synth.cart`)."""


DP_METHODS = ("dp-ipf", "dp-catall")
"""Methods that draw from noisy margins: however many records, their counts converge to those
margins, not to the source's (the DP methods of :mod:`sqlsdc.synth.job`)."""


def exact_synthesis(
    method: str,
    options: Mapping[str, object] | None,
    drawn: int | None = None,
    records: int | None = None,
) -> bool:
    """True when a synthesis by ``method`` with ``options`` may hold its source's counts
    exactly: ``cart`` with a draw of :data:`EXACT_DRAWS`, or a method fitted to the records
    themselves (not :data:`DP_METHODS`) drawing more records in all (``drawn``: rows times
    copies) than its source's ``records``. Red team s39d: cart with replacement of
    ``municipality, sex`` with 100 times the rows drew each municipality's count as 100·c ±
    10·sqrt(c), and count / 100 rounded was the true count of all 34 municipalities under 10
    persons, the 23 that the suppression pattern hides among them; copies average the same way.
    """
    if method == "cart" and (options or {}).get("draw") in EXACT_DRAWS:
        return True
    if method in DP_METHODS or drawn is None or records is None:
        return False
    return drawn > records


def earlier_draws(con, policy: Policy, source: str, columns: Sequence[str]) -> int:
    """The records that the non-DP syntheses readers hold drew from the rows of ``source`` (a
    table name or a SELECT) with a column that reads a column ``columns`` read: every stored
    one and every version replaced or dropped since, whatever its name, seed, spelling or
    column names, of the same rows or of rows that overlap them (in the data now). Their
    draws and the new one's average as one synthesis of all their records would: red team
    s42c, 100 syntheses of every person's municipality and sex under 100 names and seeds,
    each as large as its source, gave 30 of the 34 municipality totals under 10 persons as
    their mean, 21 of the 23 the suppression pattern hides (one synthesis: 9).

    Red team s43c: matched by the same rows and output names only, 100 syntheses of every
    person but one (``WHERE person_id <> k``, each its own population) averaged to all 34
    municipality totals under 10 persons, and ``municipality AS m`` was no municipality.
    A synthesis draws about ``records / rows`` records per row of its population
    (:func:`_overlapping_draws`), so the records counted are the most any row of ``source``
    was drawn by them, times its rows: for the same rows, their records in all. A source
    whose population is no WHERE on one table is not matched (:func:`opaque_syntheses`
    covers the exact ones).

    A source whose population is no WHERE on one table (a derived table, a CTE: red team
    s43c, ``SELECT p.municipality, p.sex FROM (SELECT * FROM persons) AS p`` twice and then
    ``SELECT municipality, sex FROM persons`` were three draws of one population, all stored)
    cannot be compared by rows: a synthesis of such a source and one of a table it reads,
    either way round, are counted as drawn from the same rows when a column of one may be a
    column of the other (:func:`_columns_read`), fail closed."""
    mine = file_release(con, policy, "", source, [], list(columns))
    reads = {mine[0].lower()} if mine is not None else _lower(opaque_tables(policy, source))
    wanted = _columns_read(con, source, columns, mine is None)
    covering, opaque = [], 0
    for report in _synthesis_reports(con):
        try:
            method, theirs, read = report["method"], report["source"], list(report["columns"])
            records = int(report["records"])
        except (KeyError, TypeError, ValueError):
            continue  # written by the job itself; unreadable only if edited by hand
        if method in DP_METHODS:
            continue
        found = file_release(con, policy, "", theirs, [], read)
        if not _same_columns(wanted, _columns_read(con, theirs, read, found is None)):
            continue
        if found is not None and mine is not None:
            if found[0].lower() == mine[0].lower():
                covering.append((found[1].where, records))
        elif reads & (
            {found[0].lower()} if found is not None else _lower(opaque_tables(policy, theirs))
        ):
            opaque += records  # rows that cannot be compared: the same rows (fail closed)
    if mine is None:
        return opaque
    return opaque + _overlapping_draws(con, mine[0], mine[1].where, covering)


def _lower(names) -> set[str]:
    """The table names in lower case (DuckDB's names are case-insensitive)."""
    return {n.lower() for n in names}


def _columns_read(con, source: str, columns: Sequence[str], opaque: bool) -> set[str] | None:
    """The table columns a synthesis's ``columns`` read (:func:`source_columns`); for a source
    whose population is no WHERE on one table, every column its query names (None, any
    column, when it selects a star, is no SELECT or does not parse)."""
    if not opaque:
        return source_columns(con, source, columns)
    try:
        tree = sqlglot.parse_one(source, read="duckdb") if source else None
    except sqlglot.errors.ParseError:
        return None
    if not isinstance(tree, exp.Select) or any(
        p.unalias().find(exp.Star) is not None for p in tree.expressions
    ):
        return None
    names = {c.name.lower() for c in tree.find_all(exp.Column) if c.name}
    return names | {c.lower() for c in columns}


def _same_columns(first: set[str] | None, second: set[str] | None) -> bool:
    """Whether two syntheses may hold a column of the table both (None: any column)."""
    return first is None or second is None or bool(first & second)


def _overlapping_draws(
    con, table: str, where: exp.Expr | None, covering: Sequence[tuple[exp.Expr | None, int]]
) -> int:
    """``covering``: ``(WHERE, records)`` of earlier syntheses of ``table``; the most records
    per row that they drew over any row ``where`` keeps (each ``records`` over its
    population's rows now, summed over those that keep the row), times the rows ``where``
    keeps: the records in all of one synthesis of ``where``'s rows as often drawn."""
    if not covering:
        return 0
    sizes = exp.select(
        _count_if(kept(where)),
        *(_count_if(kept(w)) for w, _records in covering),
    ).from_(table)
    mine, *theirs = con.execute(sizes.sql("duckdb")).fetchall()[0]
    rates = [(w, records / size) for (w, records), size in zip(covering, theirs, strict=True)
             if size]  # fmt: skip
    if not mine or not rates:
        return 0
    per_row: exp.Expr = exp.Literal.number(0)
    for w, rate in rates:
        term = exp.If(this=kept(w), true=exp.Literal.number(repr(rate)),
                      false=exp.Literal.number(0))  # fmt: skip
        per_row = exp.Add(this=per_row, expression=term)
    most = exp.select(exp.Max(this=per_row)).from_(table).where(kept(where))
    (rate,) = con.execute(most.sql("duckdb")).fetchall()[0]
    return math.ceil(float(rate or 0.0) * mine - 1e-6)


def _count_if(condition: exp.Expr) -> exp.Expr:
    """``SUM(CASE WHEN condition THEN 1 ELSE 0 END)``: the rows ``condition`` keeps."""
    return exp.Coalesce(
        this=exp.Sum(this=exp.If(this=condition, true=exp.Literal.number(1),
                                 false=exp.Literal.number(0))),
        expressions=[exp.Literal.number(0)],
    )  # fmt: skip


def _synthesis_reports(con) -> list[dict]:
    """The reports of every synthesis stored in ``protected`` and of every version replaced or
    dropped since (their readers keep them)."""
    texts = [report for _name, report in _stored_syntheses(con)]
    texts += [v.report for v in earlier_versions(con) if v.method == "synthesize" and v.report]
    found = []
    for text in texts:
        try:
            report = json.loads(text)
        except (TypeError, ValueError):
            continue
        if isinstance(report, dict):
            found.append(report)
    return found


def refuse_exact_synthesis(
    con, policy: Policy, into: str, source: str, columns: Sequence[str]
) -> None:
    """Refuse the synthesis of ``source`` (a table name or a SELECT) into ``columns``, to be
    stored as ``protected.<into>``, taken as exact in each of them (module docstring), when it
    gives a cell of the live suppression pattern or differs from an exact table of its table
    by a few units in a cell."""
    label = (f"the synthesis {OUTPUT_SCHEMA}.{into} (exact counts: balanced draws, or more "
             "records than its source, with the syntheses of its rows stored before "
             "it)")  # fmt: skip
    found = file_release(con, policy, label, source, [], list(columns))
    if found is not None:  # no step, nothing blanked: its cells are counted on the source
        table, release = found
        tables = exact_tables(con, policy, table, rounded_counts=True)
        refuse_file_differences(con, policy, release, tables)
        refuse_live_file_cells(con, policy, table, release, SynthesisError)
    for table in opaque_tables(policy, source):
        if others := exact_tables(con, policy, table, rounded_counts=True):
            raise SynthesisError(opaque_refusal(label, table, others[0][0]))


def refuse_synthesis_size(con, policy: Policy, into: str, source: str, records: int) -> None:
    """Refuse a synthesis that draws as many records as its source (no ``--rows``: cart's and
    parametric's default) when those ``records`` are not every row of a table it reads that
    the policy protects, whatever the method: its size would be its population's exact count.

    Red team s43l: a synthesis drawn with replacement is checked as no file (only exact ones
    are, :func:`refuse_exact_synthesis`), and ``SELECT sex FROM persons WHERE municipality =
    m``, one job per municipality, told all 23 municipality counts the live pattern hides (1-9
    persons) by its number of records; ``WHERE municipality <> m`` tells one by the published
    grand total. A synthesis of every row tells the table's size, the pattern's grand total.
    Fail closed: no cell of the pattern is compared (a population's complement gives one as
    well); the admin gives the size instead (``--rows``, a number not read from the data).
    Red team s44c: the rule held for suppression policies only; under threshold protection,
    where the guard hides a municipality's count of 1 or 2, one cart job per municipality told
    4 of 4 such counts exactly (under the cell key method, a count it perturbs)."""
    found = file_release(con, policy, "", source, [], [])
    tables = [found[0]] if found is not None else opaque_tables(policy, source)
    for table in tables:
        declared = policy.table(table)
        if declared is None:
            continue
        total = exp.select(exp.Count(this=exp.Star())).from_(exp.to_table(table))
        (rows,) = con.execute(total.sql("duckdb")).fetchone()
        if rows != records:
            how = "" if declared.suppression is None else " by suppression"
            raise SynthesisError(
                f"{table} is protected{how} in the policy, and the synthesis "
                f"{OUTPUT_SCHEMA}.{into} "
                "would draw as many records as its source, which is not "
                f"every row of {table}: its size would be that population's exact count, which "
                "the protection may hide or perturb. Give its number of records (--rows N, a "
                "number not read "
                f"from the data), or synthesise every row of {table}"
            )


def stored_exact_syntheses(con, policy: Policy, table: str) -> list[Release]:
    """The syntheses that may hold ``table``'s counts exactly (:func:`_exact_syntheses`: those
    stored in ``protected`` and every earlier version of one, replaced or dropped since), each
    as an anonymised file with every column exact, for the checks of a policy that switches
    suppression on (a pattern next to the files stored) and of exact tables stored after them.
    Syntheses drawn with replacement have no exact column and are not listed."""
    found = []
    for label, source, columns in _exact_syntheses(con):
        if source is None:
            continue  # opaque_syntheses
        release = file_release(con, policy, label, source, [], columns)
        if release is not None and release[0].lower() == table.lower():
            found.append(release[1])
    return found


def opaque_syntheses(con, policy: Policy, table: str) -> list[str]:
    """The labels of the syntheses of :func:`_exact_syntheses` that read ``table`` by a query
    whose population is no WHERE on one table (:func:`~sqlsdc.jobs.record_files.opaque_tables`),
    or whose definition is unknown: the check cannot compare them, so an exact table of
    ``table`` next to one is refused, as next to an opaque anonymised file."""
    found = []
    for label, source, _columns in _exact_syntheses(con):
        read = [t.lower() for t in opaque_tables(policy, source)]
        if table.lower() in read:
            found.append(label)
    return found


def _exact_syntheses(con) -> list[tuple[str, str | None, list[str]]]:
    """``(label, source, columns)`` of every synthesis that may hold its source's counts
    exactly: its report marks ``exact_columns`` (balanced draws, more records than its
    source), or it is ``cart`` with a draw of :data:`EXACT_DRAWS` (syntheses from before s39c,
    whose default was balanced, among them); the ones stored in ``protected`` (labelled by
    name), then every earlier version (:func:`~sqlsdc.jobs.output_history.earlier_versions`:
    their readers keep them; labelled as the job that stored them). A version stored before
    the catalog kept reports counts when its request asked for balanced draws, copies or rows
    (fail closed), with ``source`` None: its columns are unknown."""
    found = []
    for name, report in _stored_syntheses(con):
        if (exact := _exact_report(report)) is not None:
            found.append((name, *exact))
    for version in earlier_versions(con):
        if version.method != "synthesize":
            continue
        if version.report is not None:
            if (exact := _exact_report(version.report)) is not None:
                found.append((version.label, *exact))
        elif _exact_request(version.sql):
            found.append((f"{version.label} (before the catalog kept output versions: its "
                          "columns are unknown)", None, []))  # fmt: skip
    return found


def _stored_syntheses(con) -> list[tuple[str, str]]:
    """``(name, report)`` of every synthesis whose table is stored in ``protected``, by name."""
    stored = stored_output_tables(con)
    rows = con.execute(
        "SELECT name, report FROM sqlsdc.outputs WHERE method = 'synthesize' ORDER BY name"
    ).fetchall()
    return [(name, report) for name, report in rows if name.lower() in stored]


def _exact_report(report: str) -> tuple[str, list[str]] | None:
    """``(source, columns)`` of a synthesis whose stored report says it may hold its source's
    counts exactly, else None."""
    try:
        report = json.loads(report)
        draw = report.get("details", {}).get("draw")
        marked = bool(report.get("details", {}).get("exact_columns"))
        source, columns = report["source"], list(report["columns"])
    except (ValueError, AttributeError, TypeError, KeyError):
        return None  # written by the job itself; unreadable only if edited by hand
    if not marked and not exact_synthesis(report.get("method"), {"draw": draw}):
        return None
    return source, columns


def _exact_request(request: str) -> bool:
    """Whether a synthesis's audited request may have drawn its source's counts exactly
    (balanced draws, or a non-DP method with copies or rows): unreadable, yes."""
    try:
        asked = json.loads(request)
        options = asked.get("options") or {}
        if exact_synthesis(asked.get("method"), options):
            return True
        more = int(asked.get("copies") or 1) > 1 or asked.get("rows") is not None
        return asked.get("method") not in DP_METHODS and more
    except (ValueError, AttributeError, TypeError):
        return True
