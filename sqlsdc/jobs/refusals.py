"""The checks that refuse a protection job before it computes anything, and a policy whose
suppression pattern would differ from the exact outputs already stored by a few units.

:func:`refuse_job` runs them in order on a parsed job: a table the policy protects by DP
(:func:`dp_table_refusal`, shared with the other jobs), SQL that reads another confidential
table, cells another job's output already releases protected another way
(:func:`_refuse_second_protection`) or a version of one replaced or dropped since
(:func:`_refuse_earlier_protection`), counts released protected another way (a suppression
job of a sum publishes its units' counts, :func:`_refuse_second_count_protection`),
populations that differ from an exact release by a few units
(:func:`~sqlsdc.jobs.differencing.refuse_small_differences` over
:func:`_exact_releases`) or, for a sum, by a group its rules flag
(:func:`~sqlsdc.jobs.dominated_differences.refuse_dominated_differences`), cells of the live
suppression pattern (:func:`~sqlsdc.jobs.live_cells.refuse_live_cells`; its grand total
excepted when the pattern publishes it, :mod:`sqlsdc.jobs.live_total`), a rounding replaced
by one to another base, and the output's name (:func:`check_output_name`, shared with
anonymisation).
:func:`refuse_pattern_differences` is the same differencing check from the policy's side,
which ``catalog/setup.py`` ``apply_policy`` runs before it writes a policy.
"""

from __future__ import annotations

import dataclasses
import json

import sqlglot
from sqlglot import exp

from sqlsdc.errors import Error, PolicyError, TabularError
from sqlsdc.jobs.differencing import refuse_small_differences
from sqlsdc.jobs.dominated_differences import refuse_dominated_differences
from sqlsdc.jobs.exact_release import Release, total_releases
from sqlsdc.jobs.live_cells import refuse_live_cells, refuse_live_file_cells
from sqlsdc.jobs.live_total import public_grand_total, stored_total_published
from sqlsdc.jobs.record_files import opaque_files, opaque_refusal, stored_files
from sqlsdc.jobs.session import OUTPUT_SCHEMA
from sqlsdc.jobs.stored_tables import (
    count_tables_of_the_same_cells,
    earlier_versions_of_the_same_cells,
    exact_method,
    exact_tables,
    outputs_of_the_same_cells,
    pattern_label,
)
from sqlsdc.jobs.synthesis_files import opaque_syntheses, stored_exact_syntheses
from sqlsdc.jobs.tabulation import JobSpec, rules_of
from sqlsdc.policy import Policy
from sqlsdc.tabular.rules import FrequencyRule
from sqlsdc.tabular.universe import COUNT, universe_of


def refuse_job(
    con,
    policy: Policy,
    spec: JobSpec,
    sql: str,
    into: str,
    method: str,
    *,
    replace: bool,
    base: int | None,
    version: int,
    rules=(),
) -> bool:
    """Refuse the ``method`` job of ``spec`` (its SQL ``sql``) storing ``protected.<into>``
    when one of this module's checks fails (a :class:`TabularError`), in the order its
    docstring gives. Return whether its grand total is a cell the live pattern publishes,
    which the job must publish too (:func:`~sqlsdc.jobs.live_total.public_grand_total`,
    under policy version ``version``). ``rules``: the job's primary rules, which a sum's
    difference from another exact release must pass, with the table's default rules
    (:func:`~sqlsdc.jobs.tabulation.rules_of`), which the other was judged by unless given
    others (its rules are not recorded)."""
    _refuse_dp_table(policy, spec, method)
    _refuse_other_tables(policy, sql, spec)
    _refuse_second_protection(con, policy, spec, into, method)
    _refuse_earlier_protection(con, policy, spec, into, method, base)
    _refuse_second_count_protection(con, policy, spec, method, into)
    if exact_method(method, spec):
        others = _exact_releases(con, policy, spec)
        # red team s45f; judged by the table's default rules too (s46b): an earlier output's
        # own rules are not recorded, and one judged by the defaults (p:10) beside a later job
        # of weaker rules (freq only) left their difference, a dominated group, unjudged
        judged = _judged_rules(rules, rules_of(policy, spec))
        refuse_small_differences(con, policy, spec, others, rules=judged)
        refuse_dominated_differences(con, spec, others, judged)
    elif method == "round":  # a rounded count beside a file's exact counts (red team s44c)
        refuse_small_differences(con, policy, spec, _exact_files(con, policy, spec))
    if method == "suppress" and spec.measure is not None:  # its units' counts are published too
        counted = dataclasses.replace(spec, measure=None)
        refuse_small_differences(con, policy, counted, _exact_releases(con, policy, counted))
    total = public_grand_total(con, policy, spec, method, version)
    # after: a few units off is told as such
    refuse_live_cells(con, policy, spec, "the job", total=total)
    if replace and base is not None:
        _refuse_another_base(con, into, base)
    check_output_name(con, into, replace, TabularError, policy)
    return total


def check_output_name(con, into: str, replace: bool, error: type[Error], policy: Policy) -> None:
    """Refuse to write ``protected.<into>`` over an existing table without ``replace``, and
    over one whose name differs in case even with it: DuckDB's names are case-insensitive, so
    ``T`` is the table ``t``, and replacing it under another spelling left ``sqlsdc.outputs``
    naming both. Refuse names sqlsdc reserves (``__``) and names of the policy's tables, which
    the release database and analysts' queries would confuse with the confidential table."""
    if into.startswith("__"):
        raise error(f"--into {into!r}: names starting with '__' are reserved for sqlsdc")
    if policy.table(into) is not None:
        raise error(f"--into {into!r} is the name of a table of the policy; choose another name")
    found = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = ? "
        "AND lower(table_name) = lower(?)",
        [OUTPUT_SCHEMA, into],
    ).fetchall()
    if not found:
        return
    (existing,) = found[0]
    if existing != into:
        raise error(
            f"{OUTPUT_SCHEMA}.{existing} exists; names are case-insensitive, so --into {into} "
            f"names it too: write --into {existing} (with --replace to overwrite it) or choose "
            "another name"
        )
    if not replace:
        raise error(f"{OUTPUT_SCHEMA}.{into} exists; pass --replace to overwrite it")


def _judged_rules(rules, defaults) -> list:
    """The rules a sum's difference from another exact release is judged by: the job's own
    (when one of them is more than a frequency rule: a job of frequency rules only leaves the
    frequency of differences to the frequency check, red team s40i's CTA of freq:1500), and
    the table's default rules other than frequency, which the other release may have been
    judged by (s46b)."""
    own = rules if any(not isinstance(r, FrequencyRule) for r in rules) else []
    extra = [r for r in defaults if not isinstance(r, FrequencyRule)]
    return list(dict.fromkeys([*own, *extra]))


def _refuse_dp_table(policy: Policy, spec: JobSpec, method: str) -> None:
    """Refuse a job over a table the policy protects by differential privacy: its output would
    release the table's cells exactly (or perturbed once, deterministically) outside the
    privacy budget, and the budget's guarantee to every person in it would no longer hold."""
    if policy.table(spec.table).differentially_private:
        raise TabularError(dp_table_refusal(spec.table, f"a {method} job"))


def _refuse_other_tables(policy: Policy, sql: str, spec: JobSpec) -> None:
    """Refuse a job whose SQL reads another table than its own beside public ones (a subquery
    of its WHERE): ``persons WHERE person_id IN (SELECT person_id FROM benefits WHERE amount >
    1500)`` stored exact facts of ``benefits``, which the policy protects by DP, in a table of
    ``persons`` (red team s36d); a confidential table read so is protected by nothing."""
    for table in sqlglot.parse_one(sql, read="duckdb").find_all(exp.Table):
        declared = policy.table(table.name)
        plain = isinstance(table.this, exp.Identifier) and table.db.lower() in ("", "main")
        if (
            plain
            and not table.catalog
            and declared is not None
            and (declared.name == spec.table or declared.is_public)
        ):
            continue
        reason = ("which the policy protects by differential privacy"
                  if plain and declared is not None and declared.differentially_private
                  else "which is not a public table of the policy")  # fmt: skip
        raise TabularError(
            f"a protection job reads {spec.table} and public tables only; its SQL also reads "
            f"{table.sql('duckdb')}, {reason}: what it tells of that table would be stored "
            "unprotected. Filter with conditions on the columns of " + spec.table
        )


def dp_table_refusal(table: str, job: str) -> str:
    """The message of a non-DP job refused over a DP table (shared by every job)."""
    return (
        f"{table} is protected by differential privacy in the policy: {job} would store its "
        "data outside the privacy budget, which voids the budget's guarantee. Release it with "
        "a DP query (`sqlsdc publish --query`) or a DP synthesis (`sqlsdc synthesize --method "
        "dp-ipf`), or change the table's method in the policy"
    )


def _refuse_second_protection(con, policy: Policy, spec: JobSpec, into: str, method: str) -> None:
    """Refuse a job whose cells a stored output of another job already releases, protected
    another way: by another method, or by a rounding, CTA or IPF job under another name.

    Two protections of one cell combine (red team s33b): a rounding to base 3 and one to base 5
    of a count leave only the values both allow; a cell a suppression job hides has a rounded or
    adjusted value in the other table; a suppression job's exact values tell how far CTA moved
    each cell. Suppression jobs of the same rows stay allowed: each keeps what the others hid
    (:func:`~sqlsdc.jobs.earlier_suppressions.earlier_suppressions`); so does replacing an
    output by a job of its own method (``--replace``). Jobs over other rows that share a cell (a
    WHERE that picks cells of the other's table, ``region = 'R01'``) are refused whatever their
    methods: their cells are matched by their rows, not their keys (red team s33c), and so are
    jobs over other rows a cell of which is the sum of inner cells of the other (red team s45f:
    turnover over six activities by region, next to turnover by region x nace suppressed, gave
    a hidden cell as its region's cell less the five published ones;
    :mod:`sqlsdc.jobs.cell_unions`)."""
    own = f"{OUTPUT_SCHEMA}.{into}"
    for name, theirs, _dims, alike in outputs_of_the_same_cells(con, policy, spec, own):
        if theirs == method and (name == own or (method == "suppress" and alike)):
            continue
        raise TabularError(
            f"{name} already releases these cells ({spec.table}, the same aggregate over the "
            "same units or rows, or over rows whose cells add up to one another's), protected "
            f"by method {theirs}; this job (method {method}) "
            "would release them protected a second way, and a reader of both tables could "
            "combine the two (two roundings of a cell, or a rounded or adjusted value of a "
            "cell the other hides) to narrow the values they protect. Tabulate another "
            f"population, or protect these cells with {theirs} (`--into "
            f"{name.split('.', 1)[1]} --replace` replaces that table)"
        )


def _refuse_earlier_protection(
    con, policy: Policy, spec: JobSpec, into: str, method: str, base: int | None
) -> None:
    """Refuse a job whose cells a version of an output replaced or dropped since released
    protected another way (:func:`_refuse_second_protection`'s rule: its readers keep it), or,
    a rounding of its own name, to another base (:func:`_refuse_another_base`'s rule).

    Red team s41k: a rounding to base 3 of a count table, replaced under its name by one of
    another population (or its table dropped), then the same table rounded to base 5 under
    another name, was stored: the current outputs shared no cell, and readers of both held
    every cell rounded to base 3 and to base 5."""
    own = f"{OUTPUT_SCHEMA}.{into}"
    for version, alike in earlier_versions_of_the_same_cells(con, policy, spec):
        if version.method == method and method == "suppress" and alike:
            continue
        if version.method == method and version.name.lower() == own.lower():
            before = _base_of(version.report) if method == "round" else base
            if before == base:  # a rounding whose base its report does not name: refused
                continue
            raise TabularError(
                f"{version.label} released these cells rounded to base {before}; a rounding "
                f"of them to base {base} would give its readers a cell's two roundings, which "
                f"leave only the values both allow. Round to base {before}, or tabulate "
                "another population"
            )
        raise TabularError(
            f"{version.label} released these cells ({spec.table}, the same aggregate over the "
            "same units or rows, or over rows whose cells add up to one another's), protected "
            f"by method {version.method}; its readers keep it, "
            f"and this job (method {method}) would release them protected a second way, which a "
            "reader of both could combine to narrow the values they protect. Tabulate another "
            f"population, or protect these cells with {version.method} under its name"
        )


def _refuse_second_count_protection(
    con, policy: Policy, spec: JobSpec, method: str, into: str = ""
) -> None:
    """Refuse a job that releases counts readers hold protected another way: a suppression job
    of a sum publishes its cells' unit counts (``n``, NULL where hidden) and lists every
    non-empty cell, so it is a count table protected by suppression too
    (:func:`_refuse_second_protection`'s rule, which matches jobs by aggregate: SUM is not
    COUNT). A rounding, CTA or IPF of the same units' counts beside it, current or a version
    its readers keep, in either order, is refused; count jobs by suppression of the same rows
    stay allowed, as suppression jobs of the same rows are (they keep each other's hidden
    cells), and those of other rows that share a cell or whose cells add up to the other's are
    refused, as :func:`_refuse_second_protection` refuses two such jobs of one aggregate (red
    team s45f: turnover by region x nace suppressed, then the firms of R01's hidden G and its
    four published activities counted by region, gave G's 2 firms as R01's count less the four
    published ``n``).

    Red team s42c: incomes of R01's persons aged 85+ by municipality x sex suppressed under
    ``freq:5``, and their COUNT(*) rounded to base 2: a rounding leaves out the cells it
    rounds to 0, so that they read as empty, but the suppression job lists them, and a hidden
    cell missing from the rounding held one person (5 such cells on the test demo; at base 3,
    10 cells of 1 or 2); an exact margin ``n`` beside one rounded cell narrows the other."""
    if spec.measure is not None and method == "suppress":
        counts = dataclasses.replace(spec, measure=None)

        def clash(m, _of_a_sum, alike):
            return m != "suppress" or not alike

        what = "this suppression job of a sum publishes them too, in its n column"
    elif spec.measure is None and method != "suppress":
        counts, clash = spec, lambda _m, of_a_sum, _alike: of_a_sum
        what = f"this job (method {method}) would release them protected a second way"
    elif spec.measure is None:
        counts, clash = spec, lambda _m, of_a_sum, alike: of_a_sum and not alike
        what = "this suppression job would protect them with a pattern of other rows"
    else:
        return
    own = f"{OUTPUT_SCHEMA}.{into}".lower()
    for label, theirs, of_a_sum, alike in count_tables_of_the_same_cells(con, policy, counts):
        if not clash(theirs, of_a_sum, alike):
            continue
        mine = label.lower() == own or label.lower().startswith(own + " ")
        if not alike and mine and theirs == method == "suppress":
            continue  # its own versions: kept as _refuse_earlier_protection keeps them
        held = "in its n column, " if of_a_sum else ""
        if alike:
            how = (
                "a count one hides and the other rounds, or a cell one lists as not empty and "
                "the other leaves out as rounded to 0, which at base 2 is a count of 1. Protect "
                "the counts one way (a count job by --method suppress beside a suppression job "
                "of a sum)"
            )
        else:
            how = (
                "its rows are other rows whose cells share or add up to these, and a count one "
                "pattern hides is the other's cell less the counts both publish. Tabulate the "
                "same rows as it (a suppression job of them keeps what it hid)"
            )
        raise TabularError(
            f"{label} releases the unit counts of these cells ({spec.table}, the same units), "
            f"{held}protected by method {theirs}; {what}. A reader of both could combine the "
            f"two: {how}, or tabulate another population"
        )


def _base_of(report: str | None) -> int | None:
    """The base a rounding's stored report names, or None."""
    try:
        return json.loads(report).get("details", {}).get("base")
    except (TypeError, ValueError, AttributeError):
        return None


def _refuse_another_base(con, into: str, base: int) -> None:
    """Refuse to replace a rounding by one to another base: the earlier table stays with its
    readers (``sqlsdc publish`` records what it released), and two bases of one cell leave
    only the values both allow, as two tables would (red team s33c)."""
    found = con.execute(
        "SELECT report FROM sqlsdc.outputs WHERE name = ? AND method = 'round'",
        [f"{OUTPUT_SCHEMA}.{into}"],
    ).fetchall()
    if not found:
        return
    before = json.loads(found[0][0]).get("details", {}).get("base")
    if before is not None and before != base:
        raise TabularError(
            f"{OUTPUT_SCHEMA}.{into} holds these cells rounded to base {before}; replacing it "
            f"by a rounding to base {base} would give readers of both a cell's two roundings, "
            f"which leave only the values both allow. Round to base {before} again, or write "
            "another --into for another population"
        )


def _exact_releases(con, policy: Policy, spec: JobSpec) -> list[Release]:
    """Every release of the job's table and aggregate that readers hold with exact values
    (:func:`~sqlsdc.jobs.differencing.refuse_small_differences`): the exact tables
    (:func:`exact_tables`) of its aggregate, and the anonymised files of the table that hold
    its measure unperturbed, as the exact tables they imply
    (:func:`~sqlsdc.jobs.record_files.stored_files`; red team s37c: a file of everyone aged
    85 or over, income only top-coded far above any income, less a suppression job's total of
    the same people but one, gave that person's income and so named their record)."""
    if opaque := _opaque(con, policy, spec.table):
        raise TabularError(opaque_refusal(f"the file {opaque[0]}", spec.table, "the job"))
    found = [
        Release(label, theirs.where, theirs.dims)
        for label, theirs in exact_tables(con, policy, spec.table)
        if theirs.measure == spec.measure
    ]
    return found + _exact_files(con, policy, spec)


def _exact_files(con, policy: Policy, spec: JobSpec) -> list[Release]:
    """The anonymised files of the job's table, and the syntheses that count as exact, that
    hold its aggregate unperturbed, as the exact tables they imply; a file the check cannot
    compare refuses the job (:func:`_exact_releases`). A rounding of counts is checked
    against them (red team s44c: a file of everyone aged 85+ but one beside their rounded
    counts by region x education gave that person's region for 231 of 2,283 persons)."""
    if opaque := _opaque(con, policy, spec.table):
        raise TabularError(opaque_refusal(f"the file {opaque[0]}", spec.table, "the job"))
    files = stored_files(con, policy, spec.table) + stored_exact_syntheses(con, policy, spec.table)
    held = [f for f in files if spec.measure is None or f.holds(spec.measure)]
    return held + total_releases(files, spec.measure)  # perturbed, but its total exact (s47i)


def refuse_pattern_differences(con, policy: Policy) -> None:
    """Refuse a policy whose suppression pattern of a table (the guard's, which analysts read
    live and ``sqlsdc publish`` releases) differs from an exact table or an anonymised file of
    that table already stored by a few units in a cell both hold: the other order of the
    check a job or a file gets against the pattern in force (red team s38e: a file of every
    person aged 1 or over, then suppression by geography x sex switched on, gave 90 cells of
    1-4 persons aged 0, and their incomes, as the pattern's cell less the file's). Syntheses
    that count as exact files (cart's balanced draws, red team s39c) are checked as files."""
    if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'sqlsdc' AND "
                       "table_name = 'outputs'").fetchone()[0]:  # fmt: skip
        return  # no catalog yet: nothing stored
    for declared in policy.confidential_tables:
        if declared.suppression is None:
            continue
        label = pattern_label(declared.name)
        if opaque := _opaque(con, policy, declared.name):
            raise _policy_refusal(opaque_refusal(f"the file {opaque[0]}", declared.name, label))
        found = exact_tables(con, policy, declared.name)
        files = stored_files(con, policy, declared.name)
        files += stored_exact_syntheses(con, policy, declared.name)
        for pattern in (spec for name, spec in found if name == label):
            others = [Release(name, theirs.where, theirs.dims) for name, theirs in found
                      if name != label and theirs.measure == pattern.measure]  # fmt: skip
            others += [f for f in files if pattern.measure is None or f.holds(pattern.measure)]
            refuse_small_differences(con, policy, pattern, others, label, error=_policy_refusal)
            rules = universe_of(policy, declared.name).rules(pattern.measure or COUNT)
            others += total_releases(files, pattern.measure)  # perturbed, total exact (s47i)
            refuse_dominated_differences(con, pattern, others, rules, label, error=_policy_refusal)
        for name, spec in found:  # cells of the pattern held by an output stored before it
            if name != label:
                total = stored_total_published(con, policy, spec)
                refuse_live_cells(con, policy, spec, name, error=_policy_refusal, total=total)
        for release in files:
            refuse_live_file_cells(con, policy, declared.name, release, _policy_refusal)


def _opaque(con, policy: Policy, table: str) -> list[str]:
    """The stored files of ``table`` the differencing check cannot compare: anonymised files
    and syntheses that count as exact (:func:`opaque_files`, :func:`opaque_syntheses`)."""
    return opaque_files(con, policy, table) + opaque_syntheses(con, policy, table)


def _policy_refusal(message: str) -> PolicyError:
    """A policy refused by what it would release next to the outputs stored: a PolicyError
    (``policy apply`` and ``init`` exit 4), as the check of the files its ``releases:`` lists."""
    return PolicyError([message])
