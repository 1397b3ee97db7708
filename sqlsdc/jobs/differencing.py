"""Two releases of one table over populations that differ by a few units in a cell.

A job's table and another release of the same table and aggregate (the guard's suppression
pattern, which ``sqlsdc publish`` releases, a stored job output, or an anonymised file of the
table, whose records add up to any table over its columns) share the cells whose dimensions
both group by. Where both publish exact values (suppression; the cells CTA did not
move; the margins an IPF job was given, which are the true ones when the admin wrote them from
the data) and a shared cell's two populations overlap, a few units one holds and the other lacks —
with none the other way — are exactly the difference of the two values: their count, or their
sum. Red team s36c: on the suppression demo a job by geography x sex over ``WHERE age >= 1``,
published next to the live pattern of every person, gave 144 cells of counts 1-4 of the 144
persons aged 0 (one girl aged 0 in R01-M001), cells the policy's ``freq:5`` hides; a job of
``WHERE employees >= 10`` over enterprises does the same to the turnover of a cell's few small
enterprises. Red team s37c: an IPF job of income by region x education over ``age >= 85``,
raked to its true margins, next to a suppression job by sex over the same people but the one
of a municipality, gave that person's income as the difference of the two grand totals.

:func:`refuse_small_differences` refuses such a job before it computes anything. Pairwise
(:func:`sqlsdc.jobs.uncovered.smallest_difference`, both orders), every cell of either release
(every grouping of its columns) is compared with the inner cells of the other that cover its
units, whatever their dimensions; the cover less the cell must be none or at least the
minimum frequency of units on the side that differs (differences on both sides mix what the
two groups add up to). Across more tables
(:func:`sqlsdc.jobs.isolated_groups.refuse_isolated_groups`), a signed sum of several may
isolate a group that no pair does (T1 - T2 + T3 - T4 of four jobs over R02
∪ R03 ∪ {one person}, R02 ∪ R03 ∪ R04, R02 ∪ R04 and R02, red team s38b): in each cell that
three or more of them publish, no combination of them may add up to a group of regions of
their populations' Venn diagram of fewer than the minimum frequency of units.

An anonymised file is the exact tables it implies (a
:class:`~sqlsdc.jobs.exact_release.Release` with ``exact``, written by
:mod:`sqlsdc.jobs.record_files` from :func:`sqlsdc.microdata.steps.exact_columns`): a cell for
every combination of values of its columns that no perturbative step changed and that read a
dimension (under any name), a recoded column cut by its bands. Its inner cells are the
combinations of all of them, so a table's cell is compared with the file's cells that cover it,
however finely the file cuts (red team s37c: the README's ``seniors_r01``, R01 aged 65 or over
with age banded 65/75/85, and ``old_people``, everyone aged 90 or over by municipality and
education: a cell of the 85+ band less the job's gave the 85-89-year-olds of that municipality
and education; red team s38b: a file's (R01, education) sum next to a job by region over one
education). Where the file's exact columns tell of each of its records whether the table counts
it (the table's WHERE reads only columns the file holds and no local suppression blanked, and
is the same within each combination of their released values: ``age >= 90`` next to a band
``>=90``), the file's records outside the table are counts of the file's own cells, no new
information; then only the table's units outside the file are a difference.
:func:`refuse_file_differences` checks a new file against the exact tables stored before it,
:func:`refuse_small_differences` a new table against the stored files.

Not covered: a rounded or raked table next to another (their difference bounds those units' sum
within the two perturbations; red team s33c keeps that allowed); combinations of cells of
several tables of different dimensions beyond a cell and its cover (the signed sums take the
tables that group by a cell's dimensions, a file by its plain dimension columns); the two
patterns together (a cell hidden in one table and published in the other, the attacker LP over
both with non-negative differences): protecting linked tables of different populations needs
one covering universe (red team s30f); only where a cell of one job's table is the sum of inner
cells of the other's (no units differ, red team s45f) is the pair refused, by
:mod:`sqlsdc.jobs.cell_unions` through :func:`sqlsdc.jobs.stored_tables.outputs_of_the_same_cells`;
two anonymised files of one table cut by cut (when both
are released, each file's counts by its plain columns are compared with the other's cells and
cuts, ``sqlsdc.jobs.file_pairs``; a cut of one next to a cut of the other is not; a file
whose query is no WHERE is refused released with another file of its table). Replaced or
dropped outputs are compared as their readers keep them, every earlier version of a job's
table (``sqlsdc.jobs.stored_tables.exact_tables``) and of an anonymised file
(``sqlsdc.jobs.record_files.stored_files``), from the outputs' history
(:mod:`sqlsdc.jobs.output_history`).

A local suppression's blanked values are a cell of their own: a file and an exact table of the
same people leave a cell of a blanked column short of the file's blanked records there
(:func:`sqlsdc.jobs.blanked_cells.blanked_difference`).
"""

from __future__ import annotations

from dataclasses import replace

from sqlsdc.errors import MicrodataError, TabularError
from sqlsdc.jobs.blanked_cells import blanked_difference
from sqlsdc.jobs.cell_unions import cells_add_up
from sqlsdc.jobs.dominated_differences import refuse_dominated_differences
from sqlsdc.jobs.dominated_groups import refuse_dominated_groups
from sqlsdc.jobs.exact_release import Release, total_releases
from sqlsdc.jobs.isolated_groups import refuse_isolated_groups
from sqlsdc.jobs.stale_releases import refuse_stale_differences
from sqlsdc.jobs.tabulation import rules_of
from sqlsdc.jobs.uncovered import cell_text, smallest_difference
from sqlsdc.policy import Policy
from sqlsdc.tabular.rules import FrequencyRule, parse_rule


def refuse_small_differences(
    con,
    policy: Policy,
    spec,
    others: list[Release],
    label: str = "the job",
    *,
    error=None,
    rules=None,
) -> None:
    """Refuse the job ``spec`` (a :class:`~sqlsdc.jobs.tabulation.JobSpec`; ``label`` names it)
    when one of ``others`` (same table and aggregate) and it hold a cell and the other's inner
    cells that cover it whose populations differ, on one side only, by fewer units than the
    table's minimum frequency (:func:`smallest_difference`), when a file's blanked values
    leave one of its cells that few units short (:func:`blanked_difference`), or when with
    three or more of them a signed sum isolates that few (:func:`refuse_isolated_groups`), or
    when with them it gives the change since one of them was published before the data
    changed, and that change fails the minimum frequency or, for a sum, ``rules`` (the table's
    default rules when None; :func:`refuse_stale_differences`). ``error`` makes the refusal's
    exception from its message (a job's: TabularError)."""
    error = error or TabularError
    least = min_frequency(policy, spec.table)
    for other in others:
        _refuse_pair(con, spec, other, least, (label, other.label), error)
    refuse_isolated_groups(con, spec, others, least, label=label, error=error)
    rules = rules_of(policy, spec) if rules is None else rules
    refuse_stale_differences(con, policy, spec, others, least, rules, label, error)


def refuse_file_differences(con, policy: Policy, file: Release, tables: list) -> None:
    """Refuse an anonymised file (``file``, labelled as the job's output) when one of the
    exact tables stored before it (``tables``: ``(label, JobSpec)`` of its table) and the file
    differ so, or by a group the table's default rules flag
    (:func:`~sqlsdc.jobs.dominated_differences.refuse_dominated_differences`), or several with
    it isolate a group of fewer units than the minimum frequency, or one those rules flag
    (:func:`~sqlsdc.jobs.dominated_groups.refuse_dominated_groups`): the other order of
    :func:`refuse_small_differences`; or when with them it gives the change since one was
    published before the data changed (:func:`refuse_stale_differences`). A table of sums
    is compared only with a file that holds its measure unperturbed."""
    for label, spec in tables:  # a perturbed measure whose total the file keeps (s47i)
        totals = total_releases([file], spec.measure)
        refuse_dominated_differences(con, spec, totals, rules_of(policy, spec), label,
                                     error=MicrodataError)  # fmt: skip
    tables = [(label, spec) for label, spec in tables
              if spec.measure is None or file.holds(spec.measure)]  # fmt: skip
    for label, spec in tables:
        least = min_frequency(policy, spec.table)
        _refuse_pair(con, spec, file, least, (label, file.label), MicrodataError)
        # a sum's difference of any size, judged by the table's default rules (a stored
        # output's own rules are not recorded; red team s45f, s45n)
        rules = rules_of(policy, spec)
        refuse_dominated_differences(con, spec, [file], rules, label, error=MicrodataError)
    for measure in dict.fromkeys(spec.measure for _l, spec in tables):
        same = [(label, spec) for label, spec in tables if spec.measure == measure]
        # the file as a table of this aggregate by its plain dimension columns
        spec = replace(same[0][1], dims=file.dims, where=file.where, written=None)
        others = [Release(label, theirs.where, theirs.dims) for label, theirs in same]
        least = min_frequency(policy, spec.table)
        refuse_isolated_groups(con, spec, others, least, label=file.label, error=MicrodataError)
        # and a group of any size the table's default rules flag (red team s46b: two jobs of
        # R02's turnover over I and A and over A and B, then a file of R02's B firms: T1 - T2
        # plus the file's records was I's total, 91 % one firm's)
        refuse_dominated_groups(con, spec, others, rules_of(policy, spec), file.label,
                                error=MicrodataError)  # fmt: skip
        # and the change since a table published before the data changed (s46k)
        # a pair over the same units too: no revision rule judges the file (red team s47c)
        refuse_stale_differences(con, policy, spec, others, least, rules_of(policy, spec),
                                 file.label, MicrodataError, revisions=False)  # fmt: skip


def _refuse_pair(con, spec, other: Release, least: int, names: tuple[str, str], error) -> None:
    """Raise ``error`` when the table ``spec`` and the release ``other`` differ by fewer than
    ``least`` units in a cell and its cover (:func:`smallest_difference`), or leave a file's
    blanked values placed (:func:`blanked_difference`); ``names`` are the two in the message,
    the table's first."""
    found = smallest_difference(con, spec, other, least)
    if found is not None:
        raise error(_message(spec.table, *names, found, least))
    if other.exact and (spec.measure is None or other.holds(spec.measure)):
        # a file's cell that adds up inner cells of the table but is none of its cells: less
        # those the table publishes, it is one it hides (a file's cell that is one of the
        # table's shows that cell itself, as its records do)
        dims = tuple(n for n, _e in other.exact)
        file = replace(spec, dims=dims, where=other.where, written=None)
        if cells_add_up(con, file, spec, [e for _n, e in other.exact], shared=False):
            raise error(_union_message(spec.table, *names))
    placed = blanked_difference(con, spec, other, least)
    if placed is not None:
        raise error(_blanked_message(spec.table, *names, placed, least))


def min_frequency(policy: Policy, table: str) -> int:
    """The largest minimum frequency the policy sets for ``table``: any aggregate kind's
    ``min_frequency`` and any ``freq:N`` suppression rule."""
    rules = policy.table(table).protection.values()
    found = [r.min_frequency for r in rules]
    for rule in rules:
        for text in rule.rules:
            parsed = parse_rule(text)
            if isinstance(parsed, FrequencyRule):
                found.append(int(parsed.min_freq))
    return max(found)


def _message(table: str, first: str, second: str, found, least: int) -> str:
    cell, units, side = found
    named = cell_text(cell)
    holder, other = (first, second) if side == "a" else (second, first)
    return (
        f"the population of {first} and that of {second} overlap and differ by only {units} "
        f"unit(s) of {table} in a cell of one ({named}) and the inner cells of the other that "
        f"cover it, {units} that {holder} counts and {other} does not: the difference of "
        f"their values would show what those units add up to, which no cell of fewer than "
        f"{least} units (the policy's minimum frequency) may show. Tabulate a population that "
        "differs from it by none or by at least that many units in every cell they share"
    )


def _union_message(table: str, first: str, second: str) -> str:
    return (
        f"a cell of {second} (a file of {table}) is the sum of two or more inner cells of "
        f"{first} and none of its cells, the same units, and a reader of both takes the "
        f"cells {first} publishes from that sum to recompute one it hides (red team s45f: a "
        "file of the enterprises of two activities, region exact, less the count a suppression "
        "job published for one of them in a region gave the other's hidden count of 2 firms). "
        "Anonymise a population or grouping none of whose cells adds up whole cells of the "
        "table, or tabulate another population"
    )


def _blanked_message(table: str, job: str, file: str, placed, least: int) -> str:
    cell, units, columns = placed
    named = cell_text(cell)
    return (
        f"{file} blanked values of {', '.join(columns)} by local suppression, and {job} "
        f"publishes an exact value of the same units of {table} in a cell ({named}) from "
        f"which the file's records that show the cell leave only {units} unit(s): the "
        "difference counts the file's records whose blanked value belongs to the cell, and "
        f"places those values in a group of fewer than {least} units (the policy's minimum "
        "frequency). Tabulate another population or grouping, or anonymise with a step "
        "that blanks or perturbs other columns"
    )
