"""Primary sensitivity rules: which cells are unsafe and how much protection each one needs.

Every rule is evaluated on all cells at once (numpy arrays over the cells of a
:class:`~sqlsdc.tabular.model.Table`) and returns a sensitive mask with the upper and lower
protection levels (UPL/LPL): how far above and below the true value an attacker's feasibility
interval must reach once the cell is suppressed.

Definitions follow τ-ARGUS (manual 4.1 §2.2–2.3 and its core library, libtauargus ``Table.cpp``
``ComputeCellSafeCode``/``SetProtectionLevelCell`` and ``DataCell.cpp``), with the protection
levels of Hundepool et al., *Statistical Disclosure Control* (2012), Table 4.4
(x1 ≥ x2 ≥ … the largest contributions, T the cell total):

=================  ===============================================  ===========================
rule               sensitive when                                   UPL = LPL
=================  ===============================================  ===========================
(n,k)-dominance    x1 + … + xn > k/100 · T                          100/k · (x1+…+xn) − T
p%-rule            T − x1 − … − x(n+1) < p/100 · x1                 p/100 · x1 − (T − x1 − x2)
pq-rule            q/100 · (T − x1 − … − x(n+1)) < p/100 · x1       p/q · x1 − (T − x1 − x2)
frequency          0 < n < min_freq                                 safety_range/100 · |value|;
                                                                    a count's UPL at least
                                                                    min_freq − n (below)
zero               n > 0 and value = 0                              UPL = safety_range, LPL = 0
=================  ===============================================  ===========================

(the p% and pq rows are for the default n = 1, the intruder being the second largest
contributor; n = 2 means a coalition of the 2nd and 3rd largest, and so on.)

Choices where the reference tools differ, all following τ-ARGUS:

* Inequalities are strict (τ-ARGUS, sdcTable); GaussSuppression's ``MagnitudeRule`` flags
  dominance at equality (``>=``).
* The p%-rule subtracts the second largest contribution (τ-ARGUS, sdcTable, Table 4.4);
  GaussSuppression's ``PPercentRule`` does the same.
* Sampling weights (τ-ARGUS ``WGT``; Hundepool et al. 2012 p. 151; GaussSuppression
  ``domWeightMethod = "tauargus"``): a sampled unit with weight w stands for w identical population
  units, so x1+…+xn sums the n largest *population* contributions (the largest sampled value
  counts up to its weight, fractional weights take the remaining fraction) and T is the weighted
  total; in the p%/pq rule x1 stays the largest single contribution. The frequency rule compares
  the weighted frequency (sum of weights) with ``min_freq``. sdcTable instead replicates records
  by randomly rounded weights; GaussSuppression's default compares unweighted contributions with
  weighted totals.
* Dominance rules refuse negative contributions (as sdcTable does; τ-ARGUS asks for a
  non-negative shadow variable): pass ``shadow=`` to :func:`~sqlsdc.tabular.model.build_table`.
  GaussSuppression uses absolute values instead.
* Empty cells (no contributor) are never sensitive (τ-ARGUS ``CS_EMPTY``; sdcTable
  ``allowZeros = FALSE``).
* When several rules fire, τ-ARGUS keeps the levels of the first status (dominance rules before
  frequency); here every fired rule contributes and the larger level wins, which protects at
  least as much. Levels are computed on the rules' variable (the shadow if any) and scaled to the
  published value as τ-ARGUS does: UPL = |value| · distance / T.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from sqlsdc.errors import TabularError
from sqlsdc.policy.rule_syntax import rule_arguments

Level = Literal["unit", "holding"]


@dataclass(frozen=True)
class CellStats:
    """What the rules read for each cell (arrays over the cells)."""

    n: np.ndarray
    value: np.ndarray
    total: np.ndarray
    top: np.ndarray | None = None
    top_weight: np.ndarray | None = None
    weight: np.ndarray | None = None
    n_holding: np.ndarray | None = None
    htop: np.ndarray | None = None
    negative: bool = False
    cells: pd.DataFrame | None = None

    @classmethod
    def from_table(cls, table) -> CellStats:
        """Read the rule inputs from a :class:`~sqlsdc.tabular.model.Table`'s cells."""
        c = table.cells

        def block(prefix, suffix=""):
            cols = []
            while f"{prefix}{len(cols) + 1}{suffix}" in c.columns:
                cols.append(f"{prefix}{len(cols) + 1}{suffix}")
            return c[cols].to_numpy(dtype=np.float64) if cols else None

        value = c["value"].to_numpy(dtype=np.float64)
        total = c["shadow"].to_numpy(dtype=np.float64) if "shadow" in c.columns else value
        return cls(
            n=c["n"].to_numpy(dtype=np.int64),
            value=value,
            total=total,
            top=block("top"),
            top_weight=block("top", "_w"),
            weight=c["weight"].to_numpy(dtype=np.float64) if "weight" in c.columns else None,
            n_holding=c["n_holding"].to_numpy(dtype=np.int64) if "n_holding" in c else None,
            htop=block("htop"),
            negative=bool(getattr(table, "negative", False)),
            cells=c,
        )


@dataclass(frozen=True)
class RuleResult:
    """One rule's verdict: sensitive cells and their upper/lower protection levels."""

    sensitive: np.ndarray
    upl: np.ndarray
    lpl: np.ndarray


@dataclass(frozen=True)
class PrimaryResult:
    """All rules combined: ``rule`` names every rule that fired, comma-separated."""

    primary: np.ndarray
    upl: np.ndarray
    lpl: np.ndarray
    rule: np.ndarray


@dataclass(frozen=True)
class FrequencyRule:
    """τ-ARGUS ``FREQ(min_freq, safety_range)``: a cell needs at least ``min_freq`` contributors.

    Sensitive when ``0 < n < min_freq`` (units, or holdings with ``level="holding"``); with
    sampling weights the weighted frequency is compared. sdcTable's ``maxN`` is
    ``min_freq - 1`` (its default ``maxN = 3`` is ``min_freq = 4``). UPL = LPL =
    ``safety_range`` percent of the cell value (τ-ARGUS ``SetProtectionLevelCell``:
    ``CellFreqSafetyPerc``).

    A cell whose value is its frequency (a count's cell: value = n, or the weighted frequency)
    gets at least UPL = ``min_freq − n`` when ``reach_threshold`` (the default): the attacker's
    upper bound must reach the threshold, so no suppressed count can be proved below it. With
    the safety range alone, a 4 under ``freq:5`` needed an upper bound of 5.2 only, and an LP
    over a persons table's published margins proved 4 of 59 primaries in [1, 4] (red team
    s37d). It implies GaussSuppression's interval requirements for small counts
    (``PrimaryDefault(protectionIntervals = TRUE)``, SSBtools/GaussSuppression ``R/Primary.R``:
    upper bound at least ``freq + 1``, width at least 2), as ``min_freq − n >= 1`` and the lower
    level is at least 1 (:func:`apply_rules`), and asks more: ``upmin = min_freq`` where
    GaussSuppression asks ``freq + 1``. τ-ARGUS applies the safety range alone
    (``|value| · CellFreqSafetyPerc / 100``, at least ``MinLPL`` = 1): ``reach_threshold=False``
    gives its levels. Cells of sums keep the safety range: their value is no frequency.

    Example:
        >>> s = CellStats(n=np.array([1, 3]), value=np.array([50.0, 90.0]),
        ...               total=np.array([50.0, 90.0]))
        >>> r = FrequencyRule(min_freq=3, safety_range=30).evaluate(s)
        >>> r.sensitive.tolist(), r.upl.tolist()
        ([True, False], [15.0, 0.0])
        >>> counts = CellStats(n=np.array([1, 4, 6]), value=np.array([1.0, 4.0, 6.0]),
        ...                    total=np.array([1.0, 4.0, 6.0]))
        >>> r = FrequencyRule(min_freq=5, safety_range=30).evaluate(counts)
        >>> r.upl.tolist(), r.lpl.tolist()
        ([4.0, 1.2, 0.0], [0.3, 1.2, 0.0])
    """

    min_freq: int = 3
    safety_range: float = 30.0
    level: Level = "unit"
    reach_threshold: bool = True

    @property
    def name(self) -> str:
        return "freq" if self.level == "unit" else "freq[holding]"

    def evaluate(self, s: CellStats) -> RuleResult:
        _check_range(self.safety_range, "safety_range")
        if self.level == "holding":
            freq = _holdings(s, self).n_holding.astype(np.float64)
        else:
            freq = s.weight if s.weight is not None else s.n.astype(np.float64)
        sensitive = (s.n > 0) & (freq < self.min_freq)
        level = np.where(sensitive, np.abs(s.value) * self.safety_range / 100.0, 0.0)
        upl = level.copy()
        if self.reach_threshold:
            counted = sensitive & (s.value == freq)  # a count's cell: its value is n
            upl = np.where(counted, np.maximum(upl, self.min_freq - freq), upl)
        return RuleResult(sensitive, upl, level)


@dataclass(frozen=True)
class DominanceRule:
    """τ-ARGUS ``NK(n, k)``: the ``n`` largest contributions exceed ``k`` percent of the total.

    Defaults n = 2, k = 85 are sdcTable's. UPL = LPL = 100/k · (x1+…+xn) − T (Hundepool et al.
    2012, Table 4.4).

    Example:
        >>> s = CellStats(n=np.array([3]), value=np.array([100.0]), total=np.array([100.0]),
        ...               top=np.array([[80.0, 15.0]]))
        >>> r = DominanceRule(n=2, k=85).evaluate(s)
        >>> bool(r.sensitive[0]), round(float(r.upl[0]), 4)
        (True, 11.7647)
    """

    n: int = 2
    k: float = 85.0
    level: Level = "unit"

    @property
    def name(self) -> str:
        return f"nk({self.n},{self.k:g})" + ("" if self.level == "unit" else "[holding]")

    def evaluate(self, s: CellStats) -> RuleResult:
        if not 0 < self.k <= 100 or self.n < 1:
            raise TabularError(f"(n,k)-rule needs n >= 1 and 0 < k <= 100; got {self.n}, {self.k}")
        top, weight = _tops(s, self, self.n)
        score = _largest(top, weight, self.n)
        total = s.total
        sensitive = (s.n > 0) & (total > 0) & (top[:, 0] > 0) & (100.0 * score > self.k * total)
        distance = 100.0 / self.k * score - total
        return _scaled(s, sensitive, distance)


@dataclass(frozen=True)
class PQRule:
    """τ-ARGUS ``P(p, q, n)``, the prior-posterior (pq) rule.

    An intruder knowing every contribution to within ``q`` percent, together with the ``n``
    largest contributors after the first (a coalition, n = 1: the second largest), must not
    estimate the largest contribution to within ``p`` percent: sensitive when
    ``p/100 · x1 > q/100 · (T − x1 − … − x(n+1))``. UPL = LPL = p/q · x1 − (T − x1 − … −
    x(n+1)). Defaults p = 25, q = 50 are sdcTable's.

    Example:
        >>> s = CellStats(n=np.array([3]), value=np.array([100.0]), total=np.array([100.0]),
        ...               top=np.array([[60.0, 35.0]]))
        >>> r = PQRule(p=25, q=50).evaluate(s)
        >>> bool(r.sensitive[0]), float(r.upl[0])
        (True, 25.0)
    """

    p: float = 25.0
    q: float = 50.0
    n: int = 1
    level: Level = "unit"

    @property
    def name(self) -> str:
        return f"pq({self.p:g},{self.q:g})" + ("" if self.level == "unit" else "[holding]")

    def evaluate(self, s: CellStats) -> RuleResult:
        if not 0 < self.p <= self.q <= 100:
            raise TabularError(f"pq-rule needs 0 < p <= q <= 100; got p={self.p}, q={self.q}")
        if self.n < 1:
            raise TabularError(f"the intruder coalition size n must be >= 1; got {self.n}")
        top, weight = _tops(s, self, self.n + 1)
        x1 = top[:, 0]
        rest = s.total - _largest(top, weight, self.n + 1)
        sensitive = (s.n > 0) & (self.p * x1 > self.q * rest)
        distance = self.p / self.q * x1 - rest
        return _scaled(s, sensitive, distance)


@dataclass(frozen=True)
class PPercentRule(PQRule):
    """τ-ARGUS ``P(p, n)``: the pq-rule with q = 100 (no prior knowledge beyond 100 %).

    Sensitive when ``T − x1 − x2 < p/100 · x1``; UPL = LPL = p/100 · x1 − (T − x1 − x2). The
    default p = 10 is a common office setting (sdcTable's default 80 is far stricter).

    Example:
        >>> s = CellStats(n=np.array([3]), value=np.array([100.0]), total=np.array([100.0]),
        ...               top=np.array([[60.0, 35.0]]))
        >>> r = PPercentRule(p=10).evaluate(s)
        >>> bool(r.sensitive[0]), float(r.upl[0])
        (True, 1.0)
    """

    p: float = 10.0
    q: float = 100.0

    @property
    def name(self) -> str:
        return f"p({self.p:g})" + ("" if self.level == "unit" else "[holding]")


@dataclass(frozen=True)
class ZeroRule:
    """τ-ARGUS ``ZERO(safety_range)``: a cell with contributors but value 0 is unsafe.

    UPL = ``safety_range`` (in the measure's units), LPL = 0.
    """

    safety_range: float = 1.0
    name: str = "zero"

    def evaluate(self, s: CellStats) -> RuleResult:
        sensitive = (s.n > 0) & (s.value == 0)
        upl = np.where(sensitive, float(self.safety_range), 0.0)
        return RuleResult(sensitive, upl, np.zeros_like(upl))


@dataclass(frozen=True)
class ManualRule:
    """Cells the user declares unsafe (τ-ARGUS manual status with ``MAN(safety_range)``).

    ``cells`` is a boolean mask over the cells or a function of the cells DataFrame returning one.
    UPL = LPL = ``safety_range`` percent of the value.
    """

    cells: np.ndarray | Sequence[bool] | Callable[[pd.DataFrame], np.ndarray]
    safety_range: float = 10.0
    name: str = "manual"

    def evaluate(self, s: CellStats) -> RuleResult:
        _check_range(self.safety_range, "safety_range")
        mask = self.cells(s.cells) if callable(self.cells) else self.cells
        mask = np.asarray(mask)
        if mask.dtype != bool or mask.shape != s.n.shape:
            raise TabularError(
                f"a primary mask must be {len(s.n)} booleans, one per cell in table order; got "
                f"dtype {mask.dtype} and shape {mask.shape}"
            )
        level = np.where(mask, np.abs(s.value) * self.safety_range / 100.0, 0.0)
        return RuleResult(mask, level, level.copy())


def apply_rules(table_or_stats, rules: Sequence, *, min_level: float = 1.0) -> PrimaryResult:
    """Evaluate ``rules`` on every cell and combine them.

    A cell is primary if any rule fires; its UPL/LPL are the largest levels of the rules that
    fired and ``rule`` lists their names separated by "; " (names such as ``nk(2,85)`` contain
    commas). Primary cells get at least ``min_level`` of upper protection (τ-ARGUS replaces a
    zero distance by 1 and applies a minimum protection level), and of lower protection unless
    the value is 0.

    Example:
        >>> s = CellStats(n=np.array([1, 5]), value=np.array([50.0, 100.0]),
        ...               total=np.array([50.0, 100.0]), top=np.array([[50.0, 0], [90.0, 5]]))
        >>> r = apply_rules(s, [FrequencyRule(), PPercentRule()])
        >>> r.rule.tolist(), r.upl.tolist()
        (['freq; p(10)', 'p(10)'], [15.0, 4.0])
    """
    s = (
        table_or_stats
        if isinstance(table_or_stats, CellStats)
        else CellStats.from_table(table_or_stats)
    )
    count = len(s.n)
    primary = np.zeros(count, dtype=bool)
    upl, lpl = np.zeros(count), np.zeros(count)
    names = np.full(count, "", dtype=object)
    for rule in rules:
        if not hasattr(rule, "evaluate"):
            raise TabularError(
                f"{rule!r} is not a rule; use FrequencyRule, DominanceRule, PPercentRule, "
                "PQRule, ZeroRule or ManualRule"
            )
        r = rule.evaluate(s)
        hit = np.asarray(r.sensitive, dtype=bool)
        primary |= hit
        upl = np.where(hit, np.maximum(upl, r.upl), upl)
        lpl = np.where(hit, np.maximum(lpl, r.lpl), lpl)
        names[hit] = [f"{a}; {rule.name}" if a else rule.name for a in names[hit]]
    upl = np.where(primary, np.maximum(upl, min_level), 0.0)
    lpl = np.where(primary & (s.value != 0), np.maximum(lpl, min_level), lpl)
    return PrimaryResult(primary, upl, lpl, names)


def parse_rule(text: str):
    """A primary rule from ``freq:3[,30]``, ``nk:2,85``, ``p:10`` or ``pq:25,50``
    (syntax and ranges: :func:`sqlsdc.policy.rule_syntax.rule_arguments`).

    Example:
        >>> parse_rule("freq:3")
        FrequencyRule(min_freq=3, safety_range=30.0, level='unit', reach_threshold=True)
        >>> parse_rule("freq:0")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        sqlsdc.errors.TabularError: rule 'freq:0': N must be an integer >= 1, e.g. freq:3 ...
    """
    try:
        name, kwargs = rule_arguments(text)
    except ValueError as e:
        raise TabularError(str(e)) from None
    return RULES[name](**kwargs)


def default_rules(count: bool) -> list:
    """Frequency rule for frequency tables; frequency and p%-rule for magnitude tables."""
    return [FrequencyRule()] if count else [FrequencyRule(), PPercentRule()]


def required_top_k(rules: Sequence) -> int:
    """How many largest contributions the rules read."""
    k = 1
    for r in rules:
        if isinstance(r, DominanceRule):
            k = max(k, r.n)
        elif isinstance(r, PQRule):
            k = max(k, r.n + 1)
    return k


RULES = {"freq": FrequencyRule, "nk": DominanceRule, "p": PPercentRule, "pq": PQRule}


# --- helpers --------------------------------------------------------------------------------


def _check_range(value: float, name: str) -> None:
    if not value >= 0:
        raise TabularError(f"{name} must be a percentage >= 0; got {value!r}")


def _holdings(s: CellStats, rule) -> CellStats:
    if s.n_holding is None:
        raise TabularError(
            f"{rule.name} is a holding-level rule but the table has no holdings; pass "
            "`holding=` when building it"
        )
    return s


def _tops(s: CellStats, rule, k: int):
    """The (k largest contributions, their weights) a dominance rule reads, after checks."""
    holding = rule.level == "holding"
    top = _holdings(s, rule).htop if holding else s.top
    if top is None:
        raise TabularError(
            f"{rule.name} needs the largest contributions of a magnitude table; give a `measure` "
            "(or top1.. columns for tabular input)"
        )
    if s.negative:
        raise TabularError(
            f"{rule.name} is undefined for negative contributions (τ-ARGUS and sdcTable refuse "
            "them); pass a non-negative `shadow` variable, e.g. the absolute value"
        )
    if top.shape[1] < k:
        raise TabularError(
            f"{rule.name} needs the {k} largest contributions but the table keeps "
            f"{top.shape[1]}; build it with top_k={k}"
        )
    weight = None if holding else s.top_weight
    return top, weight


def _largest(top: np.ndarray, weight: np.ndarray | None, n: int) -> np.ndarray:
    """Sum of the n largest (population) contributions, τ-ARGUS ``ComputeWeightedScoreCell``.

    With weights, the i-th largest sampled contribution counts min(w_i, n − Σ_{j<i} w_j) times,
    looking at the n largest sampled contributions only.
    """
    if weight is None:
        return top[:, :n].sum(axis=1)
    score = np.zeros(len(top))
    used = np.zeros(len(top))
    for i in range(n):
        take = np.clip(n - used, 0.0, weight[:, i])
        score += top[:, i] * take
        used += weight[:, i]
    return score


def _scaled(s: CellStats, sensitive: np.ndarray, distance: np.ndarray) -> RuleResult:
    """UPL = LPL = |value| · distance / T (τ-ARGUS scales the rule's distance to the value)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(s.total != 0, distance / s.total, 0.0)
    level = np.where(sensitive, np.maximum(np.abs(s.value) * ratio, 0.0), 0.0)
    return RuleResult(sensitive, level, level.copy())
