"""The policy as typed, frozen objects; YAML and JSON exist only at the boundary (``load.py``
and the modules it calls: ``read.py``, ``validate.py``, ``semantics.py``, ``build.py``).

A policy says, per table, whether it is public or confidential (undeclared tables are
confidential and unusable), what each column may be used for, and how aggregate cells are
protected; and it lists the users allowed to query and their roles.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from types import MappingProxyType
from typing import Any

from sqlsdc.errors import NotFoundError
from sqlsdc.mechanisms.accountant import PrivacyCost
from sqlsdc.mechanisms.parameters import MagnitudeCkm, PTableSpec

DEFAULT_MIN_FREQUENCY = 10
DEFAULT_STATEMENT_TIMEOUT = 300.0  # seconds (``limits.statement_timeout_seconds``)
DEFAULT_MAX_STATEMENT_CHARACTERS = 1_000_000  # ``limits.max_statement_characters``
DEFAULT_DOMINANCE = ("p:10",)  # a magnitude's dominance rules under threshold and round
MAX_DOMINANCE_TOP = 6  # the most largest contributions a dominance rule reads (nk:N,K)


class TableKind(StrEnum):
    CONFIDENTIAL = "confidential"
    PUBLIC = "public"


class ColumnRole(StrEnum):
    """What a confidential column may be used for.

    identifier: names a unit; only for joins along declared keys and COUNT(DISTINCT unit).
    dimension: may be grouped by, filtered on and counted.
    measure / weight: may be summed or averaged and filtered on; never grouped by or output.
    hidden: never usable.
    """

    IDENTIFIER = "identifier"
    DIMENSION = "dimension"
    MEASURE = "measure"
    WEIGHT = "weight"
    HIDDEN = "hidden"


class UserRole(StrEnum):
    ADMIN = "admin"
    ANALYST = "analyst"


class AggregateKind(StrEnum):
    """Protection is chosen per kind of aggregate: counts of units, or magnitudes (sums)."""

    COUNTS = "counts"
    MAGNITUDES = "magnitudes"


class Method(StrEnum):
    THRESHOLD = "threshold"
    CKM = "ckm"
    SUPPRESS = "suppress"
    DP = "dp"
    ROUND = "round"


class Rounding(StrEnum):
    """Per-cell rounding rule of a ``round`` rule (Cox & Kim 2006, digest §5.1)."""

    CONVENTIONAL = "conventional"  # nearest multiple, halves up
    MODIFIED_CONVENTIONAL = "modified_conventional"  # halves (even base) up or down, 1/2 each
    ZERO_RESTRICTED = "zero_restricted"  # 50/50: multiples stay, others up or down, 1/2 each
    UNBIASED = "unbiased"  # up with probability r/base


class GroupKeys(StrEnum):
    """Where the groups of a DP result come from (Wilson et al. 2020, §3.2)."""

    PUBLIC = "public"  # the declared domains of the key columns: every group, empty ones too
    PRIVATE = "private"  # groups in the data, released by noisy-count thresholding (with delta)


class SecondaryMethod(StrEnum):
    """Secondary suppression method of a ``suppress`` table (see :mod:`sqlsdc.tabular`)."""

    GAUSS = "gauss"
    OPTIMAL = "optimal"
    HITAS = "hitas"


@dataclass(frozen=True)
class ProtectionRule:
    """How cells of one aggregate kind are protected.

    THRESHOLD: a cell computed from fewer than ``min_frequency`` units is suppressed (the
    minimum-frequency rule of official statistics, e.g. Hundepool et al. 2012, §5.2).
    CKM: the cell key method (Geyer et al. 2022; τ-ARGUS/cellKey): deterministic noise looked up
    in the perturbation table ``ptable`` with the cell key; ``magnitude`` holds the magnitude
    parameters. ``min_frequency`` still governs which groups may exist in nested results.
    SUPPRESS: primary ``rules`` (``freq:3``, ``nk:1,60``, ``p:10``, ``pq:25,50``; default: the
    frequency rule with ``min_frequency``, plus ``p:10`` for magnitudes) and secondary
    suppression over the table's :class:`Suppression` universe.
    DP: differential privacy; every aggregate of this kind in a query spends ``spend`` (pure
    epsilon with discrete Laplace noise, or rho-zCDP with discrete Gaussian noise), bounded by
    the table's :class:`DpSettings`.
    ROUND: the exact value rounded to a multiple of ``base`` by the per-cell ``rounding`` rule
    (Cox & Kim 2006), random rules drawing their uniform from the cell key; cells of fewer than
    ``min_frequency`` units are suppressed as with THRESHOLD.
    THRESHOLD and ROUND magnitudes: ``dominance`` rules (``p:10``, ``pq:25,50``, ``nk:2,85``;
    default :data:`DEFAULT_DOMINANCE`, ``()`` none) on the cell's per-unit contributions,
    computed in SQL (:mod:`sqlsdc.rewrite.dominance`); a sensitive cell is suppressed. Ignored
    for counts and other methods.
    """

    method: Method = Method.THRESHOLD
    min_frequency: int = DEFAULT_MIN_FREQUENCY
    ptable: PTableSpec | None = None
    magnitude: MagnitudeCkm | None = None
    rules: tuple[str, ...] = ()
    spend: PrivacyCost | None = None
    base: int | None = None
    rounding: Rounding | None = None
    dominance: tuple[str, ...] = DEFAULT_DOMINANCE


@dataclass(frozen=True)
class DpSettings:
    """Contribution bounding and group release of a DP table (Wilson et al., PoPETs 2020).

    Each unit contributes to at most ``max_groups`` groups and ``max_rows`` rows per group;
    measures are clamped to their column ``bounds`` and summed on a grid of ``granularity``.
    ``groups`` says where groups come from; private groups are released when their noisy unit
    count (spending ``selection_epsilon``) passes the threshold for ``selection_delta``.
    ``min_frequency``: a cell whose noisy unit count is below it is suppressed (DPSQL+).
    ``max_rows_per_unit``: a cap on a unit's rows over the whole query, in addition to the
    per-cell caps (the keyed choice of :func:`sqlsdc.rewrite.dp_bounding.unit_row_cap`;
    sensitivity in :func:`sqlsdc.mechanisms.accountant.norms`).
    ``bounding_report``: the spend (epsilon or rho) of the per-cell noisy shares of input that
    the caps dropped and the bounds clamped (:func:`sqlsdc.rewrite.dp_report.bounding_report`,
    :func:`sqlsdc.mechanisms.accountant.calibrate_report`), charged with the query; None: not
    reported.
    """

    max_groups: int = 1
    max_rows: int = 1
    max_rows_per_unit: int | None = None
    granularity: Fraction = Fraction(1)
    groups: GroupKeys = GroupKeys.PUBLIC
    selection_epsilon: Fraction | None = None
    selection_delta: Fraction | None = None
    min_frequency: int | None = None
    bounding_report: PrivacyCost | None = None


@dataclass(frozen=True)
class Budget:
    """A privacy budget: what ``user`` may spend on ``table`` (``*``: all users / all tables)."""

    user: str = "*"
    table: str = "*"
    epsilon: Fraction | None = None
    rho: Fraction | None = None
    delta: Fraction | None = None  # of private group selection (added up per query), below 1


@dataclass(frozen=True)
class CellLimit:
    """How many distinct non-DP cells ``user`` may be released from ``table`` per ``per`` (a
    UTC calendar hour, day, week or month; ``*``: all users together / all tables): the bound
    on queries that bounded noise needs against reconstruction (Dinur & Nissim 2003)."""

    user: str = "*"
    table: str = "*"
    cells: int = 0
    per: str = "day"


@dataclass(frozen=True)
class Suppression:
    """The table every suppressed release of a confidential table is cut from.

    ``dimensions`` are dimension columns or hierarchy names; their full cross-classification
    with every margin and sub-total is protected once (primary rules, ``secondary`` suppression
    at minimum ``cost``, attacker audit), and queries read their cells from it. Protecting one
    covering table, not each query's own table, is what keeps overlapping releases consistent:
    every published cell comes from one audited pattern (the linked-tables approach of τ-ARGUS).
    """

    dimensions: tuple[str, ...]
    secondary: SecondaryMethod = SecondaryMethod.GAUSS
    cost: str = "value"
    time_limit: float = 60.0
    # GaussSuppression's singleton method (SSBtools ``singletonMethod``), over the gauss, optimal
    # or HiTaS pattern: ``anySumAudit`` (anySum redone until no one-unit cell's respondent
    # computes another primary, red team s44o), SSBtools' ``anySum``, the conservative
    # ``subSpace``, ... (tabular/gauss.py)
    singleton: str = "anySumAudit"


@dataclass(frozen=True)
class ClassesOf:
    """A dimension declared the class of a measure (``classes_of``): ``labels[i]`` for the
    values v with ``breaks[i - 1] <= v < breaks[i]`` (the first label below the first break,
    the last from the last break up), NULL where the measure is NULL. When the measure carries
    permanent unit noise the dimension is read as the class of x·m, the value every sum adds
    (:mod:`sqlsdc.rewrite.derived_classes`), never the stored class of x."""

    measure: str
    breaks: tuple[float, ...]
    labels: tuple[Any, ...]


@dataclass(frozen=True)
class Column:
    name: str
    role: ColumnRole
    domain: tuple[Any, ...] | None = None
    bounds: tuple[float, float] | None = None
    breaks: tuple[float, ...] | None = None  # the values row conditions may compare a measure with
    references: tuple[str, str] | None = None  # (table, column) this identifier points to
    description: str = ""
    classes_of: ClassesOf | None = None  # a dimension that is the class of a measure


@dataclass(frozen=True)
class Table:
    name: str
    kind: TableKind
    columns: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    privacy_unit: str | None = None
    key: str | None = None  # a public table's unique key column (indexed when applied)
    hierarchies: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    protection: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    description: str = ""
    suppression: Suppression | None = None
    dp: DpSettings | None = None

    @property
    def is_public(self) -> bool:
        return self.kind is TableKind.PUBLIC

    @property
    def differentially_private(self) -> bool:
        """Some aggregate kind of this table is protected by DP: every release of its data
        must then be a DP release charged to the budget."""
        return any(rule.method is Method.DP for rule in self.protection.values())

    @property
    def budget_kinds(self) -> frozenset[str]:
        """The kinds of privacy budget ("epsilon", "rho", "delta") its queries may be charged:
        the spends of its DP rules and bounding report, and private group selection's epsilon
        and delta. DP syntheses of any confidential table spend epsilon besides. A grant of
        a kind no table spends is noted by ``sqlsdc budget grant|set`` (new user s44g)."""
        costs = [r.spend for r in self.protection.values() if r.method is Method.DP and r.spend]
        if self.dp is not None and self.dp.bounding_report is not None:
            costs.append(self.dp.bounding_report)
        kinds = {k for cost in costs for k in ("epsilon", "rho", "delta") if getattr(cost, k)}
        if self.dp is not None and self.dp.groups is GroupKeys.PRIVATE:
            kinds |= {"epsilon", "delta"}
        return frozenset(kinds)

    def column(self, name: str) -> Column | None:
        return self.columns.get(name.lower())

    def rule(self, kind: AggregateKind) -> ProtectionRule:
        return self.protection[kind]


@dataclass(frozen=True)
class User:
    name: str
    role: UserRole


@dataclass(frozen=True)
class Policy:
    """A validated policy. Build it with :func:`sqlsdc.policy.load_policy`."""

    tables: MappingProxyType
    users: MappingProxyType
    document: MappingProxyType  # the validated source document, for storing and showing
    source: str = "<policy>"
    budgets: tuple[Budget, ...] = ()
    cell_limits: tuple[CellLimit, ...] = ()  # distinct non-DP cells per user, table, period
    # outputs (protected.NAME of synthesis/anonymisation jobs) analysts read row by row
    releases: tuple[str, ...] = ()
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT  # seconds; the policy's, not the user's
    max_statement_characters: int = DEFAULT_MAX_STATEMENT_CHARACTERS  # longer SQL is refused
    # (line, column) of each key and item of the source text (``sqlsdc.policy.read.Marks``), so
    # that the problems applying it finds in the database point at their place as validation's do
    marks: MappingProxyType = field(
        default_factory=lambda: MappingProxyType({}), compare=False, repr=False
    )

    def table(self, name: str) -> Table | None:
        return self.tables.get(name.lower())

    def declared(self, name: str) -> Table:
        """The table ``name`` declares, or :class:`~sqlsdc.errors.NotFoundError` naming the
        confidential tables: a command given a table the policy does not declare says "not
        found" (exit code 8), as for a missing stored output; rekey, synthesize and protect said
        exit 1, budget 2 (new user s44g)."""
        table = self.table(name)
        if table is None:
            known = ", ".join(t.name for t in self.confidential_tables) or "none"
            raise NotFoundError(
                f"the policy declares no table {name!r} (its confidential tables: {known})"
            )
        return table

    def document_dict(self) -> dict:
        """A private deep copy of the validated source document (for storing and showing)."""
        return copy.deepcopy(dict(self.document))

    def user(self, name: str) -> User | None:
        return self.users.get(name)

    @property
    def confidential_tables(self) -> list[Table]:
        return [t for t in self.tables.values() if not t.is_public]
