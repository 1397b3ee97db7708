"""Protection of a suppression universe (:mod:`sqlsdc.tabular.universe`): its pattern, made by
:func:`sqlsdc.tabular.protect` on the universe's inner cells, carrying over what earlier
patterns released.

A module of its own, apart from the universe's declaration: the query path reads stored
patterns and protects a universe anew only when its data or rules changed, so it imports this
module (the table model, the solvers, pandas and scipy) only then, not at every start-up
(new user s40j).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sqlsdc.errors import TabularError
from sqlsdc.tabular.api import protect
from sqlsdc.tabular.joint_audit import Side, widening
from sqlsdc.tabular.model import TOTAL, Hierarchy, Table
from sqlsdc.tabular.rules import ManualRule, RuleResult
from sqlsdc.tabular.universe import (
    CONTRIBUTORS,
    COUNT,
    EVERY,
    LEVEL,
    SEEN,
    SPREAD,
    STATUS,
    VALUE,
    Universe,
    top_k,
)
from sqlsdc.tabular.universe_revisions import (
    count_changes,
    revision_rule,
    seen_values,
    with_published,
)

EARLIER = "earlier release"


def suppression_pattern(table: Table, rules, **options) -> pd.DataFrame:
    """The suppression pattern of one table: :func:`sqlsdc.tabular.protect` (primary rules,
    secondary suppression, audit) with ``value`` and ``n`` NULL in every cell that is not
    published. The one place that decides what a cell under suppression shows, for the query
    path (:func:`protect_universe`) and for protection jobs (:mod:`sqlsdc.jobs.protect`).

    ``options`` are those of :func:`~sqlsdc.tabular.protect` (``method``, ``cost``,
    ``primary``, ``forced``, ``time_limit``, ...). The result keeps ``status``, ``rule``, the
    protection levels and the audited interval ``lo``/``hi`` for the producer, and the audit
    report in ``attrs["audit"]``; rows are in the table's cell order.
    """
    result = protect(table, rules=list(rules), **options)
    published = result["status"] == "published"
    result["value"] = result["value"].where(published)
    result["n"] = result["n"].where(published)
    return result


def protect_universe(
    universe: Universe, cells: pd.DataFrame, earlier: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, dict]:
    """Protect every aggregate of the universe; return the pattern and a report.

    Each aggregate is protected as a table of its own (:func:`_protect_once`); then the
    attacker's LP over the counts and each bounded measure together
    (:mod:`sqlsdc.tabular.joint_audit`) checks every primary: where it leaves one short, the
    cells it picks are hidden (count and sum) and both tables protected again, until the joint
    LP finds none short (red team s45g); a pattern still short after :data:`JOINT_ROUNDS`
    rounds, or with a short primary no cell widens, is refused.

    Raises:
        TabularError: as :func:`_protect_once`, or the joint audit finds no pattern.
    """
    extra = np.zeros(0, dtype=bool)
    for _round in range(JOINT_ROUNDS):
        pattern, report, sides = _protect_once(universe, cells, earlier, extra)
        added, unresolved = _joint_widening(universe, sides)
        if not added.any() and not unresolved:
            report["joint_hidden"] = int(extra.sum())  # cells hidden for the joint audit
            return pattern, report
        if not added.any():
            break
        extra = added if not extra.any() else extra | added
    raise TabularError(
        f"the suppression pattern of {universe.table} leaves a primary cell short of its "
        "protection when its unit counts and a measure's sums are read together (sum <= hi x "
        "count with the policy's bounds), and hiding more cells did not protect it; name fewer "
        "dimensions or widen the measure's bounds"
    )


JOINT_ROUNDS = 4  # counts' and sums' patterns protected again with the cells the joint LP adds


def _joint_widening(universe: Universe, sides: dict) -> tuple[np.ndarray, bool]:
    """Cells the joint audit of the counts with each bounded measure asks to hide, and
    whether a short primary found no such cell."""
    count = sides.get(COUNT)
    if count is None:
        return np.zeros(0, dtype=bool), False
    added = np.zeros(len(count["side"].values), dtype=bool)
    unresolved = False
    for measure, entry in sides.items():
        bound = universe.bound(measure)
        if measure == COUNT or bound is None or not 0 <= bound[1] < np.inf:  # sum <= hi x n
            continue
        more, stuck = widening(
            count["A"], count["side"], entry["side"], bound,
            forced=count["forced"] | entry["forced"], cost=entry["side"].values,
            time_limit=universe.time_limit,
        )  # fmt: skip
        added |= more
        unresolved |= stuck
    return added, unresolved


def _protect_once(
    universe: Universe, cells: pd.DataFrame, earlier: pd.DataFrame | None, extra: np.ndarray
) -> tuple[pd.DataFrame, dict, dict]:
    """Protect every aggregate of the universe as a table of its own; return the pattern, a
    report and, per aggregate, what the joint audit reads (:func:`_side`). ``extra``: cells the
    joint audit asked to hide (empty at first), kept hidden in the counts and so in the sums.

    ``cells`` is the result of :func:`inner_cells_sql`; ``earlier`` a pattern stored before
    (same layout as the one returned), whose suppressions are kept and whose unchanged
    published cells are forced published.

    A measure's sums are hidden wherever the unit counts are (counts come first): a published
    sum passed its frequency rule, so it tells its cell has at least ``min_freq`` units, which
    the counts' audit does not know. Beside a hidden count it bounded the count: red team s44h,
    on the demo's enterprises, 5 sums beside hidden counts proved two counts of 2 firms to lie
    in [1, 2], short of their 30 % protection.

    Raises:
        TabularError: a universe column holds NULLs, a unit lies in several inner cells, or no
            audited pattern exists.
    """
    if (cells[SPREAD] > 1).any():
        raise TabularError(
            f"some units of {universe.table} lie in several inner cells (their rows differ in "
            f"{', '.join(universe.columns)}); suppression needs each unit in one inner cell: "
            "the margins count the inner cells' units and take their largest contributions "
            "from the inner cells, so a unit would be counted twice and its share of a margin "
            "under-read"
        )
    for column in universe.columns:
        if cells[column].isna().any():
            raise TabularError(
                f"{universe.table}.{column} has NULL values; suppression needs a code in every "
                "row (recode missing values, e.g. to 'unknown')"
            )
    codes = cells[list(universe.columns)].astype(str)
    dims, hierarchies = _dimensions(universe, codes)
    pattern: pd.DataFrame | None = None
    report: dict = {"cells": 0, "aggregates": {}}
    sides: dict = {}
    moved = None  # cells whose unit count changed (counts suppressed too), read by the sums
    uncounted = None  # cells whose unit count the pattern hides: their sums are hidden too
    units = None  # the counts' cells: true unit counts and the largest the attacker can prove
    told = None  # the counts' cells: contributors of sums an earlier pattern showed beside them
    for aggregate in universe.aggregates:
        table = _table(universe, aggregate, cells, codes, dims, hierarchies)
        with_value = None
        if aggregate != COUNT:
            with_value = _with_value(universe, aggregate, table, cells, codes, dims, hierarchies)
            table = _zero_cells_counted(table, with_value)
        coordinates = _coordinates(universe, table.cells[dims], hierarchies)
        if pattern is None:
            pattern = coordinates
        before = _earlier(coordinates, earlier, aggregate)
        if aggregate == COUNT:
            apriori = _known_bounds(universe, aggregate, table, cells, codes, dims, hierarchies)
            told = _told_by_earlier_sums(universe, table, coordinates, earlier,
                                         (cells, codes, dims, hierarchies))  # fmt: skip
            if told is not None:
                apriori = _with_told(apriori, told, table.values.astype(float))
        else:
            apriori = _bounded_sums(universe.bound(aggregate), table, with_value, units)
        kept, held, forced = _carried_over(table, before)
        joint = extra & ~forced if aggregate == COUNT and extra.any() else None
        if aggregate != COUNT and moved is not None:
            forced = forced & ~moved  # unchanged beside new units is news, not known (s43k)
        if aggregate != COUNT and uncounted is not None:
            held = held | (uncounted & ~forced)  # a shown sum bounds its count (s44h)
        rules = [_Known(rule, forced) for rule in universe.rules(aggregate)]
        seen = seen_values(before, len(table.cells)) if aggregate == COUNT else None
        if seen is not None:
            moved = count_changes(table.values, seen)  # the sums read it: COUNT comes first
        revised = revision_rule(aggregate == COUNT, universe.rules(aggregate), table.values,
                                before, seen, None if seen is not None else moved)  # fmt: skip
        if revised is not None:
            rules.append(revised)
        try:
            result = suppression_pattern(
                table,
                rules,
                method=universe.secondary,
                singleton_method=universe.singleton,
                cost=universe.cost,
                primary=ManualRule(kept, safety_range=0.0, name=EARLIER) if kept.any() else None,
                held=_kept_hidden(held, joint),
                forced=forced if forced.any() else None,
                forced_known=True,
                time_limit=universe.time_limit,
                apriori=apriori,
            )
        except TabularError as refusal:
            if aggregate != COUNT or told is None or not told[0].any():
                raise
            raise TabularError(
                f"an earlier suppression pattern of {universe.table} (stored before sqlsdc "
                "published a measure only where its unit count is) shows sums beside hidden "
                "unit counts, which tell each of those counts is at least the sum's "
                "contributors; with that, its published cells pin counts the rules protect, and "
                f"no new pattern can hide them again: {refusal}"
            ) from None
        if aggregate == COUNT:
            uncounted = (result["status"] != "published").to_numpy()
            units = _known_counts(table, uncounted, apriori, universe.time_limit)
        pattern[f"{aggregate}{VALUE}"] = result["value"].to_numpy()
        pattern[f"{aggregate}{STATUS}"] = result["status"].to_numpy()
        if seen is not None:
            pattern[f"{aggregate}{SEEN}"] = with_published(seen, result["value"].to_numpy())
        if with_value is not None:
            published = (result["status"] == "published").to_numpy()
            pattern[f"{aggregate}{CONTRIBUTORS}"] = np.where(published, with_value, np.nan)
            # one fact about the whole table, kept apart from the grand total's status: read off
            # the grand total, it switched every AVG off once a revision hid that total
            pattern[f"{aggregate}{EVERY}"] = bool(
                cells[f"{aggregate}__n"].sum() == cells["__units"].sum()
            )
        audit = result.attrs["audit"]
        report["aggregates"][aggregate] = {
            "primary": audit.n_primary,
            "secondary": audit.n_secondary,
            "kept_from_earlier": int((kept | held).sum()),
            "known_from_earlier": int(forced.sum()),
            "revised": 0 if revised is None else int(revised.cells.sum()),
            "audit_passed": audit.passed,
            "audit_exact": audit.exact,
            "method": audit.method,
        }
        sides[aggregate] = _side(table, result, apriori, forced)
    report["cells"] = 0 if pattern is None else len(pattern)
    return pattern, report, sides


def _kept_hidden(held: np.ndarray, joint: np.ndarray | None) -> np.ndarray | None:
    """Cells kept hidden without a level of their own: secondaries of an earlier pattern and
    the cells the joint audit asked to hide (counts; their sums follow)."""
    if joint is not None:
        held = held | joint
    return held if held.any() else None


def _side(table: Table, result: pd.DataFrame, apriori, forced: np.ndarray) -> dict:
    """One aggregate's pattern as :mod:`sqlsdc.tabular.joint_audit` reads it."""
    values = table.values.astype(float)
    if apriori is None:
        apriori = (0.0 if not table.negative else -np.inf, np.inf)
    lower, upper = (np.asarray(b, dtype=float) * np.ones_like(values) for b in apriori)
    status = result["status"].to_numpy()
    side = Side(values=values, hidden=status != "published", lower=lower, upper=upper,
                primary=status == "primary", upl=result["upl"].to_numpy(dtype=float),
                lpl=result["lpl"].to_numpy(dtype=float))  # fmt: skip
    return {"A": table.A, "side": side, "forced": np.asarray(forced, dtype=bool)}


def _known_bounds(universe, aggregate, table, cells, codes, dims, hierarchies):
    """What an analyst knows of every cell before any value: a query lists every cell of the
    pattern, a suppressed one with NULL, so a unit count is at least the number of inner cells
    it adds up (each holds a unit). The audit must protect against those bounds, not against
    ``[0, inf)``; lower protection beyond them is impossible and is not asked (the protection
    levels are clipped to the a-priori bounds). Sums keep the default bounds: a unit may add 0.
    """
    if aggregate != COUNT:
        return None
    ones = cells.assign(__units=1)
    leaves = _table(universe, aggregate, ones, codes, dims, hierarchies)
    if not leaves.cells[dims].equals(table.cells[dims]):  # pragma: no cover - same input order
        raise TabularError("the universe's cells came out in another order; this is a bug")
    return leaves.values.astype(float), np.inf


def _told_by_earlier_sums(universe, table, coordinates, earlier, parts):
    """Per cell of the counts: the contributors of a sum an earlier pattern published there and
    that still has its value (0 elsewhere), and whether that pattern told every unit has a
    value; None without an earlier pattern.

    A pattern stored before s44h's fix may have published a measure's sum (and its
    contributors, the units with a value, which SUM / AVG gives) beside a hidden unit count.
    Published, it is public: the count is at least those contributors (at least ``min_freq``
    when the sum is not 0: it passed its frequency rule), and exactly them when that pattern
    told that every unit has a value (its AVGs).
    """
    if earlier is None:
        return None
    cells, codes, dims, hierarchies = parts
    told = np.zeros(len(table.cells))
    exact = np.zeros(len(table.cells), dtype=bool)
    for measure in universe.measures:
        if f"{measure}{STATUS}" not in earlier.columns:
            continue
        sums = _table(universe, measure, cells, codes, dims, hierarchies)
        before = _earlier(coordinates, earlier, measure)
        _kept, _held, same = _carried_over(sums, before)
        shown = before["contributors"].to_numpy(dtype=float)
        shown = np.where(same & ~np.isnan(shown), shown, 0.0)
        told = np.maximum(told, shown)
        if _every(earlier, measure):
            exact |= shown > 0
    return told, exact


def _with_told(apriori, told, truth: np.ndarray):
    """The counts' a-priori bounds with what earlier sums tell (:func:`_told_by_earlier_sums`),
    each cut to the true count, so that a stale fact never makes the bounds contradict the data
    (the audit then treats the count as known from that side, which only asks more)."""
    contributors, exact = told
    lower, upper = (np.asarray(b, dtype=float) * np.ones_like(truth) for b in apriori)
    lower = np.maximum(lower, np.minimum(contributors, truth))
    upper = np.where(exact, np.maximum(contributors, truth), upper)
    return lower, upper


def _every(earlier: pd.DataFrame, measure: str) -> bool:
    """Whether an earlier pattern told every unit has a value of ``measure`` (its AVGs)."""
    column = f"{measure}{EVERY}"
    return column in earlier.columns and bool(earlier[column].fillna(False).astype(bool).any())


def _known_counts(table: Table, hidden: np.ndarray, apriori, time_limit: float):
    """The unit counts (true) and the largest count an attacker can prove in every cell: the
    published count, or the top of a hidden count's interval over the published counts (the
    counts' own LP, integer). A cell whose interval the solver could not prove exactly gets its
    true count: the measures' audit then assumes the attacker knows more, never less."""
    from sqlsdc.tabular.attacker import audit_intervals

    truth = table.values.astype(float)
    lower, upper = (np.asarray(b, dtype=float) * np.ones_like(truth) for b in apriori)
    result = audit_intervals(table.A, truth, hidden, lower=lower, upper=upper, integer=True,
                             time_limit=time_limit)  # fmt: skip
    top = np.where(np.asarray(result.exact, dtype=bool), np.floor(result.hi + 1e-6), truth)
    return truth, np.maximum(top, truth)


def _bounded_sums(bound, table: Table, with_value: np.ndarray, units):
    """What an analyst knows of a measure's sum in every cell from the policy's ``bounds: [lo,
    hi]`` of one value (``sqlsdc policy show``): at most ``hi`` per unit, so at most ``hi``
    times the largest count the published counts allow (the count itself where published), and
    at least ``lo`` per unit with a value. With employees in [0, 50] a hidden sum beside a
    published count of 2 firms lies in [0, 100], not [0, inf): an audit that assumed the wider
    range reported primaries protected that the attacker's LP proves short (red team s44i).

    Both bounds count the true units with a value where the attacker may know less (lower
    bound; an upper bound below 0; counts not protected by suppression): the audit then
    assumes the attacker knows more, never less. Each bound is cut to the cell's value (a unit
    of several rows may sum past ``hi``), so the bounds never contradict the data.
    """
    if bound is None:
        return None
    lo, hi = bound
    values = table.values.astype(float)
    valued = with_value.astype(float)
    top = units[1] if units is not None else valued
    lower = np.minimum(lo * valued, values)
    upper = np.maximum(hi * top if hi >= 0 else hi * valued, values)
    return lower, upper


def _with_value(universe, aggregate, table, cells, codes, dims, hierarchies) -> np.ndarray:
    """The units with a value of the measure ``aggregate`` in every cell of ``table``, margins
    summed: the pattern's contributors, which an AVG divides its sum by (the frequency rule
    counts only the non-zero ones, :func:`_zero_cells_counted`)."""
    counted = cells.assign(__units=cells[f"{aggregate}__n"])
    units = _table(universe, COUNT, counted, codes, dims, hierarchies)
    if not units.cells[dims].equals(table.cells[dims]):  # pragma: no cover - same input order
        raise TabularError("the universe's cells came out in another order; this is a bug")
    return units.values


def _dimensions(universe: Universe, codes: pd.DataFrame) -> tuple[list[str], dict]:
    """Folded dimensions: a hierarchy becomes one dimension holding codes of all its levels."""
    dims, hierarchies = [], {}
    for name, levels in universe.groups:
        dims.append(name)
        if len(levels) > 1:
            hierarchies[name] = Hierarchy.from_levels(codes, list(levels))
    return dims, hierarchies


def _table(universe, aggregate, cells, codes, dims, hierarchies) -> Table:
    frame = pd.DataFrame({name: codes[levels[-1]] for name, levels in universe.groups})
    if aggregate == COUNT:
        frame["value"] = cells["__units"].astype(float)
        frame["n"] = cells["__units"]
        tops = []
    else:
        frame["value"] = cells[f"{aggregate}__sum"].fillna(0).astype(float)
        frame["n"] = cells[f"{aggregate}__nz"]  # the frequency rule's contributors
        k = top_k(universe)
        tops = [f"top{j + 1}" for j in range(k)]
        lists = cells[f"{aggregate}__top"]
        for j, name in enumerate(tops):
            frame[name] = [
                float(t[j]) if t is not None and len(t) > j and t[j] is not None else 0.0
                for t in lists
            ]
    return Table.from_cells(frame, dims, top=tops, hierarchies=hierarchies or None)


def _zero_cells_counted(table: Table, with_value: np.ndarray) -> Table:
    """``table`` of a measure, whose ``n`` counts the units of a non-zero total (margins
    summed), as the threshold rule, rounding and the cell key method count a magnitude's
    contributors (GaussSuppression's ``NContributorsRule``, ``remove0 = TRUE``), with a cell of
    zeros only counting its units with a value (``with_value``) instead: as no contributor it
    would pass the frequency rule and be published as 0. Counted with their zeros, R01-M011's
    men on the suppression demo (three incomes and two of 0) passed ``freq:5`` and were
    published, and its two largest earners knew the third income (red team s40b)."""
    nonzero = table.n
    counted = np.where(nonzero > 0, nonzero, with_value.astype(np.int64))
    return dataclasses.replace(table, cells=table.cells.assign(n=counted))


def _coordinates(universe: Universe, folded: pd.DataFrame, hierarchies) -> pd.DataFrame:
    """``__level`` and the universe columns (codes as text, None at totals) of every cell."""
    out = pd.DataFrame(index=range(len(folded)))
    level = np.zeros(len(folded), dtype=np.int64)
    bit = 0
    for name, levels in universe.groups:
        chains = _chains(hierarchies.get(name))
        code = folded[name].tolist()
        for depth, column in enumerate(levels):
            values = []
            for c in code:
                chain = () if c == TOTAL else chains.get(c, (c,))
                values.append(chain[depth] if depth < len(chain) else None)
            out[column] = values
            level |= np.where(pd.isna(out[column]).to_numpy(), 1 << bit, 0)
            bit += 1
    out.insert(0, LEVEL, level)
    return out


def _chains(hierarchy: Hierarchy | None) -> dict[str, tuple[str, ...]]:
    """For a hierarchy: every code's ancestors from the coarsest level down to itself."""
    if hierarchy is None:
        return {}
    parents = hierarchy.parents
    chains = {}
    for code in hierarchy.codes[1:]:
        chain = [code]
        while parents[chain[0]] not in (None, hierarchy.total):
            chain.insert(0, parents[chain[0]])
        chains[code] = tuple(chain)
    return chains


def _earlier(coordinates: pd.DataFrame, earlier: pd.DataFrame | None, aggregate: str):
    """The earlier pattern's value and status of ``aggregate``, aligned to ``coordinates``.

    Both patterns hold their codes as text (None at totals), so cells match on the columns
    they share. A policy that changes the universe's columns (red team s40i: persons by region
    x sex after a pattern by municipality x sex; every later query on persons failed with a
    pandas merge error) keeps what the earlier pattern said of the cells both universes hold:
    a cell at the total of the columns the other universe lacks, or the only cell of its codes
    (a municipality, whose region the new universe leaves out). Other cells are new."""
    if earlier is None or f"{aggregate}{STATUS}" not in earlier.columns:
        return None
    keys = [c for c in coordinates.columns if c != LEVEL]
    codes = [c for c in earlier.columns if c != LEVEL and not c.endswith(_SUFFIXES)]
    shared = [c for c in keys if c in codes]
    left = coordinates[shared].astype(object).fillna(_TOTAL_KEY)
    right = earlier[shared].astype(object).fillna(_TOTAL_KEY)
    right["value"] = earlier[f"{aggregate}{VALUE}"].to_numpy()
    right["status"] = earlier[f"{aggregate}{STATUS}"].to_numpy()
    seen = f"{aggregate}{SEEN}"
    right["seen"] = earlier[seen].to_numpy(dtype=object) if seen in earlier.columns else None
    told = f"{aggregate}{CONTRIBUTORS}"
    right["contributors"] = (
        earlier[told].to_numpy(dtype=float) if told in earlier.columns else np.nan
    )
    mine = _matchable(coordinates, left, shared, [c for c in keys if c not in shared])
    theirs = _matchable(earlier, right, shared, [c for c in codes if c not in shared])
    on = [*shared, _TOTAL_KEY]  # one key column also when no column is shared (the totals)
    found = (
        left[mine]
        .assign(**{_TOTAL_KEY: 0})
        .merge(right[theirs].assign(**{_TOTAL_KEY: 0}), on=on, how="left", validate="one_to_one")
    )
    merged = pd.DataFrame(
        {"value": np.nan, "status": None, "seen": None, "contributors": np.nan}, index=left.index
    )
    merged.loc[mine, "value"] = found["value"].to_numpy(dtype=float)
    merged.loc[mine, "contributors"] = found["contributors"].to_numpy(dtype=float)
    merged.loc[mine, "status"] = found["status"].to_numpy(dtype=object)
    merged.loc[mine, "seen"] = found["seen"].to_numpy(dtype=object)
    return merged.reset_index(drop=True)


_SUFFIXES = (STATUS, VALUE, CONTRIBUTORS, SEEN, EVERY)


def _matchable(frame: pd.DataFrame, codes: pd.DataFrame, shared: list[str], others: list[str]):
    """Rows of a pattern that stand for one cell of the codes ``shared`` with another: at the
    total of its ``others`` columns, or the only row of those codes; one row per code."""
    if not others:
        return np.ones(len(frame), dtype=bool)
    total = frame[others].isna().all(axis=1).to_numpy()
    alone = ~codes.duplicated(shared, keep=False).to_numpy() if shared else np.zeros(
        len(frame), dtype=bool)  # fmt: skip
    picked = total | alone
    unique = ~codes[picked].duplicated(shared, keep=False).to_numpy()
    out = np.zeros(len(frame), dtype=bool)
    out[np.flatnonzero(picked)[unique]] = True
    return out


_TOTAL_KEY = "\x00total"


def _carried_over(table: Table, before) -> tuple[np.ndarray, np.ndarray]:
    """Cells to keep suppressed with their protection (primary before), cells to keep
    suppressed without a level of their own (secondary before: they protected others, which
    the rules and ``kept`` still protect), and cells published before with the same value
    (known)."""
    none = np.zeros(len(table.cells), dtype=bool)
    if before is None:
        return none, none, none
    status = before["status"].to_numpy(dtype=object)
    # equal up to the order the engine added the rows in (see fingerprint): a cell published
    # before is known to its reader whatever the last bits of its sum
    same = np.isclose(before["value"].to_numpy(dtype=float), table.values, rtol=1e-12, atol=0.0)
    return status == "primary", status == "secondary", (status == "published") & same


def exempt_known(rules, known: np.ndarray) -> list:
    """``rules`` that flag no cell of ``known`` (published before with its value: public).

    The rules come back wrapped: a test of a rule's kind (``isinstance(rule, FrequencyRule)``)
    reads :func:`kind_of` ``(rule)``, and applies the wrapped rule, exemption kept."""
    return [_Known(rule, known) for rule in rules]


def kind_of(rule):
    """The rule whose kind ``rule`` is: itself, or the rule :func:`exempt_known` wrapped.

    Red team s42i: a sum job's unit counts were audited with the rules that are
    ``FrequencyRule`` instances, which wrapped rules are not; whenever an earlier output or the
    live pattern's grand total published a cell, the counts went unaudited, and four counts of 1
    were pinned exactly by the published ``n``."""
    return rule.rule if isinstance(rule, _Known) else rule


@dataclass(frozen=True)
class _Known:
    """A primary rule that exempts cells the attacker already knows.

    A cell published before with the same value stays published, even when stricter rules
    now flag it: hiding it would protect nothing, and a pattern built on hiding it would only
    seem to protect its neighbours.
    """

    rule: object
    known: np.ndarray

    @property
    def name(self) -> str:
        return self.rule.name

    def evaluate(self, stats) -> RuleResult:
        found = self.rule.evaluate(stats)
        keep = ~self.known
        return RuleResult(found.sensitive & keep, found.upl * keep, found.lpl * keep)
