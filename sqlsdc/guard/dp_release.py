"""Release step of DP queries: exact bounded cells in, noisy cells (and their cost) out.

For every DP aggregation of a query (:class:`sqlsdc.rewrite.dp.DpStage`) the engine computes
the exact bounded cells; this module completes them to the public domain (empty groups
included) or selects private groups by noisy-count thresholding, draws the noise of every
base statistic with the keyed exact samplers (:func:`sqlsdc.mechanisms.dp_cells.add_noise`;
cells this user has seen before come from the cache and cost nothing), post-processes AVG,
VAR, STDDEV and quantiles, applies the minimum-frequency rule on noisy unit counts, and
returns the noisy cells as Arrow tables ready to be registered under the stage's relation
name. Nothing here writes to the database.

Budget before computation: the exact cells are a computation on confidential data whose failure
or running time an analyst could try to exploit, so the caller prices the query with
:func:`~sqlsdc.guard.dp_pricing.price` and charges that with
:func:`sqlsdc.catalog.budget.charge` *before* it calls :func:`release`. A query pays per
statistic over all cells of its partition
(:func:`sqlsdc.mechanisms.dp_cells.statistic_identity`): its canonical population, keys,
domains, measure and calibration. What this user was released before (paid, and its cells
cached) costs nothing again; a statistic paid by an asking stopped before its cells were cached
is paid again. A statistic that appears in two aggregations of one query (``UNION`` of the same
cells, the same derived table twice) is paid and drawn once.

Noise-off mode (``noise=False``, admins only) returns the exact bounded values, with zero
cost and no cache: it shows what bounding, clamping, NULLs and empty groups do to a query.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

import pyarrow as pa

from sqlsdc.guard import dp_limits
from sqlsdc.guard.dp_cell_keys import (
    Domains,
    _Cells,
    _complete,
    _mechanisms,
    _representable,
    _space,
)
from sqlsdc.guard.dp_cells_table import _cells_table
from sqlsdc.guard.dp_pricing import _lookup, resolve_domains
from sqlsdc.guard.dp_reuse import _from_cache, _recorded_keys, _released_before, release_digest
from sqlsdc.mechanisms.dp_cells import (
    CellMechanism,
    CellRecord,
    CellSpace,
    cell_digests,
    noisy_quantiles,
    noisy_values,
)
from sqlsdc.rewrite.dp import DpStage

if TYPE_CHECKING:
    import pandas as pd


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
    ``domains`` are those of :func:`~sqlsdc.guard.dp_pricing.resolve_domains` (read with ``run``
    when not given). A cell drawn for one stage is reused by any other stage of the query that
    has it.

    ``key_types``: the engine's key types of the stage SQL texts run before (filled here). A
    stage over public domains (or without keys) whose every cell was released to this user
    before is answered from the cache without computing its exact cells
    (:func:`~sqlsdc.guard.dp_reuse._from_cache`): a repeated query costs its cells, not a scan
    of the table. Its key types are those known, or else ``describe``'s (a stage's exact cells
    without rows, :func:`~sqlsdc.guard.dp_pricing.no_rows`); with neither, the stage is
    computed.

    ``time_left`` (the statement's: it raises once the timeout has passed or the statement
    was cancelled) is called before each stage and within the quantile draws, whose Python
    loop no engine interrupt reaches. The caller has charged the query by then: a draw
    stopped this way has read the data (its running time depends on the histograms), so it
    must have been paid for, as a query stopped while the engine computes its exact cells.

    ``released`` (a release digest -> the keys recorded, or None): the groups a private
    selection released to this user before (:func:`~sqlsdc.guard.dp_reuse._released_before`),
    whose stage is then answered from the cache without computing its exact cells again."""
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


def _selected(stage: DpStage, space: CellSpace, frame: _Cells, noisy: dict, drawn: list,
              rows: list[int]):  # fmt: skip
    """Private groups: the cells, noisy values and cells drawn now (``drawn``, of rows
    ``rows``) of the groups the selection keeps, at most
    :data:`~sqlsdc.guard.dp_limits.MAX_PRIVATE_GROUPS` (those of the smallest digests of their
    unit-count cells: the keys decide, post-processing).

    Only the cells of released groups are cached (``DpRelease.cells``, which the catalog's
    ``dp_cells`` keeps): a group the selection drops is never released, so neither its
    decision nor any value of it may be stored where an admin could read it back, or
    republish it (its key and noisy values of a tiny group). Asked again, its decision is
    drawn again, the same (the noise is a function of the cell), so the answer and the charge
    are those a cached decision gave."""
    keep = [v >= stage.selection.threshold for v in noisy[stage.units]]
    if sum(keep) > dp_limits.MAX_PRIVATE_GROUPS:
        kept = [i for i, k in enumerate(keep) if k]
        keys = {column: [frame[column][i] for i in kept] for column, _name in space.keys}
        units = {stage.units: _mechanisms(stage)[stage.units]}
        digests = cell_digests(keys, space, units)
        first = sorted(range(len(kept)), key=digests.__getitem__)[: dp_limits.MAX_PRIVATE_GROUPS]
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
    for key in keys:  # as the frame's keys (``dp_cell_keys._complete``): NULL as None, not NaN
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
        count_column="__count", cached=cached, max_scores=dp_limits.MAX_QUANTILE_SCORES,
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
    never two groups of one key (:func:`~sqlsdc.guard.dp_cell_keys._representable`)."""
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
