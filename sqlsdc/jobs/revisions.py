"""Revisions of an exact release: the difference between two versions of one population's
cells is a release of the units that changed in between, protected by the job's own rules.

A suppression job publishes exact cells, and readers keep every version of a job's table
(``--replace`` overwrites none of theirs) and every other output of the same population. After
new data, a cell published in two versions gives the difference of its two values, which is the
sum over the units added, removed or revised in between: red team s40d, one new enterprise
(turnover 1,234,567 in (C, R02)) and the grand total and R02's total, published in both
versions, differed by its exact turnover. Official statistics treats a revision so: the
difference table is a table of its own, and its sensitive cells are protected in the new
version (Hundepool et al. 2012, *Statistical Disclosure Control*, 4.5 "linked tables":
a cell derivable from published tables by subtraction is protected as a cell of the
difference; the previous version's published cells are fixed, as τ-ARGUS and sdcTable fix the
cells of a linked table published before).

So a suppression job keeps, per version, each unit's inner cell and contribution
(``sqlsdc.job_units``, keyed by the guard's canonical identity of the job's population,
:func:`sqlsdc.jobs.kept_cells.identify`, whatever the job's name), and before it builds its
pattern compares the data now with every version kept (:func:`revision_rule`):

- the difference population of a cell: the units whose contribution to it changed, added to
  it, removed from it or revised within it (a unit moved between two inner cells of one
  margin with the same contribution leaves that margin unchanged);
- the job's rules applied to it: frequency on its units, dominance and p% on the absolute
  changes ``|x_new - x_old|`` (the τ-ARGUS treatment of signed contributions by a shadow of
  their magnitudes), and for a sum the frequency rule on its unit count ``n`` as well (the
  units that entered or left the cell, which the published ``n`` differences count);
- a cell that fails is a primary of the new version with the difference's protection levels:
  the earlier value of a cell is a constant its readers hold, so an interval of the new value
  is the same interval of the difference. Cells published before with the value they have now
  are public (:func:`sqlsdc.jobs.earlier_suppressions.earlier_suppressions` forces them), so
  the new pattern protects the difference with the cells that changed.

Only the units' inner cells and contributions are kept, in the catalog of the database that
holds the microdata; no reader sees them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, replace
from itertools import product
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from sqlglot import exp

from sqlsdc.errors import Error
from sqlsdc.jobs.stored_tables import same_rows, share_cells
from sqlsdc.jobs.tabulation import JobSpec, job_source, measure_sum, parse_job
from sqlsdc.tabular.model import Table
from sqlsdc.tabular.rules import (
    CellStats,
    FrequencyRule,
    ManualRule,
    RuleResult,
    apply_rules,
    required_top_k,
)

if TYPE_CHECKING:
    from sqlsdc.jobs.job import Job

S = "sqlsdc"  # the catalog schema, as sqlsdc.catalog.schema's
UNIT, X = "__unit", "__x"  # the unit rows' unit and contribution columns


@dataclass(frozen=True)
class Units:
    """A job's units now: ``population`` (canonical identity), ``frame`` with one row per unit
    (``unit`` as text, ``cell``: its codes by dimension name as JSON, ``value``)."""

    population: str
    frame: pd.DataFrame


@dataclass(frozen=True)
class RevisionRule:
    """The cells whose difference from an earlier version fails the job's rules, with that
    difference's protection levels (a primary rule of the new version)."""

    cells: np.ndarray
    upl: np.ndarray
    lpl: np.ndarray
    versions: int  # how many earlier versions were compared
    alike: int = 0  # how many of them keep the job's rows (else its outputs' changes decide)
    name: str = "revision"
    counts: RevisionRule | None = None  # a sum's cells whose n fails, alone (:func:`counts_of`)

    def evaluate(self, stats: CellStats) -> RuleResult:
        return RuleResult(self.cells.copy(), self.upl.copy(), self.lpl.copy())


def units_sql(spec: JobSpec) -> str:
    """One row per unit the job counts: the unit (as text), its codes and its contribution
    (``SUM(measure)``, 0 when NULL; 1 for a count)."""
    unit = exp.column(spec.unit)
    if spec.measure:
        x = exp.Coalesce(this=measure_sum(spec), expressions=[exp.Literal.number(0)])
    else:
        x = exp.Literal.number(1)
    query = exp.select(
        exp.alias_(exp.cast(unit, "VARCHAR"), UNIT, quoted=True),
        *(exp.alias_(exp.column(d), d, quoted=True) for d in spec.dims),
        exp.alias_(x, X, quoted=True),
    )
    query = job_source(query, spec)
    if spec.where is not None:
        query = query.where(spec.where.copy())
    return query.group_by(unit.copy(), *(exp.column(d) for d in spec.dims)).sql("duckdb")


def job_units(job: Job, population: str) -> Units:
    """The job's units now (:func:`units_sql`), their codes as text as the table's cells hold
    them (:func:`sqlsdc.jobs.tabulation.cells_table`)."""
    frame = job.con.sql(units_sql(job.spec)).df()
    dims = list(job.spec.dims)
    codes = frame[dims].astype(str).to_numpy()
    cells = [json.dumps(dict(zip(dims, row, strict=True)), separators=(",", ":")) for row in codes]
    out = pd.DataFrame({
        "unit": frame[UNIT].astype(str).to_numpy(),
        "cell": cells,
        "value": pd.to_numeric(frame[X], errors="coerce").fillna(0.0).to_numpy(np.float64),
    })  # fmt: skip
    return Units(population, out)


def record_units(job: Job, units: Units) -> None:
    """Keep the job's units as this version holds them; run inside the storing transaction."""
    con = job.con
    if not _kept(con):  # a catalog opened by an older sqlsdc since: kept from the next opening
        return
    con.register("__job_units", units.frame)
    try:
        con.execute(
            f"INSERT INTO {S}.job_units SELECT ?, ?, unit, cell, value FROM __job_units",
            [units.population, job.query_id],
        )
    finally:
        con.unregister("__job_units")


def revision_rule(job: Job, table: Table, rules, units: Units) -> RevisionRule | None:
    """The cells of ``table`` whose difference from any earlier version of the same population
    fails ``rules`` (see the module), or None when no earlier version is kept."""
    if not _kept(job.con):
        return None
    compared, alike, counted = _compared_versions(job, units.population)
    if not compared and not counted:
        return None
    earlier = job.con.execute(
        f"SELECT query_id, unit, cell, value FROM {S}.job_units WHERE list_contains(?, query_id)",
        [compared + counted],
    ).df()
    rules = [r for r in rules if not isinstance(r, ManualRule)]  # the job's cells, not these
    frequency = [r for r in rules if isinstance(r, FrequencyRule)]
    count = len(table.cells)
    both, of_n = _Levels(count), _Levels(count)  # the sum's and n's; n's alone
    versions, levels, top_k = 0, _levels(job, table), required_top_k(rules)
    for query_id, before in earlier.groupby("query_id", sort=True):
        versions += 1
        if query_id not in compared:  # another measure's version: its units' counts only
            _, members = _differences(table, levels, before.assign(value=1.0),
                                      units.frame.assign(value=1.0), 0)  # fmt: skip
            counts_only = (both,) if job.spec.measure is None else (of_n,)
            found = [(members, frequency, counts_only)] if frequency else []
        else:
            changes, members = _differences(table, levels, before, units.frame, top_k)
            found = [(changes, rules, (both,))]
            if job.spec.measure is not None and frequency:
                found.append((members, frequency, (both, of_n)))
        for stats, applied, more in found:
            if stats is None:
                continue
            result = apply_rules(stats, applied)
            hit = result.primary & (stats.n > 0)
            for kept in more:
                kept.add(hit, result.upl, result.lpl)
    counts = None
    if job.spec.measure is not None and frequency:
        counts = RevisionRule(of_n.cells, of_n.upl, of_n.lpl, versions, alike,
                              name="revision (n)")  # fmt: skip
    return RevisionRule(both.cells, both.upl, both.lpl, versions, alike, counts=counts)


def _compared_versions(job: Job, population: str) -> tuple[list[int], int, list[int]]:
    """The kept versions (query ids) a job of ``population`` is compared with, how many of
    them are of its own rows, and the versions of another aggregate compared by their units'
    counts only: those of the same canonical population, and those of another population of
    the same table and aggregate that shares cells with the job in the data now
    (:func:`~sqlsdc.jobs.stored_tables.share_cells`, as the pattern checks pair outputs).

    Every job publishes its cells' unit counts (a count job its values, a sum job its ``n``),
    so a version of the same table under another aggregate (a sum job beside a count job, or
    turnover beside employees) is compared too, by the units that entered or left each cell
    (red team s43d: a sum job showed (C, R02)'s 12 enterprises, one entered, and a count job
    of the same rows stored after it showed 13, with 196 and 1,001 in its row and grand
    total: the new firm's cell). Its cells are matched by units (``share_cells`` of counts).

    Red team s42k: compared with its own canonical population only, a job of ``WHERE
    turnover > 0`` (every enterprise: the same rows, stored beside the job without WHERE)
    was compared with its own earlier version alone; with five firms entering between the
    other job's two versions and one more before its own, the grand totals of the two latest
    versions differed by that one firm's turnover. A version of other rows whose cells the job
    does not share (``year = 2025`` beside ``year = 2026``) is not compared: a new period is a
    population of its own."""
    rows = job.con.execute(
        f"SELECT DISTINCT k.query_id, k.population, v.sql_text FROM {S}.job_units AS k "
        f"LEFT JOIN {S}.output_versions AS v USING (query_id) ORDER BY k.query_id"
    ).fetchall()
    mine = json.loads(population)
    compared, alike, counted = [], 0, []
    for query_id, theirs, sql in rows:
        if theirs == population:
            compared.append(query_id)
            alike += 1
            continue
        described = json.loads(theirs)
        if described.get("table") != mine["table"]:
            continue
        other = described.get("measure") != mine["measure"]
        try:
            spec = parse_job(sql, job.policy, stored=True)
        except (Error, TypeError):  # no definition kept, or one no longer read: compared
            (counted if other else compared).append(query_id)
            continue
        if other:
            if share_cells(job.con, replace(spec, measure=None), replace(job.spec, measure=None)):
                counted.append(query_id)
        elif same_rows(job.con, job.spec.table, spec.where, job.spec.where):
            compared.append(query_id)
            alike += 1
        elif share_cells(job.con, spec, job.spec):
            compared.append(query_id)
    return compared, alike, counted


class _Levels:
    """The cells a revision rule flags and their largest levels over the versions compared."""

    def __init__(self, count: int) -> None:
        self.cells = np.zeros(count, dtype=bool)
        self.upl, self.lpl = np.zeros(count), np.zeros(count)

    def add(self, hit: np.ndarray, upl: np.ndarray, lpl: np.ndarray) -> None:
        self.cells |= hit
        self.upl = np.where(hit, np.maximum(self.upl, upl), self.upl)
        self.lpl = np.where(hit, np.maximum(self.lpl, lpl), self.lpl)


def counts_of(revised: RevisionRule | None) -> RevisionRule | None:
    """The revision rule of a sum job's unit counts ``n`` alone: the cells whose units that
    entered or left fail the frequency rule, with that difference's levels (in units).

    A cell published before with the sum it has now is public for its sum, and exempt from
    the sums' rules (:func:`~sqlsdc.tabular.universe_pattern.exempt_known`), but not for its
    ``n``: red team s42i, one enterprise of turnover 0 more in (M, R02), and four cells
    published in both versions with the same sums told it by their ``n``, 14 -> 15 and so on.
    The counts' pattern (:func:`sqlsdc.jobs.sum_counts.audit_counts`) applies this rule to
    every cell, known sums included."""
    return None if revised is None else revised.counts


def unknown_revisions(rules, difference: np.ndarray | None) -> RevisionRule | None:
    """Without kept units (outputs stored before ``sqlsdc.job_units`` existed), the
    difference population of a changed cell is unknown: every cell published before whose
    value changed (``difference``, :func:`~sqlsdc.jobs.earlier_suppressions.changed_published`)
    is a primary, with the frequency rule's levels on its difference (fail closed)."""
    if difference is None:
        return None
    changed = ~np.isnan(difference) & ~np.isclose(difference, 0.0, rtol=0.0, atol=1e-9)
    if not changed.any():
        return None
    ranges = [r.safety_range for r in rules if isinstance(r, FrequencyRule)] or [30.0]
    level = np.where(changed, np.maximum(np.abs(np.nan_to_num(difference)) * max(ranges) / 100.0,
                                         1.0), 0.0)  # fmt: skip
    return RevisionRule(changed, level, level.copy(), 0)


def version_changes(
    job: Job, table: Table, query_id: int, units: Units
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per cell of ``table``, the change since the version stored by ``query_id`` (net, and
    whether some unit's contribution grew, whether some unit's shrank), or None when that
    version's units were not kept (:mod:`sqlsdc.jobs.revision_audit` reads it)."""
    if not _kept(job.con):
        return None
    before = job.con.execute(
        f"SELECT unit, cell, value FROM {S}.job_units WHERE query_id = ?", [query_id]
    ).df()
    if before.empty:
        return None
    count = len(table.cells)
    changes, _ = _differences(table, _levels(job, table), before, units.frame, 0)
    if changes is None:
        return np.zeros(count), np.zeros(count, bool), np.zeros(count, bool)
    net, size = changes.value, changes.total
    tol = 1e-9 * np.maximum(1.0, size)
    return net, (size + net) / 2.0 > tol, (size - net) / 2.0 > tol


def combined(first: RevisionRule | None, second: RevisionRule | None) -> RevisionRule | None:
    """Both rules' cells, with the larger of their levels (None when both are None)."""
    if first is None or second is None:
        return first if second is None else second
    return RevisionRule(first.cells | second.cells, np.maximum(first.upl, second.upl),
                        np.maximum(first.lpl, second.lpl), first.versions + second.versions,
                        first.alike + second.alike, first.name,
                        combined(first.counts, second.counts))  # fmt: skip


def with_counts(
    revised: RevisionRule | None, counts: RevisionRule | None, cells: int
) -> RevisionRule | None:
    """``revised`` (or a rule flagging no cell) with ``counts`` as its rule of a sum's unit
    counts (:func:`counts_of`), for a catalog that kept no units: a changed ``n`` of a cell
    whose sum did not change is revised too (fail closed)."""
    if counts is None:
        return revised
    if revised is None:
        none = np.zeros(cells)
        revised = RevisionRule(np.zeros(cells, dtype=bool), none, none.copy(), 0)
    # a cell whose sum changed is a primary of the sums already, hidden with its n: flagging
    # its n too, with levels on a difference of populations that may share nothing but the
    # name (a replacement of R01's table by R02's), grew the two patterns without end
    alone = counts.cells & ~revised.cells
    counts = replace(counts, cells=alone, upl=np.where(alone, counts.upl, 0.0),
                     lpl=np.where(alone, counts.lpl, 0.0), name="revision (n)")  # fmt: skip
    return replace(revised, counts=combined(revised.counts, counts))


def _differences(
    table: Table, levels: dict, before: pd.DataFrame, now: pd.DataFrame, top_k: int
) -> tuple[CellStats | None, CellStats | None]:
    """Per cell of ``table``, the difference population between the units ``before`` and
    ``now``: its contributions' statistics (units whose contribution to the cell changed,
    the net change, the sum and the largest of their absolute changes) and those of the unit
    count (units that entered or left the cell). None, None when no unit changed."""
    old = before[["unit", "cell", "value"]].rename(columns={"cell": "c0", "value": "x0"})
    new = now[["unit", "cell", "value"]].rename(columns={"cell": "c1", "value": "x1"})
    both = old.merge(new, on="unit", how="outer")
    same = (both.c0 == both.c1) & np.isclose(both.x0, both.x1, rtol=1e-12, atol=0.0)
    changed = both[~same.fillna(False).astype(bool)]
    if changed.empty:
        return None, None
    dims = list(table.dims)
    position = {
        tuple(row): i for i, row in enumerate(table.cells[dims].astype(str).itertuples(index=False))
    }
    available = _dims_of(before) & _dims_of(now)
    delta: dict[tuple[int, str], float] = defaultdict(float)
    member: dict[tuple[int, str], int] = defaultdict(int)
    for row in changed.itertuples(index=False):
        for code, x, sign in ((row.c0, row.x0, -1), (row.c1, row.x1, 1)):
            if not isinstance(code, str):
                continue  # the unit was not counted on this side
            for at in _covering(json.loads(code), dims, levels, available, table.total, position):
                delta[at, row.unit] += sign * x
                member[at, row.unit] += sign
    return (
        _stats(table, delta, top_k),
        _stats(table, {k: float(v) for k, v in member.items()}, 0),
    )


def _stats(table: Table, changes: dict[tuple[int, str], float], top_k: int) -> CellStats:
    """Rule inputs per cell from each unit's change to it (changes of 0 are no change)."""
    count = len(table.cells)
    n = np.zeros(count, dtype=np.int64)
    net, size = np.zeros(count), np.zeros(count)
    per_cell: dict[int, list[float]] = defaultdict(list)
    for (at, _unit), change in changes.items():
        if abs(change) <= 1e-9 * max(1.0, abs(change)):
            continue
        n[at] += 1
        net[at] += change
        size[at] += abs(change)
        per_cell[at].append(abs(change))
    top = None
    if top_k:
        top = np.zeros((count, top_k))
        for at, found in per_cell.items():
            largest = sorted(found, reverse=True)[:top_k]
            top[at, : len(largest)] = largest
    return CellStats(n=n, value=net, total=size, top=top, cells=table.cells)


def _kept(con) -> bool:
    """Whether the catalog has ``job_units`` (one no job has opened since it was added has
    not)."""
    return bool(
        con.execute(
            "SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() "
            "AND schema_name = ? AND table_name = 'job_units'",
            [S],
        ).fetchall()
    )


def _levels(job: Job, table: Table) -> dict[str, list[str]]:
    """Per dimension of ``table``, the job's columns that code it, fine to coarse (a folded
    hierarchy's levels, :func:`sqlsdc.jobs.tabulation.table_dims`: a municipality code in
    inner cells, its region's in subtotals)."""
    spec = job.spec
    hierarchies = job.policy.table(spec.table).hierarchies
    out = {}
    for d in table.dims:
        if d in spec.dims:
            out[d] = [d]
        else:
            out[d] = [c for c in reversed(list(hierarchies[d])) if c in spec.dims]
    return out


def _dims_of(before: pd.DataFrame) -> set[str]:
    """The dimension names an earlier version's unit rows code (every row codes the same)."""
    return set(json.loads(before["cell"].iloc[0])) if len(before) else set()


def _covering(codes: dict, dims, levels, available, total: str, position) -> list[int]:
    """The positions of the cells a unit with ``codes`` counts in: per dimension its codes
    fine to coarse and the total (a dimension ``available`` on both sides only)."""
    chains = []
    for d in dims:
        chain = [codes[c] for c in levels[d] if c in available and c in codes]
        chains.append([*chain, total])
    return [position[cell] for cell in product(*chains) if cell in position]
