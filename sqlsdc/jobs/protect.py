"""Cell suppression as a back-end job: a GROUP BY over confidential microdata, protected by
suppression, and stored in the database as a plain table (``sqlsdc protect --method
suppress``).

The job runs the steps every protection job runs (:mod:`sqlsdc.jobs.job`: open and check,
tabulate in SQL, store with ledger rows and audit entry in one transaction) with the pattern
builder the query path uses too (:func:`sqlsdc.tabular.universe_pattern.suppression_pattern`). It
keeps what suppression outputs of the same rows stored before it suppressed and published
(:mod:`sqlsdc.jobs.earlier_suppressions`), and a sum job's unit counts ``n``, which it
publishes too, are protected by its pattern (:mod:`sqlsdc.jobs.sum_counts`).

A suppression job stores suppressed values as NULL; each row carries its status and the rule
that fired, and the record holds the audit result. Before storing, the pattern is checked
independently (:func:`~sqlsdc.tabular.verify.verify_suppression`: every primary cell of the
job's rules suppressed, the attacker LP run again on the pattern).

Example (admins; the demo database):
    >>> report = protect_query("sqlsdc-demo.duckdb", "admin",  # doctest: +SKIP
    ...     "SELECT nace, region, SUM(turnover) FROM enterprises WHERE employees >= 10 "
    ...     "GROUP BY nace, region", into="turnover_by_nace_region")
    >>> report.secondary, report.audit_passed  # doctest: +SKIP
    (23, True)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sqlsdc.errors import TabularError
from sqlsdc.jobs.earlier_suppressions import (
    audit_with_earlier,
    changed_published,
    earlier_suppressions,
    same_versions,
)
from sqlsdc.jobs.job import Progress, check_time_limit, job_rules, open_job
from sqlsdc.jobs.kept_cells import identify
from sqlsdc.jobs.reader_intervals import reader_intervals
from sqlsdc.jobs.replaced_suppressions import carried, replaced_suppressions
from sqlsdc.jobs.revision_audit import audit_revisions
from sqlsdc.jobs.revisions import (
    combined,
    counts_of,
    job_units,
    record_units,
    revision_rule,
    unknown_revisions,
    with_counts,
)
from sqlsdc.jobs.session import OUTPUT_SCHEMA
from sqlsdc.jobs.sum_counts import (
    N_HIDDEN,
    audit_counts,
    audit_jointly,
    count_table,
    known_lower,
    measure_bounds,
)
from sqlsdc.jobs.tabulation import rated
from sqlsdc.tabular.gauss import DEFAULT_SINGLETON, check_singleton_method
from sqlsdc.tabular.model import TOTAL, Table
from sqlsdc.tabular.rules import ManualRule, apply_rules
from sqlsdc.tabular.universe_pattern import exempt_known, suppression_pattern
from sqlsdc.tabular.verify import verify_suppression

LEDGER_STATUS = "__status"  # the ledger status column of a job's released cells


@dataclass(frozen=True)
class JobReport:
    name: str
    cells: int
    primary: int
    secondary: int
    cost: float
    rules_fired: dict[str, int]
    audit_passed: bool
    audit_exact: bool
    method: str
    singleton: str = "anySumAudit"  # GaussSuppression's singleton method (a revision reuses it)

    def to_dict(self) -> dict:
        return asdict(self)


def protect_query(
    db: str | Path,
    user: str,
    sql: str,
    *,
    into: str,
    method: str = "gauss",
    rules: Sequence | None = None,
    cost: str = "value",
    time_limit: float = 60.0,
    replace: bool = False,
    progress: Progress | None = None,
    singleton: str | None = None,
) -> JobReport:
    """Protect the table ``sql`` tabulates and store it as ``protected.<into>`` (admins only).

    ``singleton``: GaussSuppression's singleton method (``anySumAudit``, the default: no
    one-unit cell's respondent computes another primary; ``anySum``, SSBtools' default; the
    conservative ``subSpace``, ...; :data:`~sqlsdc.tabular.gauss.SINGLETON_METHODS`), applied
    with every ``method``; None: the one the replaced output was protected with (recorded in
    its report), else ``anySumAudit``.

    Hierarchies declared in the policy whose levels are all grouped (``[region,
    municipality]``) become one hierarchical dimension with sub-totals; every other key is a
    flat dimension with a total. Rules default to the frequency rule with the policy's minimum
    frequency, plus the p%-rule (p = 10) for magnitudes (:func:`~sqlsdc.jobs.job.job_rules`).
    """
    check_time_limit(time_limit)
    if singleton is not None:
        check_singleton_method(singleton)
    with open_job(db, user, sql, into, method="suppress", replace=replace,
                  progress=progress, rules=rules) as job:  # fmt: skip
        singleton = singleton or _recorded_singleton(job)
        rules = job_rules(job, rules)
        table = job.tabulate(rules)
        job.step("primary and secondary suppression, audit")
        bound = None
        if job.spec.measure is None:
            known = known_lower(table)
        else:  # the policy's measure bounds its readers know (test_redteam_s44o)
            bound = _noised_bounds(job)
            known = measure_bounds(table, bound)
        kept, held, shown = earlier_suppressions(job, table)
        rules_table = rated(table)  # a sum's frequency rule counts its non-zero contributors
        units = job_units(job, identify(job, table).population)
        replaced = replaced_suppressions(job, table, units)  # versions no output holds (s43c)
        kept, held, shown = carried(replaced, kept, held, shown, len(table.cells))
        revised = revision_rule(job, table, rules, units)  # differences from earlier versions
        if revised is None or not revised.alike:  # none of its rows kept: changed cells hidden
            revised = combined(revised, unknown_revisions(rules, changed_published(job, table)))
            if job.spec.measure is not None:  # and a sum's changed n (s42i)
                revised = with_counts(revised, unknown_revisions(
                    rules, changed_published(job, table, "n")), len(table.cells))  # fmt: skip
        if revised is not None and revised.cells.any():
            rules = [*rules, revised]
        if job.live_total:  # the live pattern publishes it: public (jobs/live_total.py)
            shown = _with_grand_total(table, shown)
        if shown is not None and shown.any():  # published before with these values: public
            rules = exempt_known(rules, shown)

        joint: list = []  # cells the joint audit of n and sums hides (s45g)

        def pattern(counted: Sequence = ()) -> pd.DataFrame:
            """The pattern, with ``counted`` rules (a sum's cells its counts hide) too."""
            return suppression_pattern(
                rules_table,
                [*rules, *joint, *counted],
                method=method,
                singleton_method=singleton,
                cost=cost,
                time_limit=time_limit,
                apriori=known,
                primary=ManualRule(kept, safety_range=0.0, name="earlier release")
                if kept is not None and kept.any()
                else None,
                held=held if held is not None and held.any() else None,
                forced=shown if shown is not None and shown.any() else None,
            )

        try:

            def counted(result: pd.DataFrame) -> pd.DataFrame:
                """``result`` grown for its unit counts n, published too."""
                return audit_counts(table, rules, result, pattern, method=method,
                                    singleton=singleton, time_limit=time_limit, forced=shown,
                                    revised=counts_of(revised))  # fmt: skip

            def redo(cells: np.ndarray) -> pd.DataFrame:
                """The pattern again with ``cells`` hidden (count and sum) too."""
                joint[:] = [ManualRule(cells, safety_range=0.0, name="counts and sums")]
                return counted(pattern())

            result = pattern()
            if job.spec.measure is not None:  # its unit counts n are published too
                result = audit_jointly(table, rules, counted(result), redo, bound,
                                       forced=shown, time_limit=time_limit)  # fmt: skip
        except TabularError as refusal:
            if shown is None or not shown.any():
                raise
            raise TabularError(
                "the cells earlier suppression outputs of the same rows (or the live pattern, "
                "its grand total) publish (the forced cells below) are public, and with this "
                f"table's cells they reveal: {refusal}. "
                "Protect the finer table first (or in one job), or tabulate another population"
            ) from None
        published = (result["status"] == "published").to_numpy()
        counted = published & ~_n_hidden(result)  # a known sum's revised n: hidden (s42i)
        result["n"] = np.where(counted, table.n, np.nan)  # every unit the WHERE keeps there
        result["rule"] = np.where(published & ~counted, "revision (n)", result["rule"])
        found = apply_rules(rules_table, rules)  # the job's own primaries, checked independently
        verify_suppression(rules_table, result["status"].to_numpy() != "published",
                           primary=found.primary, upl=found.upl, lpl=found.lpl,
                           time_limit=time_limit,
                           lower=None if known is None else known[0],
                           upper=None if known is None or np.isscalar(known[1])
                           else known[1]).require()  # fmt: skip
        audit_with_earlier(job, table, result, found, known, time_limit)
        audit_revisions(job, table, result["status"].to_numpy() != "published", found,
                        revised, units, same_versions(job, table), time_limit,
                        replaced=replaced)  # fmt: skip
        out, report = _suppression_output(table, result, into, method, singleton)
        if bound is not None:  # its audit's intervals know each hidden cell's true n
            listed = known_lower(count_table(table))[0]
            out["lower_bound"], out["upper_bound"] = reader_intervals(
                table, ~published, ~counted, listed, bound, time_limit)  # fmt: skip
        status = np.where(out["status"] == "published", "published", "suppressed")
        if job.spec.measure is None:  # n is the value: one status
            released = out[[*table.dims, "n", "value"]].assign(**{LEDGER_STATUS: status})
            values, extra = ("n", "value"), []
        else:  # a published sum's n may be hidden (its NULL: suppressed)
            released = out[[*table.dims, "value"]].assign(**{LEDGER_STATUS: status})
            values, extra = ("value",), [(out[[*table.dims, "n"]], ("n",))]
        counts = ("n", "value") if job.spec.measure is None else ("n",)  # of units: integers
        out = out.astype(dict.fromkeys(counts, "Int64"))  # 829, not 829.0 enterprises
        job.store(out, report.to_dict(), released, values=values, status=LEDGER_STATUS,
                  extra=extra, kept=lambda: record_units(job, units))  # fmt: skip
        return report


def _n_hidden(result: pd.DataFrame) -> np.ndarray:
    """The cells whose sum is published and whose unit count is not
    (:func:`~sqlsdc.jobs.sum_counts.audit_counts`); none for a count job."""
    if N_HIDDEN not in result.columns:
        return np.zeros(len(result), dtype=bool)
    return result[N_HIDDEN].to_numpy(dtype=bool)


def _with_grand_total(table: Table, shown: np.ndarray | None) -> np.ndarray:
    """``shown`` (cells published before, or None) with the table's grand total."""
    total = (table.cells[list(table.dims)].astype(str) == TOTAL).all(axis=1).to_numpy()
    return total if shown is None else shown | total


def _recorded_singleton(job) -> str:
    """The singleton method recorded in the report of the output this job replaces, so that a
    revision is protected as its first version was; ``anySumAudit`` for a new output, and
    ``anySum`` for one stored before the method was recorded (s44p), the default then."""
    rows = job.con.execute(
        "SELECT report FROM sqlsdc.outputs WHERE name = ? AND method = 'suppress'", [job.name]
    ).fetchall()  # all: a connection with an unfinished result takes no other work
    if not rows or not rows[0][0]:
        return DEFAULT_SINGLETON
    return json.loads(rows[0][0]).get("singleton", "anySum")


def _suppression_output(
    table: Table, result: pd.DataFrame, into: str, method: str, singleton: str = DEFAULT_SINGLETON
):
    """The stored rows of a suppression job and its report: the pattern (suppressed values and
    counts NULL), the attacker's interval of each suppressed cell, no protection levels."""
    published = result["status"] == "published"
    out = result[[*[c for c in result.columns if c not in _INTERNAL]]].copy()
    # the attacker's interval of each suppressed cell, derived from the published cells only
    out["lower_bound"] = result["lo"].where(~published)
    out["upper_bound"] = result["hi"].where(~published)
    audit = result.attrs["audit"]
    fired: dict[str, int] = {}
    for rule in result["rule"].dropna():
        for part in str(rule).split(";"):
            if part.strip():
                fired[part.strip()] = fired.get(part.strip(), 0) + 1
    report = JobReport(
        name=f"{OUTPUT_SCHEMA}.{into}",
        cells=len(result),
        primary=audit.n_primary,
        secondary=audit.n_secondary,
        cost=float(np.abs(table.values[(result["status"] == "secondary").to_numpy()]).sum()),
        rules_fired=fired,
        audit_passed=audit.passed,
        audit_exact=audit.exact,
        method=method,
        singleton=singleton,
    )
    return out, report


# protection levels reveal values; N_HIDDEN is said by a NULL n
_INTERNAL = ("upl", "lpl", "lo", "hi", "level", "is_inner", N_HIDDEN)


def _noised_bounds(job) -> tuple[float, float] | None:
    """The policy's ``bounds: [lo, hi]`` of the job's measure as its readers know them for the
    summed values: widened by the unit noise's factor range when the sums carry it (x·m can
    reach b·hi; an audit assuming hi would reason on a region the true table is outside)."""
    column = job.policy.table(job.spec.table).column(job.spec.measure)
    if column.bounds is None:
        return None
    lo, hi = map(float, column.bounds)
    noise = job.spec.unit_noise
    return (lo, hi) if noise is None else noise.noised_bounds(lo, hi)
