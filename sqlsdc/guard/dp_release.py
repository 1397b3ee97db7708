"""Release step of DP queries: exact bounded cells in, noisy cells (and their cost) out.

For every DP aggregation of a query (:class:`sqlsdc.rewrite.dp.DpStage`) the engine computes
the exact bounded cells; this module completes them to the public domain (empty groups
included) or selects private groups by noisy-count thresholding, draws the noise of every
base statistic with the keyed exact samplers (:func:`sqlsdc.mechanisms.dp_cells.add_noise`;
cells this user has seen before come from the cache and cost nothing), post-processes AVG,
VAR, STDDEV and quantiles, applies the minimum-frequency rule on noisy unit counts, and
returns the noisy cells as Arrow tables ready to be registered under the stage's relation
name. Nothing here writes to the database.

Budget before computation: the exact cells are a computation on confidential data whose
failure or running time an analyst could try to exploit, so the caller prices the query with
:func:`price` and charges that with :func:`sqlsdc.catalog.budget.charge` *before* it calls
:func:`release`. A query pays per statistic over all cells of its partition
(:func:`sqlsdc.mechanisms.dp_cells.statistic_identity`): its canonical population, keys,
domains, measure and calibration. What this user was released before (paid, and its cells
cached) costs nothing again; a statistic paid by an asking stopped before its cells were
cached is paid again. A statistic that appears in two aggregations of one query (``UNION`` of
the same cells, the same derived table twice) is paid and drawn once.

Noise-off mode (``noise=False``, admins only) returns the exact bounded values, with zero
cost and no cache: it shows what bounding, clamping, NULLs and empty groups do to a query.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from sqlsdc.engines.duckdb import mark_wide_integers
from sqlsdc.errors import PolicyViolation
from sqlsdc.mechanisms.accountant import ZERO, Aggregate, PrivacyCost, Statistic, ratio_sd
from sqlsdc.mechanisms.dp_cells import (
    CellMechanism,
    CellRecord,
    CellSpace,
    average,
    cell_digests,
    cell_identity,
    noisy_quantiles,
    noisy_values,
    statistic_identity,
    stddev,
    variance,
)
from sqlsdc.rewrite import dp as rewrite_dp
from sqlsdc.rewrite.dp import DpStage

if TYPE_CHECKING:
    import pandas as pd

WIDE_INTEGER = pa.decimal128(38, 0)
"""The type of a DP SUM over an integral grid, as DuckDB's SUM of integers (HUGEINT; Spark:
DECIMAL(38, 0)): its exact value may pass 2^63 (bounds to 1e15 over 10^4 rows), and its noise
too; the rewrite refuses a calibration whose noise could pass 10^38
(:data:`sqlsdc.rewrite.dp_aggregates.NOISE_MARGIN`)."""
MAX_QUANTILE_SCORES = 50_000_000  # cells x candidates of one quantile (memory: 8 bytes each)
MAX_PRIVATE_GROUPS = 1_000_000
"""The most groups one stage releases by private selection, as many as a connection returns
(:data:`sqlsdc.guard.connection.MAX_ANSWER_ROWS`) and as public domains may have
(:data:`sqlsdc.rewrite.dp.MAX_DOMAIN_CELLS`): the bound of its cells known before the charge
(:func:`stage_cells`). Beyond it, the groups kept are those of the smallest cell digests
(:func:`_selected`), a choice by the released keys alone."""
Z95 = 1.959963984540054  # two-sided 95% normal quantile (delta-method intervals of averages)


@dataclass
class DpRelease:
    """Noisy cells per relation, the cells drawn now and the statistics the asking's charge
    paid for (to cache together: a statistic counts as paid for a later asking only once its
    cells are cached, :mod:`sqlsdc.guard.dp_charge`)."""

    relations: dict[str, pa.Table] = field(default_factory=dict)
    cells: list[CellRecord] = field(default_factory=list)
    reused: int = 0
    releases: list[tuple[str, str]] = field(default_factory=list)  # (digest, keys): to cache
    statistics: list[CellRecord] = field(default_factory=list)  # paid by this asking: to cache


@dataclass
class DpPrice:
    """What a query's DP statistics cost before anything is computed, and the statistics
    (:func:`statistic_identity` records) that the charge pays for."""

    cost: PrivacyCost = ZERO
    statistics: list[CellRecord] = field(default_factory=list)


Domains = dict[str, list[list] | None]


@dataclass
class _Cells:
    """One stage's cells as plain columns, one value per cell: the ``__g<j>`` keys (Python
    values, NULL as None) and the exact statistics (integers in grid units). A handful of
    cells go through as lists: a pandas frame of 8 cells cost more (0.5-1 ms per query) than
    drawing their noise."""

    columns: dict[str, list]
    n: int

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, name: str) -> list:
        return self.columns[name]

    def where(self, keep: list[bool]) -> _Cells:
        """The cells where ``keep`` is true, in order."""
        columns = {c: [v for v, k in zip(values, keep, strict=True) if k]
                   for c, values in self.columns.items()}  # fmt: skip
        return _Cells(columns, sum(map(bool, keep)))

    def keys_frame(self, keys: list[str]) -> pd.DataFrame:
        """The key columns as a frame of Python values (object dtype), one row per cell."""
        import pandas as pd

        return pd.DataFrame({k: self.columns[k] for k in keys}, index=range(self.n), dtype=object)


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


def _space(stage: DpStage, data_versions: dict[str, str]) -> CellSpace:
    return CellSpace.of(
        stage.table,
        {f"__g{j}": name for j, name in enumerate(stage.keys)},
        scope=stage.scope,
        data_version=data_versions[stage.table],
    )


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
    over :data:`MAX_QUANTILE_SCORES`. It is decided from the policy (bounds and granularity
    give the candidates) and the public domains (the cells): a refusal after the charge would
    make the analyst pay for nothing. Private groups take their cells from the data, so only
    one cell's candidates are weighed here; their cells are scored in blocks of at most that
    many scores (:func:`~sqlsdc.mechanisms.dp_cells.noisy_quantiles`), never refused once
    paid."""
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
            if candidates * max(cells, 1) > MAX_QUANTILE_SCORES:
                raise PolicyViolation(
                    f"a DP quantile over {cells:,} cells with {candidates:,} candidate values "
                    "each is too large to compute",
                    "ask fewer groups, or an admin sets a coarser dp.granularity for the table",
                )


def stage_cells(stages, domains: Domains) -> dict[str, tuple[int, frozenset[str]]]:
    """Per stage relation, the most cells it releases and its key columns (one cell per key
    values), known before the charge: the product of its public domains, or
    :data:`MAX_PRIVATE_GROUPS` for private groups (:mod:`sqlsdc.guard.answer_bound`)."""
    out = {}
    for stage in stages:
        stage_domains = domains[stage.relation]
        if not stage.keys:
            cells = 1
        elif stage_domains is None:
            cells = MAX_PRIVATE_GROUPS
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


PREFETCHED_CELLS = 256
"""At most this many cells over public domains are looked up with a query's statistics."""


def prefetching(
    cached: Callable[[list[str]], dict], stages, *, data_versions: dict[str, str], domains: Domains
) -> Callable[[list[str]], dict]:
    """``cached`` (digests -> values already released) that also asks, with its first call
    (:func:`price`'s statistics), for the cells :func:`release` will look up over the stages'
    public domains (up to :data:`PREFETCHED_CELLS`), and does not ask again for digests it
    asked: one look-up instead of two. A cell cached by a concurrent query in between is drawn
    again with the same value (the noise is a function of the cell)."""
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
        if len(out) + math.prod(map(len, stage_domains)) * len(mechanisms) > PREFETCHED_CELLS:
            break
        out += cell_digests(_grid_keys(stage, stage_domains), _space(stage, data_versions),
                            mechanisms)  # fmt: skip
    return out


def _lookup(cached, digests: list[str]) -> dict:
    if cached is None:
        return {}
    return dict(cached(digests) if callable(cached) else cached)


def release(
    stages,
    run: Callable[[str], pa.Table],
    *,
    secret: bytes,
    policy_version: int,
    data_versions: dict[str, str],
    cached=None,
    noise: bool = True,
    domains: Domains | None = None,
    key_types: dict[str, list[pa.DataType]] | None = None,
    time_left: Callable[[], object] | None = None,
    released: Callable[[str], str | None] | None = None,
    describe: Callable[[DpStage], pa.Table] | None = None,
) -> DpRelease:
    """Noisy cells of every stage. ``run`` executes SQL on the engine (exact cells);
    ``domains`` are those of :func:`resolve_domains` (read with ``run`` when not given).
    A cell drawn for one stage is reused by any other stage of the query that has it.

    ``key_types``: the engine's key types of the stage SQL texts run before (filled here).
    A stage over public domains (or without keys) whose every cell was released to this user
    before is answered from the cache without computing its exact cells (:func:`_from_cache`):
    a repeated query costs its cells, not a scan of the table. Its key types are those known,
    or else ``describe``'s (a stage's exact cells without rows, :func:`no_rows`); with
    neither, the stage is computed.

    ``time_left`` (the statement's: it raises once the timeout has passed or the statement
    was cancelled) is called before each stage and within the quantile draws, whose Python
    loop no engine interrupt reaches. The caller has charged the query by then: a draw
    stopped this way has read the data (its running time depends on the histograms), so it
    must have been paid for, as a query stopped while the engine computes its exact cells.

    ``released`` (a release digest -> the keys recorded, or None): the groups a private
    selection released to this user before (:func:`_released_before`), whose stage is then
    answered from the cache without computing its exact cells again."""
    out = DpRelease()
    if domains is None:
        domains = resolve_domains(stages, run)
    drawn: dict[str, Fraction] = {}

    def known(digests: list[str]) -> dict:
        found = _lookup(cached, digests)
        found.update((d, drawn[d]) for d in digests if d in drawn)
        return found

    for stage in stages:
        if time_left is not None:
            time_left()
        space = _space(stage, data_versions)
        types = None if key_types is None else key_types.get(stage.sql)
        if noise and (types is not None or describe is not None):
            reused = _from_cache(stage, space, domains[stage.relation], known)
            if reused is not None:
                frame, noisy = reused
                if types is None:  # a new opening: the types from the SQL, no row read
                    schema = describe(stage).schema if stage.keys else None
                    types = [schema.field(f"__g{j}").type for j in range(len(stage.keys))]
                    if key_types is not None:
                        key_types[stage.sql] = types
                out.reused += len(frame) * len(noisy)
                out.relations[stage.relation] = _cells_table(frame, noisy, stage, noise, types)
                continue
        digest = release_digest(stage, space) if noise else None
        if digest is not None and released is not None:
            reused = _released_before(stage, space, released(digest), known)
            if reused is not None:
                frame, noisy, types = reused
                if key_types is not None:  # the key types' check need not ask the engine
                    key_types[stage.sql] = types
                out.reused += len(frame) * len(noisy)
                out.relations[stage.relation] = _cells_table(frame, noisy, stage, noise, types)
                continue
        exact_cells = _representable(run(stage.sql), stage, domains[stage.relation] is None)
        frame = _complete(exact_cells, stage, domains[stage.relation])
        noisy, drawn_now, rows = _noisy(frame, stage, space, secret, policy_version, known,
                                        noise, out)  # fmt: skip
        if stage.selection is not None:
            frame, noisy, drawn_now = _selected(stage, space, frame, noisy, drawn_now, rows)
        out.cells += drawn_now
        for name, sql in stage.histograms:
            stat = next(s for s in stage.statistics if s.column == name)
            values, new = _quantiles(run(sql), frame, stage, stat, space, secret,
                                     policy_version, known, noise, time_left)  # fmt: skip
            noisy[name] = values
            out.cells += new
        drawn.update((c.identity.digest, c.value) for c in out.cells)
        types = [exact_cells.schema.field(f"__g{j}").type for j in range(len(stage.keys))]
        if key_types is not None:
            key_types[stage.sql] = types
        out.relations[stage.relation] = _cells_table(frame, noisy, stage, noise, types)
        if digest is not None:
            out.releases.append((digest, _recorded_keys(frame, stage, types)))
    return out


RELEASE_LABEL = "sqlsdc.dp_private_release.v2"


def release_digest(stage: DpStage, space: CellSpace) -> str | None:
    """The catalog key of the groups a private selection released for ``stage`` (the identity
    of its noisy unit count, which names the population, keys, bounding and data versions,
    and the selection's parameters), or None for a stage that is not answered this way
    (public domains).

    Why: a private stage's exact cells are otherwise computed at every asking, free once its
    statistics are paid, and the engine's and the selection's work grows with the groups and
    rows present before the selection: timed again and again, a population of one row told
    itself from an empty one (red team s37b). Keyed by the statistics, not the SQL, so that a
    rephrasing (which gives the same identities) is no fresh timing either; and by the unit
    count alone, the one statistic the selection decides by, so that a stage asking part of
    the statistics paid together (COUNT(*) alone after COUNT(*) and SUM) is no fresh timing:
    keyed by every statistic, each subset of k paid statistics, 2^k - 1 stages, computed its
    exact cells once for free (red team s37e). A stage without keys has one cell, released
    or dropped by the selection: dropped, nothing of it was cached, and it was computed at
    every asking (red team s41b), so its outcome is kept too."""
    if stage.selection is None:
        return None
    units = _all_mechanisms(stage)[stage.units]
    chosen = stage.selection
    text = json.dumps(
        {
            "label": RELEASE_LABEL,
            "units": statistic_identity(space, units, None).digest,
            "selection": [str(chosen.epsilon), str(chosen.delta), chosen.max_groups,
                          chosen.per_group, chosen.threshold, MAX_PRIVATE_GROUPS],
        },
        sort_keys=True,
    )  # fmt: skip
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


RELEASED = "__released"
"""The column of a private stage without keys in the catalog's record of its release."""


def _recorded_keys(frame: _Cells, stage: DpStage, types: list[pa.DataType]) -> str:
    """The released groups' keys as the catalog keeps them: an Arrow IPC stream (base64) with
    one column per canonical key name, of the engine's types (without keys, a column
    :data:`RELEASED` with a row if the one cell was released)."""
    table = pa.table({name: _keys(frame[f"__g{j}"], types[j])
                      for j, name in enumerate(stage.keys)})  # fmt: skip
    if not stage.keys:
        table = pa.table({RELEASED: pa.array([True] * len(frame), pa.bool_())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode("ascii")


def _released_before(stage: DpStage, space: CellSpace, recorded: str | None, known):
    """The frame, noisy values and key types of a private stage from the groups it released
    before (``recorded``, :func:`_recorded_keys`) and their cached cells, or None when they
    are not all there (the stage is then computed)."""
    if recorded is None:
        return None
    try:
        table = pa.ipc.open_stream(base64.b64decode(recorded)).read_all()
        columns = {f"__g{j}": table.column(name).to_pylist() for j, name in enumerate(stage.keys)}
        types = [table.schema.field(name).type for name in stage.keys]
        if not stage.keys and table.column_names != [RELEASED]:
            return None
    except (KeyError, ValueError, pa.ArrowException):
        return None
    n = table.num_rows
    mechanisms = _all_mechanisms(stage)  # quantiles' cells are cached by the same identities
    values = _cached_values(columns, n, space, mechanisms, known)
    return None if values is None else (_Cells(columns, n), values, types)


def _from_cache(stage: DpStage, space: CellSpace, stage_domains, known):
    """The frame (the domains' grid, or the one cell of a stage without keys) and noisy
    values of a stage whose cells all come from the cache, quantiles' included, or None when
    its exact cells must be computed (private groups, answered by :func:`_released_before`,
    or a cell not released to this user before).

    Why: a stage's exact cells, computed at every asking once its statistics are paid, gave
    free timings of the engine's work on the population's rows, at every new opening (this
    answer needed the key types its first run had read on the same opening) and at every
    asking of a quantile or of a grid over :data:`PREFETCHED_CELLS` (red team s41b: a new
    connection per asking, the one-row population slower than the empty one in 75 of 120
    paired runs). A grid larger than the prefetched cells is looked up only when its
    statistics were paid before (:func:`_paid_before`): a new one would look up in vain."""
    if stage.keys and (stage_domains is None or stage.selection):
        return None
    mechanisms = _all_mechanisms(stage)  # quantiles' cells are cached by the same identities
    n = math.prod(map(len, stage_domains)) if stage.keys else 1
    if n * len(mechanisms) > PREFETCHED_CELLS and not _paid_before(stage, space, stage_domains,
                                                                    known):  # fmt: skip
        return None
    keys = _grid_keys(stage, stage_domains) if stage.keys else {}
    values = _cached_values(keys, n, space, mechanisms, known)
    return None if values is None else (_Cells(keys, n), values)


def _paid_before(stage: DpStage, space: CellSpace, stage_domains, known) -> bool:
    """Whether this user paid every statistic of the stage before (as :func:`price` names
    them; looked up with the query's statistics, so no read of its own)."""
    digests = [statistic_identity(space, m, stage_domains).digest
               for m in _all_mechanisms(stage).values()]  # fmt: skip
    found = known(digests)
    return all(d in found for d in digests)


def _cached_values(keys, n: int, space: CellSpace, mechanisms, known):
    """The cached noisy values of the ``n`` cells of ``keys`` by mechanism column, or None
    when one of them was not released to this user before."""
    if keys:
        digests = cell_digests(keys, space, mechanisms)
    else:  # the one cell of a stage without keys (none: dropped by its selection)
        digests = [cell_identity(space, m, {}).digest for m in mechanisms.values() if n]
    found = known(digests)
    if any(d not in found for d in digests):
        return None
    return {column: [Fraction(found[d]) for d in digests[i * n:(i + 1) * n]]
            for i, column in enumerate(mechanisms)}  # fmt: skip


def _mechanisms(stage: DpStage) -> dict[str, CellMechanism]:
    """The stage's additive statistics (quantiles are drawn from histograms) by column."""
    return {s.column: CellMechanism(s.measure, s.calibration) for s in stage.statistics
            if s.calibration.statistic is not Statistic.QUANTILE}  # fmt: skip


def _all_mechanisms(stage: DpStage) -> dict[str, CellMechanism]:
    """Every statistic of the stage, quantiles included, by column."""
    return {s.column: CellMechanism(s.measure, s.calibration) for s in stage.statistics}


def _grid_keys(stage: DpStage, stage_domains: list[list]) -> dict[str, list]:
    """The ``__g<j>`` key columns of the public domains' product, one row per cell."""
    grid = list(itertools.product(*stage_domains))
    return {f"__g{j}": [key[j] for key in grid] for j in range(len(stage.keys))}


def _representable(exact_cells: pa.Table, stage: DpStage, private: bool) -> pa.Table:
    """The exact cells whose group keys become distinct Python values; the others dropped.

    Keys become Python values (to encode each cell's identity, to complete public domains), and
    that must neither fail for some values only (the error would tell, exactly and whatever
    the noise, whether a group with such a key exists: DuckDB's dates and timestamps reach far
    beyond Python's years 1 to 9999, 'infinity' among them) nor give two groups one identity
    (one noise on two exact values reveals their difference). So keys of dates and timestamps
    outside Python's range are dropped, as keys outside a public domain are: whether a cell
    is dropped depends on its key, never on its count. Private groups (keys from the data)
    of a type whose Python values are not one per group are refused, by the type alone:
    floats (the NaN and the NULL group would be one cell) and times (``24:00:00`` is
    ``00:00:00`` in Python, TIMETZ loses its offset)."""
    keep = None
    for j in range(len(stage.keys)):
        column = exact_cells.column(f"__g{j}")
        if private:  # checked before the charge (check_private_keys); kept here in depth
            _check_private_key(column.type)
        inside = _in_python_range(column)
        if inside is not None:
            keep = inside if keep is None else pc.and_(keep, inside)
    return exact_cells if keep is None else exact_cells.filter(keep)


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


def _check_private_key(kind: pa.DataType) -> None:
    if not _distinct_in_python(kind):
        raise PolicyViolation(
            f"a DP group key of type {kind} is not released as groups from the data (its "
            "values do not name one group each)",
            "cast the key to VARCHAR, or group by a dimension with a declared domain",
        )


def _distinct_in_python(kind: pa.DataType) -> bool:
    """Whether distinct keys of this type are distinct Python values of one canonical text
    each (:func:`sqlsdc.mechanisms.dp_cells.encode_key_value`)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    checks = (pa.types.is_null, pa.types.is_boolean, pa.types.is_integer, pa.types.is_decimal,
              pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
              pa.types.is_large_binary, pa.types.is_date, pa.types.is_timestamp)  # fmt: skip
    return any(check(kind) for check in checks) or kind == pa.string_view()


_EPOCH = dt.datetime(1970, 1, 1)
_PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def _in_python_range(column: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """Per value, whether Python's dates and datetimes hold it (NULL: yes); None for types
    without such a limit. Timestamps with a time zone keep a day's margin for its offset."""
    kind = column.type
    if pa.types.is_date32(kind):
        low, high, values = dt.date.min, dt.date.max, pc.cast(column, pa.int32())
        low, high = ((d - _EPOCH.date()).days for d in (low, high))
    elif pa.types.is_date64(kind):
        days = [(d - _EPOCH.date()).days for d in (dt.date.min, dt.date.max)]
        low, high, values = days[0] * 86_400_000, days[1] * 86_400_000, pc.cast(column, pa.int64())
    elif pa.types.is_timestamp(kind):
        margin = dt.timedelta(days=1 if kind.tz else 0)
        per = _PER_SECOND[kind.unit]
        low, high = (
            (t - _EPOCH) // dt.timedelta(microseconds=1) * per // 10**6
            for t in (dt.datetime.min + margin, dt.datetime.max - margin)
        )
        low, high = max(low, -(2**63) + 1), min(high, 2**63 - 1)  # -2**63: pandas' NaT
        values = pc.cast(column, pa.int64())
    else:
        return None
    inside = pc.and_(pc.greater_equal(values, low), pc.less_equal(values, high))
    return pc.fill_null(inside, True)


def _exact_types(dtype: pa.DataType):
    """Keep exact integers and decimals as Python objects (HUGEINT sums come as decimals)."""
    import pandas as pd

    if pa.types.is_decimal(dtype) or pa.types.is_integer(dtype):
        return pd.ArrowDtype(dtype)
    return None


def _complete(exact_cells: pa.Table, stage: DpStage, domains: list[list] | None) -> _Cells:
    """The exact cells as exact integers (grid units); over public domains, one cell per
    domain cell (absent cells count 0; others dropped)."""
    stats = [s.column for s in stage.statistics
             if s.calibration.statistic is not Statistic.QUANTILE]  # fmt: skip
    keys = [f"__g{j}" for j in range(len(stage.keys))]
    if domains is None or not keys:
        exact = exact_cells.to_pandas(types_mapper=_exact_types)
        columns = {c: [_exact_int(v) for v in exact[c].tolist()] for c in stats}
        # keys as Python values, NULL as None: pandas makes a NULL timestamp NaT and a NULL
        # string NaN (its ``str`` dtype), which Arrow cannot take back to the type
        columns.update((key, exact_cells.column(key).to_pylist()) for key in keys)
        return _Cells(columns, exact_cells.num_rows)
    values = {c: [_exact_int(v) for v in exact_cells.column(c).to_pylist()] for c in stats}
    present = list(zip(*(exact_cells.column(k).to_pylist() for k in keys), strict=True))
    found = list(zip(*values.values(), strict=True)) if stats else [()] * len(present)
    lookup = dict(zip(present, found, strict=True))
    columns = _grid_keys(stage, domains)
    zeros = (0,) * len(stats)
    plain = _grid_keys(stage, [[_plain(v) for v in d] for d in domains])  # columns' values
    rows = [lookup.get(key, zeros) for key in zip(*plain.values(), strict=True)]
    columns.update((c, [row[i] for row in rows]) for i, c in enumerate(stats))
    return _Cells(columns, len(rows))


def _exact_int(value) -> int:
    import pandas as pd

    return 0 if value is None or value is pd.NA else int(value)


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def _selected(stage: DpStage, space: CellSpace, frame: _Cells, noisy: dict, drawn: list,
              rows: list[int]):  # fmt: skip
    """Private groups: the cells, noisy values and cells drawn now (``drawn``, of rows
    ``rows``) of the groups the selection keeps, at most :data:`MAX_PRIVATE_GROUPS` (those of
    the smallest digests of their unit-count cells: the keys decide, post-processing).

    Only the cells of released groups are cached (``DpRelease.cells``, which the catalog's
    ``dp_cells`` keeps): a group the selection drops is never released, so neither its
    decision nor any value of it may be stored where an admin could read it back, or
    republish it (its key and noisy values of a tiny group). Asked again, its decision is
    drawn again, the same (the noise is a function of the cell), so the answer and the charge
    are those a cached decision gave."""
    keep = [v >= stage.selection.threshold for v in noisy[stage.units]]
    if sum(keep) > MAX_PRIVATE_GROUPS:
        kept = [i for i, k in enumerate(keep) if k]
        keys = {column: [frame[column][i] for i in kept] for column, _name in space.keys}
        units = {stage.units: _mechanisms(stage)[stage.units]}
        digests = cell_digests(keys, space, units)
        first = sorted(range(len(kept)), key=digests.__getitem__)[:MAX_PRIVATE_GROUPS]
        keep = [False] * len(keep)
        for i in first:
            keep[kept[i]] = True
    noisy = {c: [v for v, k in zip(values, keep, strict=True) if k]
             for c, values in noisy.items()}  # fmt: skip
    drawn = [cell for cell, row in zip(drawn, rows, strict=True) if keep[row]]
    return frame.where(keep), noisy, drawn


def _noisy(frame, stage, space, secret, version, cached, noise, out):
    """Noisy values (grid units times the unit, exact Fractions) of the additive statistics,
    the cells drawn now (to cache; ``out`` counts those that came from the cache) and the row
    of each. Exact values of unit 1 go to the noise as the integers they are (``_units``'
    short way; the same values)."""
    mechanisms = _mechanisms(stage)
    if not noise:
        return {column: [Fraction(int(v)) * m.calibration.unit for v in frame[column]]
                for column, m in mechanisms.items()}, [], []  # fmt: skip
    exact = {
        column: [int(v) if unit == 1 else Fraction(int(v)) * unit for v in frame[column]]
        for column, unit in ((c, m.calibration.unit) for c, m in mechanisms.items())
    }
    keys = {column: frame[column] for column, _name in space.keys}
    result = noisy_values(keys, exact, space, mechanisms, secret=secret, policy_version=version,
                          cached=cached)  # fmt: skip
    out.reused += result.reused
    return {c: result.values[c] for c in mechanisms}, result.new_cells, result.new_rows


def _quantiles(histogram: pa.Table, cells, stage, stat, space, secret, version, cached, noise,
               time_left=None):  # fmt: skip
    import pandas as pd

    keys = [f"__g{j}" for j in range(len(stage.keys))]
    frame = cells.keys_frame(keys)
    kept = _representable(histogram, stage, private=False)
    long = kept.to_pandas()
    for key in keys:  # as the frame's keys (:func:`_complete`): NULL as None, not NaN
        long[key] = pd.Series(kept.column(key).to_pylist(), dtype=object)
    long = long[long["__bin"].notna()]  # rows whose measure is NULL do not count
    b = stat.calibration.bounding
    present = frame[keys].copy() if keys else pd.DataFrame(index=[0])
    present["__bin"], present["__count"] = 0, 0
    long = pd.concat([long, present], ignore_index=True)  # every released cell appears
    if keys:
        wanted = set(frame[keys].itertuples(index=False, name=None))
        long = long[[k in wanted for k in long[keys].itertuples(index=False, name=None)]]
    if not noise:
        return _exact_quantiles(long, frame, keys, b, stat.calibration.alpha), []
    result = noisy_quantiles(
        long, space, CellMechanism(stat.measure, stat.calibration), secret=secret,
        policy_version=version, column=stat.column, bin_column="__bin",
        count_column="__count", cached=cached, max_scores=MAX_QUANTILE_SCORES,
        check=time_left,
    )  # fmt: skip
    order = _align(result.frame, frame, keys)
    return [result.values[stat.column][i] for i in order], result.new_cells


def _align(released: pd.DataFrame, frame: pd.DataFrame, keys: list[str]) -> list[int]:
    if not keys:
        return [0]
    rows = released[keys].itertuples(index=False, name=None)
    position = {_null_as_none(k): i for i, k in enumerate(rows)}
    return [position[_null_as_none(k)] for k in frame[keys].itertuples(index=False, name=None)]


def _null_as_none(key: tuple) -> tuple:
    """A cell's keys with a missing value as None: pandas' factorising of the histogram makes
    a NULL key NaN (a NULL string group's quantile failed to find its cell). NaN and NULL are
    never two groups of one key (:func:`_representable`)."""
    import pandas as pd

    return tuple(None if v is None or v is pd.NA or (isinstance(v, float) and v != v) else v
                 for v in key)  # fmt: skip


def _exact_quantiles(long, frame, keys, b, alpha) -> list[Fraction]:
    """The exact alpha-quantile candidate per cell (noise-off mode): the smallest candidate
    with at least alpha of the rows at or below it."""
    values = []
    groups = long.groupby(keys, dropna=False, sort=False) if keys else [((), long)]
    found = {}
    for key, part in groups:
        hist = part.groupby("__bin")["__count"].sum()
        total = int(hist.sum())
        cumulative, chosen = 0, 0
        for j, count in hist.sort_index().items():
            cumulative += int(count)
            if total and cumulative >= alpha * total:
                chosen = int(j)
                break
        found[key if isinstance(key, tuple) else (key,)] = b.lower + chosen * b.granularity
    for row in frame[keys].itertuples(index=False, name=None) if keys else [()]:
        values.append(found.get(row, b.lower))
    return values


def _cells_table(frame, noisy, stage: DpStage, noise: bool, key_types: list) -> pa.Table:
    """``__g<j>`` keys (of the engine's types, ``key_types``), then per aggregate ``__a<i>``
    value, ``__p<i>`` published, and the noise's ``__sd<i>`` and ``__hw<i>`` (95% half-width)."""
    n = len(frame)
    columns = {f"__g{j}": _keys(frame[f"__g{j}"], key_types[j])
               for j in range(len(stage.keys))}  # fmt: skip
    withheld = None  # cells below the minimum frequency (without one, none)
    if stage.min_frequency is not None:
        withheld = np.array([v < stage.min_frequency for v in noisy[stage.units]], bool)
    published = pa.array([True] * n if withheld is None else ~withheld, pa.bool_())
    stats = {s.column: s for s in stage.statistics}
    dropped, clamped = _shares(stage, noisy, n)
    wide = set()  # SUMs of integers: exact integers of up to 38 digits, HUGEINT in DuckDB
    for i, output in enumerate(stage.outputs):
        parts = [noisy[c] for c in output.statistics]
        value, sd, half = _output(output, parts, [stats[c] for c in output.statistics], noise)
        if output.aggregate is Aggregate.SUM and output.plan.components[0].unit.denominator == 1:
            wide.add(f"__a{i}")
        kind = WIDE_INTEGER if f"__a{i}" in wide else None
        columns[f"__a{i}"] = pa.array(value, type=kind, mask=withheld)
        columns[f"__p{i}"] = published
        columns[f"__sd{i}"] = pa.array(sd, type=pa.float64())
        columns[f"__hw{i}"] = pa.array(half, type=pa.float64())
        columns[f"__dr{i}"] = dropped
        counted = output.aggregate in (Aggregate.COUNT, Aggregate.COUNT_DISTINCT)
        columns[f"__cl{i}"] = pa.array([0.0] * n) if counted and stage.report else clamped
    if not columns:
        return pa.table({"__none": [None] * n})
    return mark_wide_integers(pa.table(columns), wide)


def _shares(stage: DpStage, noisy: dict, n: int) -> tuple[pa.Array, pa.Array]:
    """Per cell, the shares of its input the bounding dropped and clamped, from the noisy
    bounding report (post-processing: D/(D + C + K) and C/(D + C + K), each clipped to [0, 1];
    NULL where the noisy total is not positive; D = 0 where nothing can be dropped). 0 where
    nothing can be dropped nor clamped (``stage.shares_zero``, no report drawn); NULL without
    a report."""
    if stage.shares_zero:
        zeros = pa.array(np.zeros(n))
        return zeros, zeros
    if stage.report is None:
        empty = pa.nulls(n, pa.float64())
        return empty, empty
    d, c, k = (np.array([float(v) for v in noisy[name]]) if name else np.zeros(n)
               for name in stage.report)  # fmt: skip
    total = d + c + k
    shown = total > 0
    safe = np.where(shown, total, 1.0)
    return tuple(pa.array(np.clip(x / safe, 0.0, 1.0), mask=~shown) for x in (d, c))


def _keys(values: list, engine_type: pa.DataType) -> pa.Array:
    """Group keys with the type the engine gave the column (a month stays INTEGER); keys of a
    declared domain that do not fit that type keep the type Arrow infers for them."""
    try:
        return pa.array(values, type=engine_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return pa.array(values)


def _output(output, parts, stats, noise: bool):
    """Released values of one aggregate with their noise sd and 95% half-width per cell."""
    n = len(parts[0])
    plan = output.plan
    lower, upper = plan.components[0].bounding.lower, plan.components[0].bounding.upper
    zeros = [0.0] * n if not noise else None
    if output.aggregate in (Aggregate.COUNT, Aggregate.COUNT_DISTINCT, Aggregate.SUM):
        values = parts[0]
        integral = stats[0].calibration.unit.denominator == 1
        value = [int(v) for v in values] if integral else [float(v) for v in values]
        return value, zeros or [plan.sd] * n, zeros or [plan.half_width] * n
    if output.aggregate is Aggregate.AVG:  # statistics of (measure - centre): see rewrite.dp
        total = np.array([float(v) for v in parts[0]])
        count = np.array([float(v) for v in parts[1]])
        shifted = average(total, count, lower, upper)
        value = shifted + float(output.centre)
        if not noise:
            return value.tolist(), zeros, zeros
        s_sd, c_sd = (c.sd for c in plan.components)
        sd = [ratio_sd(s_sd, c_sd, c, m) for c, m in zip(count, shifted, strict=True)]
        return value.tolist(), sd, [Z95 * x for x in sd]
    if output.aggregate in (Aggregate.VAR, Aggregate.STDDEV):
        squares, total, count = (np.array([float(v) for v in p]) for p in parts)
        f = variance if output.aggregate is Aggregate.VAR else stddev
        value = f(squares, total, count, lower, upper, ddof=output.ddof)
        return value.tolist(), [None] * n, [None] * n
    return [float(v) for v in parts[0]], [None] * n, [None] * n  # QUANTILE
