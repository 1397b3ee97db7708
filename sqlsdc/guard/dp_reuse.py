"""Stages answered from this user's cache without computing their exact cells again: a stage
over public domains whose every cell was released before (:func:`_from_cache`), and a private
selection's groups recorded under :func:`release_digest` (:func:`_released_before`).

Why: a stage's exact cells, computed at every asking once its statistics were paid, timed the
engine's work on the population's rows for free (red teams s37b, s37e, s41b).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from fractions import Fraction
from typing import TYPE_CHECKING

import pyarrow as pa

from sqlsdc.guard import dp_limits
from sqlsdc.guard.dp_cell_keys import _all_mechanisms, _Cells, _grid_keys
from sqlsdc.guard.dp_cells_table import _keys
from sqlsdc.mechanisms.dp_cells import (
    CellSpace,
    cell_digests,
    cell_identity,
    statistic_identity,
)
from sqlsdc.rewrite.dp import DpStage

if TYPE_CHECKING:
    pass


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
                          chosen.per_group, chosen.threshold, dp_limits.MAX_PRIVATE_GROUPS],
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
    asking of a quantile or of a grid over :data:`~sqlsdc.guard.dp_limits.PREFETCHED_CELLS`
    (red team s41b: a new connection per asking, the one-row population slower than the empty
    one in 75 of 120 paired runs). A grid larger than the prefetched cells is looked up only
    when its statistics were paid before (:func:`_paid_before`): a new one would look up in vain."""
    if stage.keys and (stage_domains is None or stage.selection):
        return None
    mechanisms = _all_mechanisms(stage)  # quantiles' cells are cached by the same identities
    n = math.prod(map(len, stage_domains)) if stage.keys else 1
    if n * len(mechanisms) > dp_limits.PREFETCHED_CELLS and not _paid_before(
        stage, space, stage_domains, known
    ):
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
