"""What a DP query costs, decided before anything is computed (and before the charge): the
public domains of its stages, the data versions its cells are named by, the price of the
statistics not paid before, and the refusals of a release too large to compute or of group
keys that do not name one group per value (:mod:`sqlsdc.guard.dp_charge` charges the price,
then :func:`sqlsdc.guard.dp_release.release` draws the noise).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

import pyarrow as pa
from sqlglot import exp

from sqlsdc.errors import PolicyViolation
from sqlsdc.guard import dp_limits
from sqlsdc.guard.dp_cell_keys import (
    Domains,
    _check_private_key,
    _grid_keys,
    _in_python_range,
    _mechanisms,
    _space,
)
from sqlsdc.mechanisms.accountant import ZERO, PrivacyCost
from sqlsdc.mechanisms.dp_cells import (
    CellMechanism,
    CellRecord,
    cell_digests,
    statistic_identity,
)
from sqlsdc.rewrite import dp as rewrite_dp
from sqlsdc.rewrite.dp import DpStage

if TYPE_CHECKING:
    pass


@dataclass
class DpPrice:
    """What a query's DP statistics cost before anything is computed, and the statistics
    (:func:`statistic_identity` records) that the charge pays for."""

    cost: PrivacyCost = ZERO
    statistics: list[CellRecord] = field(default_factory=list)


def resolve_domains(stages, run: Callable[[str], pa.Table]) -> Domains:
    """Per stage relation, the values of each key's public domain (declared values, or the
    values of a public table's column: public data only), or None for private groups."""
    out: Domains = {}
    for stage in stages:
        if stage.domains is None or not stage.keys:
            out[stage.relation] = None if stage.domains is None else []
            continue
        out[stage.relation] = [
            list(d) if isinstance(d, tuple) else _domain_values(run(d)) for d in stage.domains
        ]
    return out


def _domain_values(values: pa.Table) -> list:
    """A public table's values as Python values; dates beyond Python's range (a table's
    'infinity') are left out, as their cells would be (:func:`_representable`)."""
    column = values.column(0)
    inside = _in_python_range(column)
    return (column if inside is None else column.filter(inside)).to_pylist()


def data_versions_of(stages, data_version: Callable[[str], str], declared) -> dict[str, str]:
    """Per tabulated table, the data version its cells are named by: the table's own, then
    ``;name=version`` of every other declared table (``declared``: name -> bool) that a stage
    of it reads. A cell's exact value depends on every table its population joins (a public
    table's labels, a confidential table's filter columns), so the same noise must never
    come back over another version of any of them: it would reveal the exact difference.
    Stages over one table alone keep the table's own version."""
    joined: dict[str, set[str]] = {}
    for stage in stages:
        joined.setdefault(stage.table, set()).update(
            n for n in stage.reads if n != stage.table and declared(n)
        )
    return {
        table: data_version(table) + "".join(f";{t}={data_version(t)}" for t in sorted(others))
        for table, others in joined.items()
    }


def price(stages, *, data_versions: dict[str, str], domains: Domains, paid=None) -> DpPrice:
    """The cost of every statistic of ``stages`` not paid before (``paid``: a look-up of
    statistic digests this user paid for and was released, as for ``cached``), each once per
    query; private selection's delta comes with its noisy unit counts."""
    wanted = []
    for stage in stages:
        space = _space(stage, data_versions)
        for stat in stage.statistics:
            mechanism = CellMechanism(stat.measure, stat.calibration)
            wanted.append((stage, stat, statistic_identity(space, mechanism,
                                                           domains[stage.relation])))  # fmt: skip
    known = _lookup(paid, [ident.digest for _s, _t, ident in wanted])
    out = DpPrice()
    for stage, stat, ident in wanted:
        if ident.digest in known or any(r.identity == ident for r in out.statistics):
            continue
        out.cost = out.cost + stat.calibration.cost
        if stage.selection is not None and stat.column == stage.units:
            out.cost = out.cost + PrivacyCost(delta=stage.delta)  # (epsilon, delta) selection
        out.statistics.append(CellRecord(ident, stat.column, stat.calibration.statistic,
                                         Fraction(0)))  # fmt: skip
    return out


def check_sizes(stages, domains: Domains) -> None:
    """Refuse, before anything is charged, a query whose release is too large to compute: the
    cells of public domains over :data:`~sqlsdc.rewrite.dp.MAX_DOMAIN_CELLS` (the rewrite
    weighs declared domains; a public table's values are known here: two keys of public
    tables of 1,000 values each were a grid of 10^6 cells built in Python after the charge,
    three of them 10^9: red team s36b), and a quantile's scores (cells x candidate values)
    over :data:`~sqlsdc.guard.dp_limits.MAX_QUANTILE_SCORES`. It is decided from the policy
    (bounds and granularity give the candidates) and the public domains (the cells): a refusal
    after the charge would make the analyst pay for nothing. Private groups take their cells
    from the data, so only one cell's candidates are weighed here; their cells are scored in
    blocks of at most that many scores (:func:`~sqlsdc.mechanisms.dp_cells.noisy_quantiles`),
    never refused once paid."""
    for stage in stages:
        stage_domains = domains[stage.relation]
        cells = 1 if stage_domains is None else math.prod(map(len, stage_domains))
        if cells > rewrite_dp.MAX_DOMAIN_CELLS:
            raise PolicyViolation(
                f"the public domains of the group keys give {cells:,} cells (more than "
                f"{rewrite_dp.MAX_DOMAIN_CELLS:,})",
                "group by fewer or coarser dimensions",
            )
        for name, _sql in stage.histograms:
            b = next(s for s in stage.statistics if s.column == name).calibration.bounding
            candidates = int((b.upper - b.lower) / b.granularity) + 1
            if candidates * max(cells, 1) > dp_limits.MAX_QUANTILE_SCORES:
                raise PolicyViolation(
                    f"a DP quantile over {cells:,} cells with {candidates:,} candidate values "
                    "each is too large to compute",
                    "ask fewer groups, or an admin sets a coarser dp.granularity for the table",
                )


def stage_cells(stages, domains: Domains) -> dict[str, tuple[int, frozenset[str]]]:
    """Per stage relation, the most cells it releases and its key columns (one cell per key
    values), known before the charge: the product of its public domains, or
    :data:`~sqlsdc.guard.dp_limits.MAX_PRIVATE_GROUPS` for private groups
    (:mod:`sqlsdc.guard.answer_bound`)."""
    out = {}
    for stage in stages:
        stage_domains = domains[stage.relation]
        if not stage.keys:
            cells = 1
        elif stage_domains is None:
            cells = dp_limits.MAX_PRIVATE_GROUPS
        else:
            cells = math.prod(map(len, stage_domains))
        keys = frozenset(f"__g{j}" for j in range(len(stage.keys)))
        if stage_domains is not None and not all(map(_distinct, stage_domains)):
            keys = frozenset()  # a declared domain that repeats a value repeats its cells
        out[stage.relation.lower()] = (cells, keys)
    return out


def _distinct(values: list) -> bool:
    """Whether a domain's values are distinct, and of one type (so distinct in SQL too)."""
    try:
        return len({type(v) for v in values}) <= 1 and len(set(values)) == len(values)
    except TypeError:  # values Python cannot hash (lists): not known to be distinct
        return False


def prefetching(
    cached: Callable[[list[str]], dict], stages, *, data_versions: dict[str, str], domains: Domains
) -> Callable[[list[str]], dict]:
    """``cached`` (digests -> values already released) that also asks, with its first call
    (:func:`price`'s statistics), for the cells :func:`release` will look up over the stages'
    public domains (up to :data:`~sqlsdc.guard.dp_limits.PREFETCHED_CELLS`), and does not ask
    again for digests it asked: one look-up instead of two. A cell cached by a concurrent query
    in between is drawn again with the same value (the noise is a function of the cell)."""
    expected = _expected_cells(stages, data_versions, domains)
    found: dict = {}
    asked: set[str] = set()

    def lookup(digests: list[str]) -> dict:
        digests = list(digests)
        wanted = [d for d in dict.fromkeys(digests + (expected if not asked else [])) if
                  d not in asked]  # fmt: skip
        if wanted:
            found.update(cached(wanted))
            asked.update(wanted)
        return {d: found[d] for d in digests if d in found}

    return lookup


def _expected_cells(stages, data_versions: dict[str, str], domains: Domains) -> list[str]:
    out: list[str] = []
    for stage in stages:
        stage_domains = domains[stage.relation]
        if stage_domains is None or not stage.keys:
            continue
        mechanisms = _mechanisms(stage)
        cells = math.prod(map(len, stage_domains)) * len(mechanisms)
        if len(out) + cells > dp_limits.PREFETCHED_CELLS:
            break
        out += cell_digests(_grid_keys(stage, stage_domains), _space(stage, data_versions),
                            mechanisms)  # fmt: skip
    return out


def _lookup(cached, digests: list[str]) -> dict:
    if cached is None:
        return {}
    return dict(cached(digests) if callable(cached) else cached)


def check_private_keys(stages, describe: Callable[[DpStage], pa.Table], key_types=None) -> None:
    """Refuse, before anything is charged, private groups by a key whose type does not name
    one group per value (:func:`_representable`). The type is the query's, not the data's:
    ``describe`` gives a stage's exact cells without their rows (:func:`no_rows`, which the
    engine answers without reading data), unless ``key_types`` (stage SQL -> the key types
    of an earlier run, :func:`release`) knows them."""
    for stage in stages:
        if stage.domains is not None or not stage.keys:
            continue
        types = None if key_types is None else key_types.get(stage.sql)
        if types is None:
            schema = describe(stage).schema
            types = [schema.field(f"__g{j}").type for j in range(len(stage.keys))]
        for kind in types:
            _check_private_key(kind)


def no_rows(stage: DpStage) -> exp.Select:
    """The stage's exact cells with no row (``LIMIT 0``): their column types, read from the
    query and the schema alone (DuckDB plans it as an empty result)."""
    cells = stage.trees[None].subquery("__cells")
    return exp.select("*").from_(cells, copy=False).limit(0, copy=False)
