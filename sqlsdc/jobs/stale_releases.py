"""Exact releases published before the data changed: what a new release makes of their change.

The differencing checks (:mod:`sqlsdc.jobs.differencing`, :mod:`sqlsdc.jobs.isolated_groups`,
:mod:`sqlsdc.jobs.dominated_groups`) compare every stored output as the data now gives it. A
job's output published before new data were loaded holds the values of then: its published
cell is the cell now less the change in between (the units that entered, left or were revised,
each unit's change of contribution). Red team s46b: turnover of R02 by region, then a new R02
firm, then turnover of R02 and R03 by size class and of R03 by region: on the data now T2 - T3
- T1 is nothing, but T1 holds the data of before, so T2 - T3 - T1 was the new firm's 7,654,321
exactly (or, for a revised firm, its change of 1,111,111), 3 jobs, 0 queries.

So a new exact release is judged against what earlier ones published (Hundepool et al. 2012,
*Statistical Disclosure Control*, 4.5 "linked tables": a cell derivable by subtraction is a
cell of its own; :mod:`sqlsdc.jobs.revisions` treats a revision's difference so). A stale
release X (``sqlsdc.job_units`` keeps each unit's inner cell and contribution per version of a
suppression, rounding, CTA or IPF job, so its changed units are known) is the sum of its Venn
regions now less its change Δ. In every cell the three-table checks look at
(:func:`~sqlsdc.jobs.isolated_groups.passes`, with two releases too), a signed sum of the
releases that cancels every region now and takes X is Δ in that cell (mixed with the other
stale releases' changes when it takes them too: counted as Δ, the safe side). When such a sum
takes the new release, Δ there is judged as a cell: the frequency rule on the units whose
contribution changed, and for a sum the job's rules on their absolute changes (as the revision
rule judges them). Also when another sum gave it before: that one may run through a cell a
pattern hides, such as the re-run of X itself, whose revision rule hid the change. A pair of
the new release and X over the same units in the cell is a revision of that cell, which the
revision rules of the job already judge (its pattern hides the cell, and the differencing
checks cannot know it would): left to them.

An anonymised file keeps no units (red team s47c: a file of R02's firms, region exact and
turnover as it is, then a new R02 firm, then turnover of R02 by region: T1 less the file's
records was the firm's 7,654,321; with R02 and R03 by size class and R03 by region, T2 - T3
less the file, 1 file and 2 jobs). Its records are compared with the rows its population
holds now, cell by cell of its exact columns (count, and the sum of the aggregate's column as
the file holds it, :func:`_stale_files`); a file whose records differ is stale, its change
unknown by unit, so a new release that gives it in a cell where its records differ is refused
whatever the change. A file and a release over the same units in a cell are no revision either
(no revision rule judges a file): also refused there. And a new file over the same units as a
stale job's cell is judged as any other sum (no revision rule judges the file).

Not covered: outputs stored before ``job_units`` existed, and earlier versions of files whose
records readers keep but the database no longer does: their change is unknown here.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
from sqlglot import exp

from sqlsdc.jobs.exact_release import Release, kept
from sqlsdc.jobs.isolated_groups import _left_null, passes, venn_regions
from sqlsdc.jobs.output_history import earlier_versions
from sqlsdc.jobs.revisions import UNIT, X, units_sql
from sqlsdc.jobs.revisions import _kept as _units_kept
from sqlsdc.jobs.stored_tables import exact_tables
from sqlsdc.tabular.rules import CellStats, FrequencyRule, apply_rules, required_top_k

S = "sqlsdc"  # the catalog schema, as sqlsdc.catalog.schema's
COUNTS = " (its counts n)"  # the suffix of a suppression job's counts (stored_tables)


def refuse_stale_differences(
    con, policy, spec, others: list[Release], least: int, rules, label: str, error,
    *, revisions: bool = True,
) -> None:  # fmt: skip
    """Raise ``error`` when the new exact release ``spec`` (``label``), with ``others``, gives
    in some cell the change since a stale release of ``others`` was published, and that change
    fails the frequency rule (``least`` units) or, for a sum, ``rules``; or, for a stale file,
    any change (see the module). ``revisions``: whether the new release's revision rules judge
    a stale job's cell over the same units (a job's do; a file has none)."""
    changes = _stale_changes(con, policy, spec, others)
    files = _stale_files(con, spec, others)
    if not changes and not files:
        return  # the ordinary case: no release published before the data changed
    releases = [(label, spec.where, tuple(spec.dims))]
    releases += [(o.label, o.where, tuple(o.dims)) for o in others]
    rules = [r for r in rules if not isinstance(r, FrequencyRule)] if spec.measure else []
    top_k = required_top_k(rules)
    for fixed, taking, name in passes(con, spec, releases):
        stale = [j for j, r in enumerate(taking) if r[0] in changes]
        gone = [j for j, r in enumerate(taking) if r[0] in files]
        if len(taking) < 2 or not (stale or gone) or taking[0][0] != label:
            continue
        cut = _cut(taking[0][1]) if name else None
        if name and cut is None:  # a merged cell not told apart: its change unknown
            raise error(_message(spec, label, taking, stale[0], name, "its cell unknown"))
        wheres = [r[1] for r in taking]
        for cell, regions in venn_regions(con, spec, fixed, wheres).items():
            masks = list(regions)
            matrix = np.array([[m >> j & 1 for m in masks] for j in range(len(taking))], float)
            where = dict(zip(fixed, cell, strict=True))
            for j in _newly_given(matrix, gone, revisions=False):
                if any(_inside(codes, where, cut) for codes in files[taking[j][0]]):
                    named = name or ", ".join(f"{d} = {v!r}" for d, v in where.items())
                    raise error(_file_message(spec, label, taking, j, named or "total"))
            for j in _newly_given(matrix, stale, revisions=revisions):
                found = _change_in(changes[taking[j][0]], dict(zip(fixed, cell, strict=True)), cut)
                if not found:
                    continue
                flagged = _flagged(found, least, rules, top_k)
                if flagged is not None:
                    named = name or ", ".join(
                        f"{d} = {v!r}" for d, v in zip(fixed, cell, strict=True)
                    )
                    raise error(_message(spec, label, taking, j, named or "total", flagged))


def _newly_given(matrix: np.ndarray, stale: list[int], *, revisions: bool = True) -> list[int]:
    """The stale releases (row indexes) whose change a signed sum that cancels every region
    now and takes the new release (row 0) gives: one with both coefficients non-zero exists
    when neither is zero on every such sum (a vector space is no union of two proper
    subspaces). A sum without the new release is not its doing, and one given before it
    through a release whose pattern hides the cell still gives it: not skipped. The new
    release and a stale one over the same units are a revision of the cell, left to the
    revision rules of the job, which compare it with the stale release's kept units (unless
    ``revisions`` is false: a new file, or a stale file, which no revision rule judges); a
    release that holds no unit of the cell now adds nothing to a sum there."""
    if not matrix[0].any():
        return []  # the new release holds no unit of the cell: it gives nothing there
    sums = _left_null(matrix)
    if sums.shape[1] == 0 or not np.any(np.abs(sums[0]) > 1e-9):
        return []
    return [
        j
        for j in stale
        if matrix[j].any()  # a release of no unit there now published its change itself
        and np.any(np.abs(sums[j]) > 1e-9)
        and not (revisions and np.array_equal(matrix[0], matrix[j]))
    ]


def _cut(where: exp.Expr) -> tuple[str, set[str]] | None:
    """A merged cell's dimension and values, from the cut ``passes`` added to a population."""
    cut = where.expression if isinstance(where, exp.And) else None
    if not isinstance(cut, exp.In) or not isinstance(cut.this, exp.Column):
        return None
    return cut.this.name, {str(v.to_py()) for v in cut.expressions}


def _change_in(units: pd.DataFrame, cell: dict, cut) -> dict[str, float]:
    """Each changed unit's change of contribution to the cell (``cell``: dimension -> value,
    and the merged cell's ``cut``); a dimension a release does not code holds one value of
    its population, so every unit of it is in the cell."""
    found: dict[str, float] = {}
    for row in units.itertuples(index=False):
        change = 0.0
        for codes, x, sign in ((row.c0, row.x0, -1.0), (row.c1, row.x1, 1.0)):
            if isinstance(codes, str) and _inside(json.loads(codes), cell, cut):
                change += sign * x
        if abs(change) > 1e-9 * max(1.0, abs(row.x0 or 0.0), abs(row.x1 or 0.0)):
            found[row.unit] = change
    return found


def _inside(codes: dict, cell: dict, cut) -> bool:
    """Whether a unit of these codes (JSON of the codes as text) lies in ``cell`` and ``cut``.
    A NULL code of a number column is NaN in them (pandas' nullable integers), of a text
    column 'None': both are the cell None, as the engine gives it (red team s47c: a new
    person of NULL age was no change of the NULL-age cell)."""
    codes = {d: c if isinstance(c, str) else "None" for d, c in codes.items()}
    if any(d in codes and codes[d] != str(v) for d, v in cell.items()):
        return False
    return cut is None or cut[0] not in codes or codes[cut[0]] in cut[1]


def _flagged(changes: dict[str, float], least: int, rules, top_k: int) -> str | None:
    """The rule a cell of these changes fails (frequency on the units, ``rules`` on their
    absolute changes), or None."""
    sizes = np.abs(np.fromiter(changes.values(), dtype=np.float64))
    if len(sizes) < least:
        return f"freq({least})"
    if not rules:
        return None
    largest = sorted(sizes, reverse=True)[:top_k]
    stats = CellStats(
        n=np.array([len(sizes)]),
        value=np.array([float(sum(changes.values()))]),
        total=np.array([float(sizes.sum())]),
        top=np.array([list(largest) + [0.0] * (top_k - len(largest))]),
    )
    result = apply_rules(stats, rules)
    return str(result.rule[0]) if result.primary[0] else None


def _stale_changes(con, policy, spec, others: list[Release]) -> dict[str, pd.DataFrame]:
    """Per label of ``others`` whose units were kept and changed since it was stored, its
    changed units: ``unit``, old and new cell codes ``c0``/``c1`` (NaN where the unit was not
    counted) and contributions ``x0``/``x1`` (1 per unit for counts)."""
    if not _units_kept(con):
        return {}
    labels = {o.label for o in others}
    versions = _versions(con)
    found = {}
    for label, theirs in exact_tables(con, policy, spec.table):
        base = label.removesuffix(COUNTS)
        if label not in labels or base not in versions:
            continue
        theirs = replace(theirs, measure=None) if label.endswith(COUNTS) else theirs
        before = con.execute(
            f"SELECT unit, cell, value FROM {S}.job_units WHERE query_id = ?", [versions[base]]
        ).df()
        if before.empty:
            continue
        changed = _changed(before, _units_now(con, theirs), counts=theirs.measure is None)
        if not changed.empty:
            found[label] = changed
    return found


def _units_now(con, spec) -> pd.DataFrame:
    """The units a release of ``spec`` counts in the data now, as ``job_units`` keeps them."""
    frame = con.sql(units_sql(spec)).df()
    dims = list(spec.dims)
    codes = frame[dims].astype(str).to_numpy()
    return pd.DataFrame({
        "unit": frame[UNIT].astype(str).to_numpy(),
        "cell": [json.dumps(dict(zip(dims, r, strict=True)), separators=(",", ":")) for r in codes],
        "value": pd.to_numeric(frame[X], errors="coerce").fillna(0.0).to_numpy(np.float64),
    })  # fmt: skip


def _changed(before: pd.DataFrame, now: pd.DataFrame, counts: bool) -> pd.DataFrame:
    old = before.rename(columns={"cell": "c0", "value": "x0"})
    new = now.rename(columns={"cell": "c1", "value": "x1"})
    if counts:
        old, new = old.assign(x0=1.0), new.assign(x1=1.0)
    both = old.merge(new, on="unit", how="outer")
    same = (both.c0 == both.c1) & np.isclose(both.x0, both.x1, rtol=1e-12, atol=0.0)
    changed = both[~same.fillna(False).astype(bool)]
    return changed.assign(x0=changed.x0.fillna(0.0), x1=changed.x1.fillna(0.0))


def _versions(con) -> dict[str, int]:
    """Label -> query id of every stored output and earlier version readers hold."""
    found = {
        name: int(query_id)
        for name, query_id in con.execute(f"SELECT name, query_id FROM {S}.outputs").fetchall()
        if query_id is not None
    }
    found.update({v.label: v.query_id for v in earlier_versions(con)})
    return found


def _message(spec, label: str, taking, j: int, named: str, rule: str) -> str:
    stale, rest = taking[j][0], _rest(taking, j)
    return (
        f"{stale} was published before the data of {spec.table} changed, and with {rest}, "
        f"{label} would give its cell ({named}) as the data now give it: less the value "
        f"{stale} published, that is the change in between (the units that entered, left or "
        f"were revised there), which the rules ({rule}) flag as a cell of its own. Readers "
        f"keep {stale} as it was published, so re-running or dropping it does not help: "
        "tabulate a population whose cells and the others' do not add up to that cell of "
        f"{stale} (e.g. one that also holds the units around it, or none of them)"
    )


def _stale_files(con, spec, others: list[Release]) -> dict[str, list[dict]]:
    """Per label of the stored files of ``others`` whose records are no longer the rows their
    population holds now, the cells where they differ: each as its codes by the table's
    dimension a plain exact column holds (a recoded one left out: the cell matches every
    value there, the safe side). Compared per combination of the file's exact columns: the
    number of records, and for a sum the total of the file's column of the measure (as the
    file holds it: top-coded, the table's values top-coded alike)."""
    found = {}
    for other in others:
        if other.exact is None or other.records is None or other.sums is None:
            continue  # a table (its kept units judge it), or a file not comparable here
        measure = None
        if spec.measure is not None and spec.measure.lower() not in other.blanked:
            measure = next((pair for pair in other.sums if _reads(pair[1], spec.measure)), None)
        differing = _differing_cells(con, spec.table, other, measure)
        if differing:
            found[other.label] = differing
    return found


def _reads(expression: exp.Expr, column: str) -> bool:
    return any(c.name.lower() == column.lower() for c in expression.find_all(exp.Column))


def _differing_cells(con, table: str, file: Release, measure) -> list[dict]:
    """The cells (codes by plain dimension) where ``file``'s records and the rows of its
    population now differ in count or in the sum of ``measure`` (``(file column, table
    expression)`` or None). A cut a local suppression blanked in some records is left out
    (its blanked records would differ from the data in any case): the cells of the others."""
    text = exp.DataType.build("VARCHAR")
    cuts = [(n, e) for n, e in file.exact
            if not any(c.name.lower() in file.blanked for c in e.find_all(exp.Column))]  # fmt: skip

    def select(keys, total, source, where):
        columns = [exp.cast(k, text).as_(f"__k{i}") for i, k in enumerate(keys)]
        columns.append(exp.Count(this=exp.Star()).as_("__n"))
        columns.append(exp.Sum(this=total).as_("__s") if total is not None else exp.null())
        query = exp.select(*columns).from_(source)
        if where is not None:
            query = query.where(where)
        if keys:
            query = query.group_by(*(exp.column(f"__k{i}") for i in range(len(keys))))
        return {tuple(row[:-2]): row[-2:] for row in con.execute(query.sql("duckdb")).fetchall()}

    stored = select(
        [exp.column(name, quoted=True) for name, _e in cuts],
        exp.column(measure[0], quoted=True) if measure else None,
        file.records.copy(),
        None,
    )
    now = select(
        [e.copy() for _n, e in cuts],
        measure[1].copy() if measure else None,
        exp.table_(table),
        kept(file.where),
    )
    plain = [e.name if isinstance(e, exp.Column) else None for _n, e in cuts]
    differing = []
    for key in stored.keys() | now.keys():
        (n0, s0), (n1, s1) = stored.get(key, (0, None)), now.get(key, (0, None))
        same = n0 == n1 and (s0 is None) == (s1 is None)
        if same and s0 is not None:
            same = bool(np.isclose(float(s0), float(s1), rtol=1e-9, atol=1e-6))
        if not same:
            differing.append({d: v for d, v in zip(plain, key, strict=True) if d is not None})
    return differing


def _rest(taking, j: int) -> str:
    """The releases of a sum but the new one (first) and the stale one (``j``), for a message."""
    return ", ".join(r[0] for i, r in enumerate(taking[1:], start=1) if i != j) or "nothing else"


def _file_message(spec, label: str, taking, j: int, named: str) -> str:
    stale, rest = taking[j][0], _rest(taking, j)
    return (
        f"{stale} was published before the data of {spec.table} changed (its records are no "
        f"longer the rows its population holds), and with {rest}, {label} would give its cell "
        f"({named}) as the data now give it: less {stale}'s records there, that is the change "
        "in between (the units that entered, left or were revised), which a file, keeping no "
        f"units, cannot have judged by the rules. Readers keep {stale} as it was published, so "
        "re-running or dropping it does not help: tabulate a population whose cells and the "
        f"others' do not add up to that cell of {stale} (e.g. one that also holds the units "
        "around it, or none of them)"
    )
