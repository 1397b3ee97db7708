"""Two anonymised files of one table that readers hold together, compared with each other.

Two anonymised files of one table whose populations differ by a few units in a cell give
those units away: after the README's seniors file (R01 aged 65+, age banded 65/75/85), a file
of everyone aged 84+ banded at 84 gives the one person aged 84 of a cell (red team s38e). A
file reaches readers only when released: listed under the policy's ``releases:`` (the guard
shows it as a table, ``sqlsdc publish`` copies it) or named with ``publish --include``. The
candidates an admin stores to choose a setting (``r01_k3``, ``r01_k5``, ``r01_k10`` of the
same records) differ by little and are compared by ``sqlsdc microdata-report``; they are
compared with each other only once two of them are released together.

:func:`refuse_file_pairs` is the one comparison, made where a file becomes released: when a
file is stored (:mod:`sqlsdc.jobs.anonymize`: with the files the policy releases, and with
every stored file when it is itself listed), when a policy is applied
(:func:`refuse_listed_files`, from :func:`sqlsdc.catalog.setup.apply_policy`), and when a
publication is written (:mod:`sqlsdc.release`: the files it holds). Each file's counts by its
columns kept as they are (its population) are compared with the other's cells and cuts, both
ways (:func:`sqlsdc.jobs.differencing.refuse_file_differences`, its blanked cells too); a cut
of one next to a cut of the other is not (see :mod:`sqlsdc.jobs.differencing`). Each file is
also summed with the others and the exact tables of its table (:func:`_refuse_signed_sums`):
pairwise checks miss a signed sum of several (red team s38f: two jobs and two files over
s38b's four populations, whose T1 - T2 + T3 - T4 is one person's income).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import chain, combinations, product

from sqlglot import exp

from sqlsdc.errors import Error, MicrodataError, PolicyError
from sqlsdc.jobs.differencing import min_frequency, refuse_file_differences
from sqlsdc.jobs.exact_release import Release
from sqlsdc.jobs.isolated_groups import refuse_isolated_groups
from sqlsdc.jobs.linked_files import derived_pairs, link_columns, linked_records
from sqlsdc.jobs.record_files import (
    all_files,
    distinct,
    opaque_files,
    reaching_readers,
)
from sqlsdc.jobs.session import OUTPUT_SCHEMA
from sqlsdc.jobs.stored_tables import exact_tables, share_rows
from sqlsdc.jobs.tabulation import JobSpec
from sqlsdc.policy import Policy

File = tuple[str, Release]  # (its source table, the file as a release of it)


def refuse_file_pairs(
    con,
    policy: Policy,
    files: Sequence[File],
    new: File | None = None,
    refusal: Callable[[str, str, str], Error] | None = None,
    held: Sequence[File] = (),
) -> None:
    """Refuse when two anonymised files of one table differ by a few units in a cell: every
    pair of ``files``, or with ``new`` that file against each of ``files``; or when one of
    them (``new``) with the others of its table and the exact tables isolates a group by a
    signed sum. ``held`` are earlier versions of files that readers keep (:func:`held_files`),
    compared with each of ``files`` (or ``new``), never with each other: released already.
    ``refusal(first, second, reason)`` makes the error raised (default: the check's own
    :class:`~sqlsdc.errors.MicrodataError`)."""

    def kept(table: str, file: Release) -> bool:  # the held copies of a file count once
        same = [f for t, f in [*files, *held] if t.lower() == table.lower()]
        return any(file is d for d in distinct(same))

    held = [(table, file) for table, file in held if kept(table, file)]
    pairs: Iterable[tuple[File, File]] = (
        chain(combinations(files, 2), product(files, held))
        if new is None
        else ((new, other) for other in [*files, *held])
    )
    for (table, mine), (theirs_table, theirs) in pairs:
        if table.lower() != theirs_table.lower():
            continue
        try:
            _refuse_two_draws(con, table, mine, theirs)
            _refuse_rebuilt_groups(con, table, mine, theirs)
            _refuse_linked_records(con, policy, table, mine, theirs)
            _compare(con, policy, table, mine, theirs)
        except MicrodataError as found:
            if refusal is None:
                raise
            raise refusal(mine.label, theirs.label, str(found)) from None
    for table, mine in [new] if new is not None else files:
        others = [f for t, f in [*files, *held] if t.lower() == table.lower() and f is not mine]
        if not others:
            continue
        try:
            _refuse_signed_sums(con, policy, table, mine, others)
        except MicrodataError as found:
            if refusal is None:
                raise
            raise refusal(mine.label, ", ".join(o.label for o in others), str(found)) from None


def _refuse_two_draws(con, table: str, mine: Release, theirs: Release) -> None:
    """Refuse two files of the same rows of ``table`` that both hold a column a perturbative
    step drew (:attr:`~sqlsdc.jobs.exact_release.Release.drawn`): each file's seed draws it
    anew, and readers of both average the draws, as they average syntheses (red team s42c:
    the PRAM-corrected mean of 30 files of R01's municipality at p=0.8 gave 8 of 25 counts
    exactly, 3 of the 8 under 10 persons, of 200 files 20 and all 8; one file, 3 and none).
    Files of overlapping rows are refused alike: red team s43c, 30 files of R01's persons
    but one each (``AND person_id <> k``), each its own population, averaged as 30 files of
    the same rows do. Files of disjoint rows are compared by their exact columns only
    (:func:`_compare`)."""
    both = mine.drawn & theirs.drawn
    if both and share_rows(con, table, mine.where, theirs.where):
        raise MicrodataError(
            f"both hold {', '.join(sorted(both))} of rows of {table} they share as drawn by a "
            "perturbative step (PRAM, noise, swapping, microaggregation), each file by its own "
            "seed: readers of both average the draws, and the more such files the nearer "
            "their mean to the values as they were"
        )


def _refuse_rebuilt_groups(con, table: str, mine: Release, theirs: Release) -> None:
    """Refuse two files of rows of ``table`` they share, one holding a column microaggregated
    and the other holding it exactly (as it is or in an expression). Each microaggregated
    value is the mean of a group of near values (k consecutive ranks of one column); readers of
    the exact values find the k records whose mean it is, and among them the one with the
    record's other columns both files hold (red team s49b: ``microaggregate:weight:k=5`` beside
    the exact weight, both released, linked 8,834 of the CLI demo's 20,000 persons one to one
    by their sex and age band within the group; k = 10: about 3,800)."""
    for one, other in ((mine, theirs), (theirs, mine)):
        exact = {
            c.name.lower()
            for _n, e in _exact_links(other)
            if not isinstance(e, exp.Case)
            for c in e.find_all(exp.Column)
        }  # fmt: skip (bands: no run of near values)
        both = one.grouped & exact
        if both and share_rows(con, table, mine.where, theirs.where):
            column = ", ".join(sorted(both))
            raise MicrodataError(
                f"{one.label} holds {column} microaggregated and {other.label} holds it "
                f"exactly, of rows of {table} they share: each group's mean is that of a few "
                f"records whose exact {column} readers of both find, and the records' other "
                f"columns tell them apart, so the files link record by record. Leave "
                f"{column} out of one file, or band it there (recode)"
            )


def _exact_links(file: Release) -> tuple:
    """A file's exact columns that read the table (``links``, else ``sums``)."""
    return file.links if file.links is not None else file.sums or ()


def _refuse_linked_records(con, policy: Policy, table: str, mine: Release, theirs: Release):
    """Refuse two files of rows of ``table`` they share that link record by record by
    columns both hold exactly, where the union of their cuts shows linked records among fewer
    units than the minimum frequency that each file alone shows among more
    (:mod:`sqlsdc.jobs.linked_files`, red team s47o)."""
    least = min_frequency(policy, table)
    if not share_rows(con, table, mine.where, theirs.where):
        return
    links = link_columns(con, table, mine, theirs)
    if not links:
        return
    linked, exposed = linked_records(con, table, mine, theirs, least)
    if linked:  # a class of x·m in one, x in the other: the pair would tell m's side (s47n)
        for dimension, measure in derived_pairs(policy, table):
            for one, other in ((mine, theirs), (theirs, mine)):
                if dimension in one.held and measure in other.held | other.drawn:
                    raise MicrodataError(
                        f"they link record by record ({linked:,} records), and {one.label} "
                        f"shows {dimension}, the class of the noised value of {measure}, "
                        f"which {other.label} shows: side by side, a unit near a break "
                        "whose class is not the class of its value tells its secret noise "
                        f"factor. Leave {dimension} out of {one.label} (a file that shows "
                        f"{measure} too shows the class of its own value)"
                    )
    if exposed:
        links = ", ".join(column for column, _ours, _theirs in links)
        raise MicrodataError(
            f"they link record by record by {links}, which both hold unperturbed ({linked:,} "
            f"records are the only ones of their values in both), and {exposed:,} of the "
            f"linked records are shown, by the columns of both files together, among fewer "
            f"than {least} records, while each file alone shows them among {least} or more: "
            "readers of both hold that finer key. Leave the near-unique column (a weight, an "
            "exact measure) out of one file, or band or perturb it there"
        )


def refuse_listed_files(con, policy: Policy) -> None:
    """Refuse ``policy`` (being applied) when two stored anonymised files its ``releases:``
    lists differ by a few units in a cell: both would be released."""
    if not _has_outputs(con):
        return  # no catalog yet: nothing stored
    refusal = _policy_refusal(policy)
    refuse_opaque_files(con, policy, policy.releases, refusal)
    refuse_file_pairs(con, policy, released_files(con, policy, policy.releases), refusal=refusal,
                      held=held_files(con, policy))  # fmt: skip


def refuse_opaque_files(
    con, policy: Policy, names: Iterable[str], refusal: Callable[[str, str, str], Error]
) -> None:
    """Refuse releasing together the stored anonymised files ``names`` (as listed) when one
    of them reads a table by a query whose population is no WHERE on it
    (:func:`~sqlsdc.jobs.record_files.opaque_files`) and another reads that table: the check
    cannot compare them (red team s38f: everyone aged 85+ as a derived table, and the same
    people but one municipality's person as a WHERE, gave that person's income)."""
    wanted = {f"{OUTPUT_SCHEMA}.{name}".lower() for name in names} | reaching_readers(con, ())
    if len(wanted) < 2:
        return
    plain = [(table, file.label) for table, file in all_files(con, policy)
             if file.label.lower() in wanted]  # fmt: skip
    for declared in policy.confidential_tables:
        opaque = [n for n in opaque_files(con, policy, declared.name) if n.lower() in wanted]
        reading = opaque + [label for table, label in plain
                            if table.lower() == declared.name.lower()]  # fmt: skip
        if opaque and len(reading) > 1:
            other = next(name for name in reading if name != opaque[0])
            raise refusal(opaque[0], other, (
                f"{opaque[0]} reads {declared.name} by a query whose population is no WHERE "
                f"on it, so the differencing check cannot compare it with {other}, another "
                f"file of {declared.name}: the two could differ by a few units in a cell"
            ))  # fmt: skip


def released_files(con, policy: Policy, names: Iterable[str]) -> list[File]:
    """The stored anonymised files named ``names`` (as listed: no schema, any case)."""
    wanted = {f"protected.{name}".lower() for name in names}
    if not wanted:
        return []
    return [(table, file) for table, file in all_files(con, policy)
            if file.label.lower() in wanted]  # fmt: skip


def held_files(con, policy: Policy) -> list[File]:
    """The earlier versions of files that reached readers while they were current
    (:func:`~sqlsdc.jobs.record_files.reaching_readers`): every publication is read next
    to them."""
    held = reaching_readers(con, ())
    return [(table, file) for table, file in all_files(con, policy) if file.label.lower() in held]


def _compare(con, policy: Policy, table: str, mine: Release, theirs: Release) -> None:
    """Each file's counts by its plain columns against the other's cells and cuts; a file's
    own bands count here only as its population."""
    unit = policy.table(table).privacy_unit
    refuse_file_differences(con, policy, theirs, [(mine.label, _counts(table, mine, unit))])
    refuse_file_differences(con, policy, mine, [(theirs.label, _counts(table, theirs, unit))])


def _refuse_signed_sums(con, policy: Policy, table: str, mine: Release, others: list) -> None:
    """Refuse ``mine`` when, with the files ``others`` and the exact tables of ``table``, a
    signed sum isolates a group of fewer units than the minimum frequency in a cell
    (:func:`~sqlsdc.jobs.isolated_groups.refuse_isolated_groups`), for its counts and each sum
    it holds unperturbed."""
    tables = exact_tables(con, policy, table)
    unit, least = policy.table(table).privacy_unit, min_frequency(policy, table)
    for measure in dict.fromkeys([None, *(spec.measure for _label, spec in tables)]):
        if measure is not None and not mine.holds(measure):
            continue
        releases = [Release(label, spec.where, spec.dims) for label, spec in tables
                    if spec.measure == measure]  # fmt: skip
        releases += [f for f in others if measure is None or f.holds(measure)]
        spec = JobSpec(table, mine.dims, measure, unit, mine.where)
        refuse_isolated_groups(con, spec, releases, least, label=mine.label, error=MicrodataError)


def _counts(table: str, file: Release, unit: str) -> JobSpec:
    return JobSpec(table, file.dims, None, unit, file.where)


def _policy_refusal(policy: Policy) -> Callable[[str, str, str], Error]:
    def refusal(first: str, second: str, reason: str) -> Error:
        return PolicyError([
            f"{policy.source}: releases: lists {first} and {second}, anonymised files of one "
            f"table that cannot both be released: {reason}. List one of them only"
        ])  # fmt: skip

    return refusal


def _has_outputs(con) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'sqlsdc' "
                            "AND table_name = 'outputs'").fetchone()[0])  # fmt: skip
