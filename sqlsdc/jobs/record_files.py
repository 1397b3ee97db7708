"""An anonymised file as the exact tables it implies, for the differencing check.

A file of records releases, as exact counts, every cross-tabulation over its population of its
columns that no perturbative step changed (:func:`sqlsdc.microdata.steps.exact_columns`; a
step that changed so few records that a reader is sure of the cells changed none of them:
:mod:`sqlsdc.microdata.negligible`), a recoded column by its bands, a top-coded one by its
clipped values. :func:`file_release` writes
that down as a :class:`~sqlsdc.jobs.exact_release.Release` of the file's source table: its
population as the WHERE of its query, its exact columns as expressions on the table's columns
(``recode:age:breaks=65/75/85`` is ``CASE WHEN age < 65 THEN '<65' ... END``), so that
:mod:`sqlsdc.jobs.differencing` compares its cells with those of exact tables of the table.
:func:`stored_files` does so for every anonymised file already stored.

A file's cells are those of every exact column that reads a dimension of the table, under
whatever name its query gives it (red team s38b: ``education AS e``; a file's (R01, education)
sums next to a job by region over one education). A file read by a query of another shape (a
derived table, a CTE, a join, a union, a GROUP BY, a LIMIT, the table read again in a
subquery, a column computed by a window, an aggregate or a subquery) is a population or a
column that cannot be written on the table's rows: it cannot be compared, so such a file and
an exact table of a table it reads are refused together, whichever comes second
(:func:`opaque_tables`, :func:`opaque_files`; red teams s38b and s38e: ``FROM (SELECT * FROM
persons) AS p WHERE age >= 85``, or the same people as a CTE, a join with a public table or a
union, kept a file out of the check).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import sqlglot
from sqlglot import exp

from sqlsdc.jobs.exact_release import Release
from sqlsdc.jobs.output_history import blanks, earlier_versions
from sqlsdc.jobs.session import OUTPUT_SCHEMA
from sqlsdc.microdata.negligible import perturbed_columns
from sqlsdc.microdata.steps import NON_PERTURBATIVE, Step, exact_columns, parse_step
from sqlsdc.policy import ColumnRole, Policy


def stored_files(con, policy: Policy, table: str) -> list[Release]:
    """The anonymised files of ``table`` stored in ``protected``, labelled by their names, and
    every earlier version of one (:func:`all_files`) that differs from them
    (:func:`distinct`)."""
    return distinct(
        [release for name, release in all_files(con, policy) if name.lower() == table.lower()]
    )


def distinct(releases: Sequence[Release]) -> list[Release]:
    """``releases`` less those that give the same exact tables as one before them: the same
    population, cuts and held columns, nothing blanked (whose records may differ). A file
    replaced by the same definition (another seed, a perturbative step changed) adds no exact
    table, and a copy would only make a signed sum of the copies look like a new table."""
    found, seen = [], set()
    for release in releases:
        if not release.blanked:
            key = _definition(release)
            if key in seen:
                continue
            seen.add(key)
        found.append(release)
    return found


def _definition(release: Release) -> tuple:
    where = None if release.where is None else release.where.sql("duckdb")
    exact = tuple((n.lower(), e.sql("duckdb")) for n, e in release.exact or ())
    return where, release.dims, exact, release.held


def all_files(con, policy: Policy) -> list[tuple[str, Release]]:
    """``(table, file)`` of every anonymised file stored in ``protected`` whose population is
    a WHERE on a confidential table of ``policy``, labelled by its name; and of every earlier
    version of one, replaced or dropped since, labelled as the job that stored it
    (:mod:`sqlsdc.jobs.output_history`: its readers keep it)."""
    found = []
    for name, source, log, columns, records, _released in _stored(con):
        if log is None:  # unreadable: refused beside exact tables (opaque_files)
            continue
        release = file_release(con, policy, name, source, log, columns, records)
        if release is not None:
            found.append(release)
    return found


def opaque_files(con, policy: Policy, table: str) -> list[str]:
    """The names of the anonymised files stored that read ``table`` by a query whose
    population is no WHERE on one table (:func:`opaque_tables`): files the check cannot
    compare, so that an exact table of ``table`` next to them is refused. A file whose
    request or step log cannot be read counts as one (fail closed)."""
    return [name for name, source, log, *_file in _stored(con) if log is None
            or table.lower() in {t.lower() for t in opaque_tables(policy, source)}]  # fmt: skip


def reaching_readers(con, listed: Iterable[str] | None) -> set[str]:
    """The labels (lower case) of the stored files, and earlier versions of files, that
    readers hold with the files ``listed`` (names as listed under ``releases:``, no schema):
    the stored files named in ``listed`` (every one when None), and every earlier version that
    reached readers while it was current (:attr:`sqlsdc.jobs.output_history.Version.released`:
    released for good, whatever the policy lists now). An earlier version never released is
    held by nobody: candidates replaced while an admin chose a setting are no release."""
    named = None if listed is None else {f"{OUTPUT_SCHEMA}.{n}".lower() for n in listed}
    found = set()
    for label, *_file, released in _stored(con):
        if released or (released is None and (named is None or label.lower() in named)):
            found.add(label.lower())
    return found


def opaque_tables(policy: Policy, source: str | None) -> list[str]:
    """The confidential tables of ``policy`` that a file's ``source`` reads when its population
    cannot be written as a WHERE on one table (a derived table, a CTE, a join, a union: red
    team s38e, the same people as ``SELECT * FROM persons WHERE age >= 85`` written as a
    subquery escaped the check), or a column no function of its row; none when it can
    (:func:`_population`). A source that does not parse reads them all (fail closed)."""
    if _population(source) is not None:
        return []
    try:
        tree = sqlglot.parse_one(source, read="duckdb") if source else None
    except sqlglot.errors.ParseError:
        tree = None
    if tree is None:
        return [t.name for t in policy.confidential_tables]
    read = {t.name.lower() for t in tree.find_all(exp.Table)}
    if isinstance(tree, exp.Column):  # --from schema.table
        read.add(tree.name.lower())
    return [t.name for t in policy.confidential_tables if t.name.lower() in read]


def opaque_refusal(file: str, table: str, other: str) -> str:
    """The message refusing ``file`` (an opaque file of ``table``) next to ``other``."""
    return (
        f"{file} reads {table} by a query whose population is no WHERE on {table} (a derived "
        "table, a CTE, a join, a union, a grouping, a LIMIT) or whose columns are no functions "
        f"of their row, so the differencing check cannot compare its exact tables with "
        f"{other}, an exact table of {table}: the two could differ by a few units in a cell. "
        f"Write the file's query as SELECT columns FROM {table} WHERE condition, its columns "
        "functions of their row"
    )


def _stored(con):
    """``(name, source, step log, stored columns, its records, released)`` of every
    anonymised file stored in ``protected`` (``released`` None), then of every earlier
    version of one (:func:`_earlier`); source and log None when its request or report cannot
    be read."""
    stored = {
        f"{schema}.{name}".lower(): name
        for schema, name in con.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() WHERE schema_name = ?",
            [OUTPUT_SCHEMA],
        ).fetchall()
    }
    for name, request, report in con.execute(
        "SELECT name, sql_text, report FROM sqlsdc.outputs WHERE method = 'anonymize' ORDER BY name"
    ).fetchall():
        if name.lower() not in stored:
            continue
        try:
            source = json.loads(request).get("from")
            log = json.loads(report)["steps"]
        except (ValueError, AttributeError, TypeError, KeyError):
            source, log = None, None  # unreadable: opaque (opaque_files), never compared
        columns = [
            c
            for (c,) in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE schema_name = ? AND table_name = ?",
                [OUTPUT_SCHEMA, stored[name.lower()]],
            ).fetchall()
        ]
        records = exp.table_(stored[name.lower()], db=OUTPUT_SCHEMA, quoted=True)
        yield name, source, log, columns, records, None
    yield from _earlier(con)


def _earlier(con):
    """:func:`_stored`'s tuple for each earlier version of an anonymised file, as it was
    stored: its request's source, its report's step log and columns, its kept records. A
    version with no report (stored before the catalog kept versions), or whose local
    suppression blanked values whose records were not kept (its table dropped, not
    replaced), has no log: opaque, never compared (fail closed)."""
    for version in earlier_versions(con):
        if version.method != "anonymize":
            continue
        try:
            source = json.loads(version.sql).get("from")
            report = json.loads(version.report)
            log, columns = report["steps"], list(report["columns"])
            if version.records is None and blanks(log):
                log = None
        except (ValueError, AttributeError, TypeError, KeyError):
            source, log, columns = None, None, []
        label = version.label
        if version.report is None:
            label += " (before the catalog kept output versions: its columns are unknown)"
        yield label, source, log, columns, version.records, version.released


def file_release(
    con, policy: Policy, label: str, source: str | None, log: Sequence[dict],
    columns: Sequence[str], records: exp.Table | None = None,
) -> tuple[str, Release] | None:  # fmt: skip
    """``(table, release)``: the file made from ``source`` (a table name or a SELECT, as the
    job was given it) by the steps of ``log`` (one record per step, as the job logs and
    reports them) with ``columns`` stored (its records: ``records``), as a release of its
    source table; None when its population is no WHERE on a confidential table of
    ``policy`` (:func:`opaque_tables` says which tables such a query reads).

    Its cuts are its exact columns that read a dimension of the table, whatever else they
    read and whatever they are named, or are recoded (a table is cut by dimensions; an
    unbanded measure or weight would cut cells of one record, at the cost of a grouping set
    per combination); a column that a local suppression blanked in some record (the step's
    ``suppressed`` count) tells nobody which records a table counts."""
    read = _population(source)
    if read is None:
        return None
    name, where, projections = read
    declared = policy.table(name)
    if declared is None or declared.is_public:
        return None
    rows = _row_count(con, log, records)
    steps = [_over_perturbed_columns(parse_step(record["step"]), record, rows) for record in log]
    suppressed = {column for record in log if record["step"].startswith("suppress:")
                  for column, count in record.get("suppressed", {}).items() if count}  # fmt: skip
    expressions = _projections(con, name, projections)
    dimensions = {c.name.lower() for c in declared.columns.values()
                  if c.role is ColumnRole.DIMENSION}  # fmt: skip
    cuts, held, blanked, sums, links = [], set(), set(), [], []
    exact = exact_columns(steps, columns)
    drawn = {c.name.lower() for column in columns if column not in exact
             for c in _read(expressions.get(column.lower()))}  # fmt: skip
    for column, recipe in exact.items():
        base = expressions.get(column.lower())
        if base is None:
            continue
        reads = {c.name.lower() for c in base.find_all(exp.Column)}
        held |= reads if len(reads) == 1 else set()
        if len(reads) == 1:
            sums.append((column, _coarsened(base, recipe)))
        if reads:
            links.append((column, _coarsened(base, recipe)))
        if column in suppressed:
            blanked |= reads
        if reads & dimensions or (reads and any(s.method == "recode" for s in recipe)):
            cuts.append((column, _coarsened(base, recipe)))
    totals = set()
    for column in kept_totals(steps, columns, exact):
        reads = {c.name.lower() for c in _read(expressions.get(column.lower()))}
        totals |= reads if len(reads) == 1 else set()
    grouped = {c.name.lower() for column in columns if column not in exact
               and any(column in s.columns for s in steps if s.method == "microaggregate")
               for c in _read(expressions.get(column.lower()))}  # fmt: skip
    plain = tuple(e.name.lower() for _c, e in cuts if isinstance(e, exp.Column))
    release = Release(label, where, plain, tuple(cuts), frozenset(held), frozenset(blanked),
                      records, frozenset(drawn), tuple(sums), frozenset(totals),
                      tuple(links), frozenset(grouped))  # fmt: skip
    return declared.name, release


def source_columns(con, source: str | None, columns: Sequence[str]) -> set[str]:
    """The columns of its table (lower case) that a file's ``columns`` read, whatever they
    are named (``municipality AS m`` reads ``municipality``); empty when its population is
    no WHERE on one table (:func:`_population`)."""
    read = _population(source)
    if read is None:
        return set()
    name, _where, projections = read
    expressions = _projections(con, name, projections)
    return {c.name.lower() for column in columns for c in _read(expressions.get(column.lower()))}


def _read(expression: exp.Expr | None) -> list[exp.Column]:
    """The columns of the table ``expression`` (a file column's projection) reads."""
    return [] if expression is None else list(expression.find_all(exp.Column))


TOTAL_KEEPING = frozenset({"microaggregate", "noise", "rankswap", "shuffle"})


def kept_totals(steps: Sequence[Step], columns: Sequence[str], exact) -> list[str]:
    """The columns a perturbative step changed whose total over the file is still exact: every
    step on them keeps it (microaggregation's group means add up to the groups' sums; the
    exact-moment noise is centred; shuffling permutes the values, and so does rank swapping,
    its top and bottom shares coded to their means). The file gives that total as an exact
    table of one cell would, so next to an exact sum job of a population a few units apart
    the difference is those units' sum (red team s47i: a file of R02's enterprises, turnover
    microaggregated k = 5, beside a suppression job of R02 without activity I: the file's
    total less the job's cell was I's 163,828,280, a group p:10 flags).
    :func:`sqlsdc.jobs.exact_release.total_releases` is that table."""
    changed = [c for c in columns if c not in exact]
    return [c for c in changed
            if all(s.method in TOTAL_KEEPING for s in steps if c in s.columns)
            and any(c in s.columns for s in steps)]  # fmt: skip


def _over_perturbed_columns(step: Step, record: dict, rows: int | None) -> Step:
    """``step`` over the columns it changed enough to count as perturbed
    (:func:`sqlsdc.microdata.negligible.perturbed_columns`); the others are left as they
    were, exact. ``rows``: the file's records, the denominator of a PRAM logged before its
    log kept the values it could change (None: unknown). Red team s39c:
    ``pram:sex:p=0.999999`` and ``pram:municipality:p=0.999999`` changed no record of 20,000,
    and at ``p=0.9999`` one each; the file, taken as perturbed in both, was stored beside the
    suppression pattern of geography x sex with 346 of 350 cells exact, the 74 hidden ones
    among them."""
    if step.method in NON_PERTURBATIVE:
        return step
    kept = perturbed_columns(step.method, step.columns, record, rows)
    return Step(step.method, kept, step.params)


def _row_count(con, log: Sequence[dict], records: exp.Table | None) -> int | None:
    """The number of the file's ``records`` when a PRAM step of ``log`` predates the count
    of values in its log (None otherwise, or when the records are not kept)."""
    older = any(isinstance(details, dict) and "changed" in details and "values" not in details
                for record in log for details in record.values())  # fmt: skip
    if not older or records is None:
        return None
    sql = exp.select(exp.Count(this=exp.Star())).from_(records.copy()).sql("duckdb")
    return int(con.execute(sql).fetchone()[0])


def _population(source: str | None):
    """``(table, WHERE or None, projections)`` of a file's source, or None for another shape:
    one SELECT of one table (unqualified, no column aliases), read nowhere else, each of its
    rows once (no join, grouping, DISTINCT, LIMIT, sample, window filter or set operation),
    the columns functions of their row (:func:`_row_projections`), and no subquery that reads
    the table's own columns by its name (a correlated one: :func:`_unqualified` could not
    keep its meaning)."""
    try:
        tree = sqlglot.parse_one(source, read="duckdb") if source else None
    except sqlglot.errors.ParseError:
        return None
    if isinstance(tree, exp.Column) and not tree.table:  # --from TABLE: every row and column
        return tree.name, None, [exp.Star()]
    if not isinstance(tree, exp.Select):
        return None
    table = tree.args.get("from_") and tree.args["from_"].this
    if not isinstance(table, exp.Table) or any(
        value for key, value in table.args.items() if key not in ("this", "alias")
    ):
        return None
    alias = table.args.get("alias")
    if alias is not None and alias.args.get("columns"):
        return None
    shapes = ("joins", "group", "having", "distinct", "limit", "offset", "qualify", "with_",
              "laterals", "sample", "pivots")  # fmt: skip
    if any(tree.args.get(a) for a in shapes):
        return None
    if sum(t.name.lower() == table.name.lower() for t in tree.find_all(exp.Table)) != 1:
        return None
    own = {table.name.lower(), table.alias_or_name.lower()}
    for query in tree.find_all(exp.Subquery, exp.Query):
        if query is not tree and any(c.table.lower() in own for c in query.find_all(exp.Column)):
            return None
    projections = _row_projections(tree.expressions, own)
    if projections is None:
        return None
    where = tree.args.get("where")
    return table.name, where and _unqualified(where.this, own), projections


def _row_projections(projections: list, own: set[str]) -> list | None:
    """The projections unqualified, a star of the table (``*``, ``p.*``, ``* EXCLUDE (...)``)
    as a plain ``*``; None when one is no function of its row (a window, an aggregate, a
    subquery) or a star that renames or replaces columns."""
    found = []
    for projection in projections:
        expression = projection.unalias()
        star = expression if isinstance(expression, exp.Star) else None
        if isinstance(expression, exp.Column) and isinstance(expression.this, exp.Star):
            if expression.table.lower() not in own:
                return None
            star = expression.this
        if star is not None:
            if star.args.get("replace") or star.args.get("rename"):
                return None
            found.append(exp.Star())
            continue
        if expression.find(exp.AggFunc, exp.Window, exp.Query, exp.Subquery, exp.Star):
            return None
        found.append(_unqualified(projection, own))
    return found


def _projections(con, table: str, projections: list) -> dict[str, exp.Expr]:
    """Output name (lower case) -> expression on the table's columns (a ``*`` is every
    column of the table); the projections are functions of their row (:func:`_population`)."""
    found: dict[str, exp.Expr] = {}
    for projection in projections:
        if isinstance(projection, exp.Star):
            for (column,) in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE schema_name = 'main' AND "
                "lower(table_name) = ? ORDER BY column_index",
                [table.lower()],
            ).fetchall():
                found[column.lower()] = exp.column(column)
            continue
        found[projection.alias_or_name.lower()] = projection.unalias().copy()
    return found


def _unqualified(expression: exp.Expr, own: set[str]) -> exp.Expr:
    """``expression`` with the columns of the file's table named as the table's (``p.age`` of
    ``FROM persons p`` is ``age``: the check reads the table without an alias); a column of
    another table (in a subquery) keeps its qualifier."""
    copy = expression.copy()
    for column in copy.find_all(exp.Column):
        if column.table and column.table.lower() in own:
            column.set("table", None)
    return copy


def _coarsened(expression: exp.Expr, recipe: Sequence[Step]) -> exp.Expr:
    """``expression`` as the file holds it after the non-perturbative ``recipe``: recoded to
    the labels of :func:`sqlsdc.microdata.perturb.recode`, clipped as
    :func:`~sqlsdc.microdata.perturb.top_code` clips; a local suppression counts a value as
    it was (the lead's decision: erring on the side of more cells), and the cells its blanked
    values leave short are compared on the file's records
    (:func:`sqlsdc.jobs.blanked_cells.blanked_difference`)."""
    for step in recipe:
        if step.method == "recode":
            expression = _bands(
                expression, sorted(float(v) for v in step.params["breaks"].split("/"))
            )
        elif step.method == "topcode":
            expression = _clipped(expression, step.params)
    return expression


def _bands(x: exp.Expr, breaks: list[float]) -> exp.Expr:
    case = exp.Case().when(exp.Is(this=x.copy(), expression=exp.null()), exp.null())
    case = case.when(exp.LT(this=x.copy(), expression=_number(breaks[0])),
                     exp.Literal.string(f"<{breaks[0]:g}"))  # fmt: skip
    for lo, hi in zip(breaks, breaks[1:], strict=False):
        case = case.when(exp.LT(this=x.copy(), expression=_number(hi)),
                         exp.Literal.string(f"{lo:g}-{hi:g}"))  # fmt: skip
    return exp.paren(case.else_(exp.Literal.string(f">={breaks[-1]:g}")))


def _clipped(x: exp.Expr, params: dict[str, str]) -> exp.Expr:
    case = exp.Case()
    if "upper" in params:
        upper = _number(float(params["upper"]))
        case = case.when(exp.GT(this=x.copy(), expression=upper), upper.copy())
    if "lower" in params:
        lower = _number(float(params["lower"]))
        case = case.when(exp.LT(this=x.copy(), expression=lower), lower.copy())
    return exp.paren(case.else_(x.copy())) if case.args.get("ifs") else x


def _number(value: float) -> exp.Expr:
    return exp.Literal.number(repr(float(value)))
