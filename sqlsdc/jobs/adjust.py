"""Rounding and adjustment jobs: controlled rounding, controlled tabular adjustment (CTA) and
raking, run on a table computed in SQL and stored next to the suppression jobs' outputs.

Each method is one function over the shared steps of :mod:`sqlsdc.jobs.job` (admin check,
SQL check, inner cells in SQL, :class:`~sqlsdc.tabular.model.Table`, transactional store):

* :func:`round_query` — Salazar González's controlled rounding (PSD 2006) to a base:
  :func:`~sqlsdc.tabular.rounding.controlled_round`.
* :func:`cta_query` — CTA (Dandekar & Cox 2002; Castro 2006): sensitive cells (primary rules)
  move by at least their protection levels, the table stays additive:
  :func:`~sqlsdc.tabular.cta.cta`; optionally with Giessing & Dittrich's intervals (PSD 2006).
* :func:`ipf_query` — rake the table to margins given in a file (e.g. census benchmarks), with
  the sensitive inner cells first placed at safe values, as Cox, Orelien & Shah's MDI-CTA
  (PSD 2006) does with the original margins; see the function for why.

**What is stored.** The dimensions and the published ``value`` of every cell whose published
value is not 0 — nothing else: no original values, contributor counts, protection levels or
sensitivity flags, which would reveal the cells the rules found. Cells published as 0 are left
out, so that a stored row does not tell a cell moved or rounded down to 0 from an empty one (a
missing cell reads as 0; sums over the stored rows are unchanged). ``cta --intervals`` adds
``lower_bound``/``upper_bound`` on the sensitive cells (:func:`cta_query`).

**Secret levels.** CTA and the raking job move a sensitive cell to ``original ± level``, and
the rules make the level a known share of the value; so both use the rules' levels enlarged by
a secret factor (:func:`_secret_levels`), or the published value would give the original away
(the factor blurs that relation; it does not remove it — see there).

**Verification.** Before anything is stored, the published values are checked against the
method's own constraints by :mod:`sqlsdc.tabular.verify`, independently of the solver (CTA:
additivity, bounds, every sensitive cell beyond its protection range; rounding: multiples of
the base, adjacent multiples, additivity; raking: the given margins within IPF's tolerance,
additivity). A failed check raises :class:`~sqlsdc.errors.VerificationError`: nothing is
stored, and the job is audited ``failed`` with the reason ``verification_failed: …``. The
report's ``details["verification"]`` holds the checks' figures.

**The report** (returned, printed by the CLI, recorded in ``sqlsdc.outputs``) holds the
method's status and the information loss of :func:`~sqlsdc.tabular.quality.quality` (HD, RAD,
AAD, χ², additivity, largest change and its cell). It is for the data owner: the catalog is
readable by admins only and ``sqlsdc publish`` copies the output tables, not the reports.

Example (admins; the demo database):
    >>> report = round_query("sqlsdc-demo.duckdb", "admin",  # doctest: +SKIP
    ...     "SELECT region, sex, COUNT(*) FROM persons GROUP BY region, sex",
    ...     into="persons_rounded", base=5)
    >>> report.status, report.quality["max_additivity_error"]  # doctest: +SKIP
    ('optimal', 0.0)
"""

from __future__ import annotations

import hashlib
import hmac
import math
import stat
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import pandas as pd

from sqlsdc.catalog import store
from sqlsdc.errors import TabularError
from sqlsdc.jobs import kept_cells, replaced_sides, rounded_versions
from sqlsdc.jobs.adjusted_revisions import refuse_published_revisions, revision_units
from sqlsdc.jobs.job import Job, Progress, check_time_limit, job_rules, open_job
from sqlsdc.jobs.revisions import Units, record_units
from sqlsdc.jobs.session import OUTPUT_SCHEMA
from sqlsdc.jobs.tabulation import rated
from sqlsdc.tabular.model import Table
from sqlsdc.tabular.quality import quality
from sqlsdc.tabular.rules import apply_rules
from sqlsdc.tabular.verify import verify_cta, verify_margins, verify_rounding

METHODS = ("round", "cta", "ipf")

#: Protection levels are multiplied by a secret factor in [1, 1 + LEVEL_SPREAD). A spread of 1
#: made a third of the CTA runs on the demo's turnover table infeasible; 0.5 none.
LEVEL_SPREAD = 0.5

#: Least wall time of a rounding's audit (it gets the job's ``time_limit`` again, at least this):
#: 18 s of CPU for the 3,633 sensitive cells of a 10^4-cell 2-D table, 1.1 s for 138 (s42h).
AUDIT_SECONDS = 60.0


@dataclass(frozen=True)
class AdjustReport:
    """How a rounding or adjustment job went.

    Attributes:
        name: the stored table (``protected.<into>``). method: ``round``, ``cta`` or ``ipf``.
        cells: cells of the table (margins included); stored: rows written (cells published
            as 0 are left out). sensitive: cells the primary rules found (None for ``round``).
        status: ``optimal``/``feasible``/``near_feasible`` (round), ``optimal``/``feasible``
            (cta: the solver's status; ``feasible`` when a limit stopped it), ``converged``
            (ipf). A job whose result fails verification stores nothing and raises.
            details: the method's own figures and ``verification``.
        quality: :class:`~sqlsdc.tabular.quality.QualityReport` as a dict. seconds: wall time.
    """

    name: str
    method: str
    cells: int
    stored: int
    sensitive: int | None
    status: str
    details: dict = field(default_factory=dict)
    quality: dict = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def round_query(
    db: str | Path,
    user: str,
    sql: str,
    *,
    into: str,
    base: int,
    time_limit: float = 30.0,
    replace: bool = False,
    progress: Progress | None = None,
) -> AdjustReport:
    """Round every cell of the table ``sql`` tabulates to a multiple of ``base``, additively,
    and store it as ``protected.<into>`` (admins only).

    Status ``near_feasible`` means no zero-restricted rounding was found: some margins lie
    beyond their adjacent multiples (``details["violations"]`` names them); the table is
    still additive.
    """
    from sqlsdc.tabular.rounding import controlled_round

    check_time_limit(time_limit)
    started = time.perf_counter()
    with open_job(db, user, sql, into, method="round", replace=replace,
                  progress=progress, base=base) as job:  # fmt: skip
        _refuse_counts_to_base_two(job, base)
        rules = job_rules(job, None) if job.spec.measure is not None else []
        table = job.tabulate(rules)
        found = _refuse_small_base(table, rules, base)
        identities = kept_cells.identify(job, table)
        units = revision_units(job, identities)
        versions = rounded_versions.earlier_versions(job, table, identities, units)
        before = replaced_sides.published_before(job, table, identities)
        job.step(f"controlled rounding to base {base}")
        kept = rounded_versions.keep(before, versions)
        small = _small_counts(job, table, base, identities, kept)
        result = controlled_round(table, base, time_limit=time_limit, keep=kept, fixed=small)
        rounded = result.cells["rounded"].to_numpy(np.float64)
        relaxed = np.zeros(rounded.size, dtype=bool)
        relaxed[
            result.violations.merge(
                table.cells[list(table.dims)].reset_index(), on=list(table.dims)
            )["index"]
        ] = True
        verification = verify_rounding(table, rounded, result.base, relaxed=relaxed,
                                       max_excess=result.max_excess).require()  # fmt: skip
        audit = _refuse_narrow_intervals(table, found, rounded, base, relaxed,
                                         result.max_excess, time_limit)  # fmt: skip
        details = {
            "base": result.base,
            "max_excess": result.max_excess,
            "excess_bound": result.excess_bound,
            "violations": result.violations[list(table.dims)].to_dict("records"),
            "distance": result.distance,
            "partition": result.partition,
            "subtables": result.subtables,
            # cells published before (by a version of this population, or the output replaced)
            # and those of them rounded to the same multiple again (red team s41c)
            "published_before": int(np.isfinite(before).sum()),
            "same_multiple": int(np.sum(rounded == before)),
            "verification": verification.to_dict(),
            "audit": audit,
        }
        # multiples of an integer base: stored as BIGINT, as a count is (a BI tool shows a
        # DOUBLE count of persons as 3525.0)
        integral = np.abs(rounded).max(initial=0) < 2**53
        published = rounded.astype(np.int64) if integral else rounded
        rounded_versions.refuse_other_multiples(table, rounded, versions)  # s44c
        refuse_published_revisions(job, table, rules, identities, units, rounded, "round")
        return _finish(job, table, published, "round", result.status, details, None, started,
                       identities, units)  # fmt: skip


def cta_query(
    db: str | Path,
    user: str,
    sql: str,
    *,
    into: str,
    rules: Sequence | None = None,
    method: str = "lp",
    time_limit: float = 60.0,
    intervals: bool = False,
    replace: bool = False,
    progress: Progress | None = None,
) -> AdjustReport:
    """Adjust the table ``sql`` tabulates by CTA and store it as ``protected.<into>`` (admins).

    Primary ``rules`` (default as for suppression, :func:`~sqlsdc.jobs.job.job_rules`) find
    the sensitive cells and their protection levels; ``method`` is ``lp``, ``milp`` or ``mdi``
    (:func:`~sqlsdc.tabular.cta.cta`). Every cell is published with its adjusted value.

    With ``intervals``, each sensitive cell also gets Giessing & Dittrich's interval
    (:func:`~sqlsdc.tabular.intervals.publish_intervals`: it holds the original and the
    adjusted value and covers the protection range, and its bounds follow the adjusted value
    and the power of ten of the adjustment only) in ``lower_bound``/``upper_bound``; other
    cells get NULL. This says which cells were adjusted for protection, and by how much to
    within a factor of ten — what Giessing & Dittrich publish (flagged cells with intervals),
    and no more: no levels, no rule, no direction, no original. For a frequency table that flag
    alone tells that a cell has fewer units than the minimum frequency, so ``intervals`` is
    refused for ``COUNT(*)`` jobs. It is refused with ``milp`` as well: the MILP chooses the
    directions, and breaks the tie of a lone sensitive cell down (8 of 8 tables, red team
    s47l), which the flag names, so its original would be known to ±12 %; the LP's
    directions follow a secret order.
    """
    from sqlsdc.tabular.cta import cta
    from sqlsdc.tabular.intervals import publish_intervals

    if intervals and method == "milp":
        raise TabularError(
            "--intervals flags the sensitive cells, and --cta-method milp chooses their "
            "directions from the data (a lone sensitive cell always moves down), so the flag "
            "would tell how far each original lies from its adjusted value; use --cta-method lp "
            "(its directions follow a secret order) with --intervals, or milp without it"
        )

    check_time_limit(time_limit)
    started = time.perf_counter()
    with open_job(db, user, sql, into, method="cta", replace=replace,
                  progress=progress, rules=rules) as job:  # fmt: skip
        if intervals and job.spec.measure is None:
            raise TabularError(
                "--intervals flags the sensitive cells, and in a frequency table (COUNT(*)) a "
                "flagged cell is known to have fewer units than the minimum frequency; publish "
                "the adjusted counts without intervals, or use --method suppress"
            )
        rules = job_rules(job, rules)
        table = job.tabulate(rules)
        job.step(f"controlled tabular adjustment ({method})")
        found = apply_rules(rated(table), rules)  # a sum's rule: its non-zero contributors
        _refuse_moved_counts(job, found, "cta")
        identities = kept_cells.identify(job, table)
        kept = replaced_sides.replaced(
            job, table, found.primary, identities, _largest_levels(found)
        )
        levels = _secret_levels(job, table, found, rules, identities)
        upl, lpl = kept.levels(*levels, _largest_levels(found))
        out = cta(table, rules=[], sensitive=found.primary, protection=(upl, lpl), method=method,
                  time_limit=time_limit,
                  directions=kept.directions(table, found.primary, _secret_order(
                      job, table, rules, identities)))  # fmt: skip
        report = out.attrs["cta"]
        sensitive = out["sensitive"].to_numpy(bool)
        extra = None
        if intervals:
            bounds = publish_intervals(out)
            extra = pd.DataFrame(
                {
                    "lower_bound": bounds["lo"].where(sensitive),
                    "upper_bound": bounds["hi"].where(sensitive),
                }
            )
        details = {k: v for k, v in report.to_dict().items() if k != "status"}
        details["intervals"] = intervals
        if intervals:  # the span of every interval, in multiples of its adjusted value
            details["interval_span"] = bounds.attrs["span"]
        adjusted = out["adjusted"].to_numpy(np.float64)
        kept.refuse_crossed(table, adjusted, "--cta-method lp keeps the sides")
        # checked again here, on what is stored, against the job's own rules and levels
        details["verification"] = verify_cta(table, adjusted, sensitive=found.primary, upl=upl,
                                             lpl=lpl, method=f"CTA job ({method})",
                                             atol=_ipf_tolerance(table) if method == "mdi" else 0,
                                             ).require().to_dict()  # fmt: skip
        units = revision_units(job, identities)
        refuse_published_revisions(job, table, rules, identities, units, adjusted, "cta")
        return _finish(job, table, adjusted, "cta", report.status, details, sensitive, started,
                       identities, units, extra=extra)  # fmt: skip


def ipf_query(
    db: str | Path,
    user: str,
    sql: str,
    *,
    into: str,
    margins: pd.DataFrame | str | Path,
    rules: Sequence | None = None,
    max_iter: int = 1000,
    replace: bool = False,
    progress: Progress | None = None,
) -> AdjustReport:
    """Rake the table ``sql`` tabulates to given margins and store it (admins only).

    ``margins`` (a CSV file or DataFrame) lists margin cells of the *stored* table: one column
    per stored dimension (a policy hierarchy such as ``geography`` is one column with region
    codes on sub-totals) holding a code or the total code ``Total``, and ``value``. Margins come
    in complete sets: every region total, or every (region, sex) total, or the grand total. The
    given values are published as they are, so they must be public (census benchmarks) or
    already protected.

    Raking alone protects nothing: raked to margins near the originals, every cell comes back
    near its original. So, as in Cox, Orelien & Shah's MDI-CTA (PSD 2006, digest §1.1), the
    sensitive inner cells (primary ``rules``, default as for suppression) are first placed at
    a safe value — their protection level beyond the original, in the direction a plain raking
    moves them, or where that raking puts them when it already moves them further — and the
    other inner cells are raked (IPF, :func:`~sqlsdc.tabular.ipf.rake`) to the given margins
    minus the fixed cells. The job refuses to store a table in which a sensitive cell (a margin
    not given in the file, say) ends up inside its protection range.
    """
    started = time.perf_counter()
    margins = _read_margins(margins)
    with open_job(db, user, sql, into, method="ipf", replace=replace,
                  progress=progress, rules=rules) as job:  # fmt: skip
        rules = job_rules(job, rules)
        table = job.tabulate(rules)
        job.step("matching the margins, primary rules")
        given = _given_margins(table, margins)
        groups, targets, cells = _margin_groups(table, given)
        found = apply_rules(rated(table), rules)  # a sum's rule: its non-zero contributors
        _refuse_moved_counts(job, found, "ipf")
        identities = kept_cells.identify(job, table)
        kept = replaced_sides.replaced(
            job, table, found.primary, identities, _largest_levels(found)
        )
        levels = _secret_levels(job, table, found, rules, identities)
        upl, lpl = kept.levels(*levels, _largest_levels(found))
        job.step("raking (IPF)")
        raked, iterations, error, fixed = _rake_protected(
            table, found.primary, upl, lpl, groups, targets, max_iter, kept.sides
        )
        _check_protected(table, raked, found, given_cells=cells)
        kept.refuse_crossed(table, raked, "check the margins or use --method cta")
        verification = verify_margins(table, raked, cells, given.loc[cells].to_numpy(np.float64),
                                      tolerance=_ipf_tolerance(table, given)).require()  # fmt: skip
        details = {
            "iterations": iterations,
            "max_margin_error": error,
            "margins_given": int(cells.size),
            "fixed_sensitive": fixed,
            "converged": True,
            "verification": verification.to_dict(),
        }
        units = revision_units(job, identities)
        refuse_published_revisions(job, table, rules, identities, units, raked, "ipf")
        return _finish(job, table, raked, "ipf", "converged", details, found.primary, started,
                       identities, units)  # fmt: skip


# ----------------------------------------------------------------------------- shared


def _finish(job: Job, table: Table, published, method, status, details, sensitive, started,
            identities: kept_cells.Cells, units: Units, *, extra: pd.DataFrame | None = None
            ) -> AdjustReport:  # fmt: skip
    """Quality report, stored rows (dimensions, published value, ``extra`` columns; cells
    published as 0 left out), the ``sqlsdc.outputs`` record, the ledger rows of every cell
    (those published as 0 too: a missing cell reads as 0, so it is released all the same) and
    every cell's published value kept under its identity (``identities``,
    :mod:`~sqlsdc.jobs.kept_cells`), and the job's ``units`` as this version holds them
    (:mod:`~sqlsdc.jobs.adjusted_revisions`)."""
    job.step("quality report")
    q = quality(table.values, published, table, sensitive=sensitive)
    rows = table.cells[list(table.dims)].reset_index(drop=True).copy()
    rows["value"] = published
    out = rows
    recorded = []
    if extra is not None:
        extra = extra.reset_index(drop=True)
        out = pd.concat([out, extra], axis=1)
        flagged = extra.notna().any(axis=1).to_numpy()
        recorded.append((out.loc[flagged, [*table.dims, *extra.columns]], tuple(extra.columns)))
    out = out[out["value"] != 0].reset_index(drop=True)
    report = AdjustReport(
        name=f"{OUTPUT_SCHEMA}.{job.into}",
        method=method,
        cells=len(table.cells),
        stored=len(out),
        sensitive=None if sensitive is None else int(np.sum(sensitive)),
        status=status,
        details=details,
        quality=q.to_dict(),
        seconds=time.perf_counter() - started,
    )
    job.store(out, report.to_dict(), rows, extra=recorded,
              kept=lambda: _keep(job, identities, published, units))  # fmt: skip
    return report


def _keep(job: Job, identities: kept_cells.Cells, published, units: Units) -> None:
    """Keep the published values by cell identity and the units by version (one transaction)."""
    kept_cells.record(job, identities, published)
    record_units(job, units)


def _refuse_moved_counts(job: Job, found, method: str) -> None:
    """Refuse to place the sensitive cells of a frequency table at ``original ± level``.

    CTA and the safe values of IPF move a sensitive cell by its protection level, and a count's
    level is a known function of the count (the frequency rule's 30 %, at least 1): with the
    secret factor of :func:`_secret_levels` in [1, 1.5), a sensitive 1 is published in
    [2, 2.5) upwards and a 2 in [3, 3.5) or (0.5, 1], ranges that hold one integer original
    each, while an unmoved count stays an integer. Red team s33b read every small count of the
    demo's nace x region table (``freq:3``) this way: 20 of 20 from the CTA output, none wrong,
    and 20 of 27 guesses from the IPF output raked to the true margins. Counts are therefore
    published by rounding or suppression, as the README advised; a count table whose rules flag
    no cell may still be raked."""
    if job.spec.measure is None and bool(np.any(found.primary)):
        raise TabularError(
            f"--method {method} would publish each sensitive count at its original plus or "
            "minus its protection level, a known function of the count, so the published value "
            "gives the count back (2.27 is a 1 moved up); publish frequency tables with "
            "--method round or --method suppress"
        )


def _refuse_counts_to_base_two(job: Job, base: int) -> None:
    """Refuse to round a count table to a base below 3.

    A rounding leaves out the cells it publishes as 0, so that a reader cannot tell a small
    count from an empty cell (:func:`_finish`); at base 2 that 0 is a count of 0 or 1, and a
    reader who knows a cell is not empty (a live query that shows it, another table that
    lists it, what a neighbour knows) reads it as a 1. Red team s42c: everyone aged 85+ by
    municipality x sex to base 2 beside the analyst's own query of the same cells (cell key
    method, which shows some cells of one person) proved 7 cells of one person on the test
    demo. At base 3 such a cell holds 1 or 2, once the small counts are drawn
    (:func:`_small_counts`: rounded by distance, it was a 1)."""
    if job.spec.measure is None and base < 3:
        raise TabularError(
            f"--method round to base {base} publishes a count of 1 as 0 or {base}, and a cell "
            "published as 0 is left out; a reader who knows the cell is not empty (a live "
            "query, another table) then reads it as a 1. Round counts to base 3 or more"
        )


def _small_counts(job: Job, table: Table, base: int, identities: kept_cells.Cells,
                  kept: np.ndarray | None = None):  # fmt: skip
    """The multiple each inner cell of a count table below the base is published at, drawn
    before the controlled rounding by the unbiased random rule (Cox & Kim 2006, rule 4; Fellegi
    1975): up to ``base`` with probability n/base, else 0; NaN for every other cell (None for
    a sum).

    Salazar's model minimises the distance, so it rounds a count to its nearest multiple
    whenever the margins allow: at base 3 every 2 went up and every 1 but one in 50 went to 0,
    which the job leaves out. A reader who knows such a cell is not empty (the analyst's live
    query of the same cells, which the threshold rule shows as suppressed and the cell key
    method often as 3 to 6, another table, a neighbour) read a missing cell as a 1 (red team
    s48i: everyone aged 85+ by municipality x sex beside one live query, 49 cells of one person
    under the threshold rule, 16 under the cell key method). Drawn, a missing cell is a 1 with
    probability 2/3 against a 2 (2 x 1/3 of the 1s and 1/3 of the 2s go to 0 at base 3), and a
    published base holds any count from 1 to 2·base - 1. The draw is secret, keyed by the
    database's secret, the job and the cell's identity and count (:func:`_secret_key`), so the
    same cell of the same count is drawn alike in every version (a new draw per run would be
    averaged), and the model holds it: the margins follow, relaxed if they must. A cell an
    earlier version published at 0 or the base (``kept``, what the rounding keeps) stays there:
    its readers have it already, and another multiple would put it between the two."""
    if job.spec.measure is not None:
        return None
    values = table.values
    inner = table.cells["is_inner"].to_numpy(dtype=bool)
    small = inner & (values > 0) & (values < base)
    if not small.any():
        return None
    key = _secret_key(job, "small counts", identities.population)
    up = identities.uniforms(key, values[:, None]) * base < values
    drawn = np.where(up, float(base), 0.0)
    if kept is not None:
        kept = np.asarray(kept, dtype=np.float64)
        drawn = np.where(np.isin(kept, (0.0, float(base))), kept, drawn)
    return np.where(small, drawn, np.nan)


def _refuse_small_base(table: Table, rules: Sequence, base: int):
    """Refuse to round a table of sums to a base below a sensitive cell's protection level.

    A controlled rounding publishes every cell at an adjacent multiple of ``base``, so a reader
    knows each value within ``(R - base, R + base)`` of the published R, the sensitive cells'
    too: no rule was applied. An interval narrower than ``upl + lpl`` cannot extend a cell's
    levels on both sides, so a base below a sensitive cell's level leaves it exposed (red team
    s41a: municipality x sex incomes of R01's 94-year-olds to base 5 published a one-person
    cell of 22,180.75 as 22,180). The table is rated as the other jobs rate it (the policy's
    default rules, a sum's non-zero contributors, :func:`~sqlsdc.jobs.tabulation.rated`). For
    counts (no ``rules``), rounding is the protection, as published (a small count is its
    multiple). Returns the rules' findings (None for counts), for
    :func:`_refuse_narrow_intervals`."""
    if not rules:
        return None
    found = apply_rules(rated(table), rules)
    if not found.primary.any():
        return found
    levels = np.maximum(found.upl, found.lpl)[found.primary]
    needed = float(levels.max())
    if base < needed:
        short = int(np.sum(levels > base))
        raise TabularError(
            f"--method round publishes every cell within {base:,} of its value, and {short} "
            f"cell(s) of this sum that the rules flag need at least {needed:,.2f} either side "
            f"(their protection levels); round to a base of {math.ceil(needed):,} or more, or "
            "protect the sum with --method cta or --method suppress"
        )
    return found


def _refuse_narrow_intervals(table: Table, found, rounded: np.ndarray, base: int,
                             relaxed: np.ndarray, max_excess: float, time_limit: float
                             ) -> dict:  # fmt: skip
    """Refuse a rounding of a sum that leaves a sensitive cell's value within less than its
    protection level of a bound a reader knows, the published table read as an attacker reads
    it: every cell within the base of its published multiple (the relaxed margins within
    ``base + max_excess``), the table additive, no value below 0 in a table without negative
    contributions (:func:`~sqlsdc.tabular.rounding_audit.audit_rounding`, an LP per bound).
    Returns the audit's figures for the report: sensitive cells audited and its CPU seconds.
    The audit has the job's ``time_limit`` again (at least :data:`AUDIT_SECONDS`); a cell it
    did not decide in time counts as exposed.

    A base at least the largest level (:func:`_refuse_small_base`) makes the interval wide
    enough, not well placed: a cell rounded down by d has ``base - d`` above it (red team
    s41k: incomes of everyone aged 85 or over by region and education, at the least base the
    check allowed, 223,060, put one of the 4 sensitive cells' upper bound at 0.67 of its
    level above its value; R01's 94-year-olds by municipality x sex: 5 cells at the least base,
    1 at twice it, none at three times). The rounding itself does not aim for this (a
    controlled rounding with protection constraints would): a larger base makes it likelier.
    Until s42 the check read each cell alone, ``R ± base``: a cell rounded to 0 lies in
    ``[0, base)`` for a reader who knows the sum cannot be negative, and margins the rounding
    relaxed were not checked. The refusal names one such cell (its codes, no value), for the
    admin who runs the job."""
    from sqlsdc.tabular.rounding_audit import audit_rounding

    if found is None or not found.primary.any():
        return {"cells": 0, "cpu_seconds": 0.0}
    audit = audit_rounding(table, rounded, base, found.primary, found.upl, found.lpl,
                           relaxed=relaxed, max_excess=max_excess,
                           time_limit=max(time_limit, AUDIT_SECONDS))  # fmt: skip
    exposed = audit.exposed
    if exposed.size:
        cell = table.cells.iloc[int(exposed[0])][list(table.dims)].astype(str).to_dict()
        why = (
            f"the audit did not finish within {max(time_limit, AUDIT_SECONDS):g} s (raise "
            "--time-limit); "
            if audit.timed_out
            else ""
        )
        raise TabularError(
            f"--method round to base {base:,} published {exposed.size} cell(s) of this sum "
            "that the rules flag closer than their protection level to a bound a reader knows "
            "(each published value within the base of its original, the table adding up, "
            f"sums of non-negative values not below 0), e.g. {cell}; {why}round to a larger "
            "base, or protect the sum with --method cta or --method suppress"
        )
    return {"cells": int(found.primary.sum()), "cpu_seconds": round(audit.cpu_seconds, 3)}


def _secret_levels(job: Job, table: Table, found, rules: Sequence, identities: kept_cells.Cells
                   ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The rules' protection levels, each enlarged by a secret factor in [1, 1 + LEVEL_SPREAD).

    An optimal adjustment puts a sensitive cell exactly at ``original ± level``, and rules fix
    the level as a known share of the value (the frequency rule's 30 % safety range): a
    published 11.7 would be 1.3 · 9, an exact disclosure of a count of 9. With the factor
    secret (keyed by the database's PRF secret, the job and the cell), the original is only
    known to lie in a range: p/1.45 < a ≤ p/1.3 upwards, p/0.7 ≤ a < p/0.55 downwards. This
    blurs the relation; it does not hide it (the upward range holds a single integer for small
    counts), so jobs refuse sensitive counts (:func:`_refuse_moved_counts`). The levels stay at
    least the rules'.

    The factors are keyed by the ``rules`` too: a job replaced under a frequency rule's other
    safety range kept a cell's factor and published ``x·(1 + 0.3·f)`` then ``x·(1 + 0.4·f)``,
    which give ``x`` (red team s40d; :mod:`sqlsdc.jobs.replaced_sides`). They are drawn per
    cell from its canonical identity in the job's population (``identities``,
    :mod:`sqlsdc.jobs.kept_cells`) and its original value, not from the SQL's text
    or the cell's position: a respelled job drew new factors, and seven respellings moved the
    sensitive cells from 1.11 to 1.40 levels to 1.45 to 1.49 (red team s41c); and a cell whose
    value changed draws a new one, as one factor kept over new data put a cell at
    ``x·(1 + 0.3·f)``, then ``(x + d)·(1 + 0.3·f)``, which give ``x`` to whoever knows ``d``.
    """
    key = _secret_key(job, "levels", identities.population, _rules_key(rules))
    state = table.values[:, None]
    factor = 1.0 + LEVEL_SPREAD * identities.uniforms(key, state)
    return found.upl * factor, found.lpl * factor


def _secret_order(job: Job, table: Table, rules: Sequence, identities: kept_cells.Cells
                  ) -> np.ndarray:  # fmt: skip
    """One secret number in [0, 1) per cell, the order in which the CTA job's LP alternates
    its sensitive cells down, up, … (:meth:`~sqlsdc.jobs.replaced_sides.Replaced.directions`):
    keyed as the levels' factors are (:func:`_secret_levels`), for another purpose, so that a
    cell's direction is independent of every value. CTA's ``alternate`` rule orders them by
    value, and the order of the originals shows through the adjusted values and the intervals
    (red team s47l: a lone sensitive cell always went down, its original then a / (1 - 0.3 f),
    to +-12 %; on the demo 3 of 7 directions decided, all right)."""
    key = _secret_key(job, "directions", identities.population, _rules_key(rules))
    return identities.uniforms(key, table.values[:, None])


def _largest_levels(found) -> tuple[np.ndarray, np.ndarray]:
    """The largest levels :func:`_secret_levels` can draw for the rules' ``found`` levels."""
    return found.upl * (1.0 + LEVEL_SPREAD), found.lpl * (1.0 + LEVEL_SPREAD)


def _rules_key(rules: Sequence) -> str:
    """The rules as text, numbers as floats: ``freq:10,30`` and ``FrequencyRule(10)`` are one
    rule, and key one factor. ``FrequencyRule.reach_threshold`` (s48d) is left out: it moves
    the levels of counts only, which these jobs refuse (:func:`_refuse_moved_counts`), and a
    key changed by it would draw a second factor for a job run again (red team s41c)."""

    def text(value) -> str:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return repr(float(value)) if number else repr(value)

    return ";".join(
        type(rule).__name__ + "(" + ",".join(f"{f.name}={text(getattr(rule, f.name))}"
                                             for f in fields(rule)
                                             if f.name != "reach_threshold") + ")"
        for rule in rules
    )  # fmt: skip


def _secret_key(job: Job, purpose: str, *keys: str) -> bytes:
    """A key from the database's PRF secret, the job's output name and ``keys``: secret, and
    the same for the same job."""
    store.ensure_secret(job.con)
    ((material,),) = job.con.execute(
        f"SELECT material FROM {store.S}.secrets WHERE name = 'prf'"
    ).fetchall()
    message = "\x1f".join([purpose, job.into, *keys]).encode()
    return hmac.new(bytes(material), message, hashlib.sha256).digest()


# ----------------------------------------------------------------------------- ipf helpers


def _ipf_tolerance(table: Table, given: pd.Series | None = None) -> float:
    """How far a raked margin may be from its target: IPF's convergence tolerance
    (:func:`~sqlsdc.tabular.ipf.rake`, 1e-9 of the largest target) plus float rounding of the
    margins recomputed from the inner cells."""
    top = float(np.abs(table.values).max(initial=0.0))
    if given is not None:
        top = max(top, float(np.abs(given.to_numpy()).max(initial=0.0)))
    return 2e-9 * max(1.0, top)


def _read_margins(margins) -> pd.DataFrame:
    """The margins as a DataFrame of strings (codes such as ``01`` stay codes)."""
    if isinstance(margins, pd.DataFrame):
        return margins
    path = Path(margins)
    if not path.exists():
        raise TabularError(f"margins file {path} does not exist")
    if not path.is_file():  # /dev/null exists: say what it is (test_cli_job_messages.py)
        raise TabularError(
            f"margins file {path} is {_file_kind(path)}, not a regular file; name a CSV file "
            "of margin cells"
        )
    if path.stat().st_size == 0:
        raise TabularError(
            f"margins file {path} is empty; it needs a header line (the table's dimensions "
            "and value) and a line per margin cell"
        )
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except (ValueError, pd.errors.ParserError) as e:
        raise TabularError(f"cannot read margins file {path}: {e}") from None


def _file_kind(path: Path) -> str:
    """What a path that is no regular file is, for messages: "a folder", "a character
    device"..."""
    mode = path.stat().st_mode
    kinds = [(stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"),
             (stat.S_ISSOCK, "a socket")]  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "a special file")


def _given_margins(table: Table, margins: pd.DataFrame) -> pd.Series:
    """The margins as target values indexed by cell position in ``table.cells``."""
    dims = list(table.dims)
    missing = [c for c in [*dims, "value"] if c not in margins.columns]
    if missing:
        raise TabularError(
            f"the margins need columns {dims + ['value']} (the stored table's dimensions, with "
            f"{table.total!r} on totals); missing {missing}"
        )
    values = pd.to_numeric(margins["value"], errors="coerce")
    if values.isna().any() or not np.isfinite(values).all():
        raise TabularError("every margin needs a finite numeric value")
    keys = pd.MultiIndex.from_frame(margins[dims].astype(str))
    index = pd.MultiIndex.from_frame(table.cells[dims].astype(str))
    pos = index.get_indexer(keys)
    if (pos < 0).any():
        bad = dict(zip(dims, keys[np.argmax(pos < 0)], strict=True))
        raise TabularError(f"margin {bad} is not a cell of the table (unknown code or empty)")
    if pd.Index(pos).duplicated().any():
        raise TabularError("the margins file gives a cell twice")
    inner = table.cells["is_inner"].to_numpy(bool)
    if inner[pos].any():
        bad = dict(zip(dims, keys[np.argmax(inner[pos])], strict=True))
        raise TabularError(f"{bad} is an inner cell; the margins file gives margins only")
    return pd.Series(values.to_numpy(np.float64), index=pos)


def _margin_groups(table: Table, given: pd.Series):
    """IPF groups and targets: each complete set of given margins of one depth pattern (the
    cells of such a set partition the inner cells)."""
    from sqlsdc.tabular.ipf import margin_partitions

    X = table.X.tocsc()
    groups, targets, used = [], [], []
    for cols in margin_partitions(table):
        have = np.isin(cols, given.index)
        if not have.any():
            continue
        if not have.all():
            gap = cols[np.argmax(~have)]
            cell = table.cells.iloc[gap][list(table.dims)].astype(str).to_dict()
            raise TabularError(
                f"the margins file gives {int(have.sum())} of the {cols.size} cells of one "
                f"margin, e.g. not {cell}; give every cell of a margin (or none)"
            )
        label = np.full(table.inner.size, -1, dtype=np.int64)
        rows, which = X[:, cols].nonzero()
        label[rows] = which
        groups.append(label)
        targets.append(given.loc[cols].to_numpy(np.float64))
        used.append(cols)
    if not groups:
        raise TabularError("the margins file gives no margin of the table")
    return groups, targets, np.concatenate(used)


def _rake_protected(table: Table, sensitive, upl, lpl, groups, targets, max_iter: int, kept):
    """Sensitive inner cells at safe values, the others raked to ``targets`` minus them:
    ``(all cells, IPF cycles, largest margin error, fixed cells)``. ``kept``: per cell, the
    side (+1, −1) of its original a replaced version published it on, 0 for none
    (:mod:`sqlsdc.jobs.replaced_sides`)."""
    from sqlsdc.tabular.ipf import rake

    seed = table.values[table.inner]
    plain, _, _, _ = rake(seed, groups, targets, max_iter=max_iter)
    fixed = sensitive[table.inner]
    safe = _safe_values(seed, plain, upl[table.inner], lpl[table.inner], table.negative,
                        kept[table.inner])  # fmt: skip
    free = ~fixed
    rest = []
    for g, t in zip(groups, targets, strict=True):
        r = t - np.bincount(g[fixed], safe[fixed], t.size)
        if (r < -1e-9 * max(1.0, float(np.abs(t).max()))).any():
            raise TabularError(
                "the sensitive cells at their safe values exceed a given margin; check the "
                "margins file or use --method cta"
            )
        rest.append(np.maximum(r, 0.0))
    fitted, iterations, error, converged = rake(
        seed[free], [g[free] for g in groups], rest, max_iter=max_iter
    )
    if not converged:
        raise TabularError(
            f"IPF did not converge in {max_iter} cycles (largest margin error {error:g}); the "
            "table's empty cells leave no table with these margins: check the margins"
        )
    inner = np.where(fixed, safe, 0.0)
    inner[free] = fitted
    cells = np.asarray(table.X.T @ inner, dtype=np.float64).ravel()
    return cells, iterations, error, int(fixed.sum())


def _safe_values(seed, plain, upl, lpl, negative: bool, kept) -> np.ndarray:
    """Safe values of the inner cells (used for the sensitive ones): where a plain raking moves
    the cell if that is at least a protection level away, else one level beyond the original in
    the same direction (upwards when downwards would cross 0 in a non-negative table). The
    direction is the side ``kept`` where it is set: the side a replaced version published."""
    up = np.where(kept != 0, kept > 0, plain >= seed)
    if not negative:
        up |= seed - lpl < 0
    target = np.where(up, seed + upl, seed - lpl)
    far = np.where(up, plain >= target, plain <= target)
    return np.where(far, plain, target)


def _check_protected(table: Table, published, found, *, given_cells) -> None:
    """Every sensitive cell not given as a (public) margin lies beyond its protection range."""
    a = table.values
    tol = 1e-9 * np.maximum(1.0, np.abs(a))
    safe = (published >= a + found.upl - tol) | (published <= a - found.lpl + tol)
    public = np.zeros(a.size, dtype=bool)
    public[given_cells] = True
    exposed = found.primary & ~safe & ~public
    if exposed.any():
        cells = table.cells.loc[exposed, list(table.dims)].astype(str).head(3)
        raise TabularError(
            f"{int(exposed.sum())} sensitive cell(s) end up inside their protection range "
            f"after raking, e.g. {cells.to_dict('records')}; give those margins in the file "
            "(if they are public) or use --method cta"
        )
