"""Negligible perturbation: a step that changed so few records that a file's cells are exact.

The disclosure checks (:mod:`sqlsdc.jobs.record_files`, the live suppression pattern and the
differencing check) take a file's columns that no perturbative step changed as exact, and its
perturbed ones as telling no cell's count. That holds when a reader cannot know which cells a
step left as they were; a step that changed a handful of records in 20,000 leaves nearly every
cell exact, and says so (PRAM's matrix is published for estimation, the swap rate is reported).
Red team s39c: ``pram:sex:p=0.9999`` and ``pram:municipality:p=0.9999`` changed one record per
column, and the file held 346 of 350 municipality x sex cells exactly, all 74 that the live
suppression pattern hides; a household swap at rate 1e-6 (2 households) left all 180
municipality totals exact.

The rule: a step's column counts as perturbed only if a cell of :data:`CELL` units is changed
(one of its units at least) with probability more than ``1 - confidence``, each unit changed
independently at the step's realised rate ``r`` (changed values over values it could change;
for a swap, swapped households over households, a household moving as one):
``(1 - r) ** CELL < confidence``. Otherwise a reader is at least that sure that a cell of 10
units, the size the checks protect (frequency rules hide cells of fewer units: the demo's
``freq:3``, ``freq:5``, ``min_frequency: 10``), and every smaller one, is the true count, and
the column counts as exact: every check an exact table's cell passes, its cells pass.

PRAM changes values at random, so a reader more often right than wrong about a file's small
cells has them: :data:`PRAM_CONFIDENCE` 1/2, ``r <= 1 - 0.5 ** 0.1``, about 6.7 %: PRAM
keeping a value with probability 0.95 or more is exact, 0.9 (and the usual 0.7 to 0.8)
perturbed. (A first bound of 0.9, r about 1 %, let a PRAM at 0.98 count as perturbed, though a
cell of 4 persons came through it unchanged 92 % of the time.) Targeted swapping moves the
households at risk, those of the small cells, so its realised rate understates how many small
cells it changes: :data:`SWAP_CONFIDENCE` 0.9, a swap of 1 % of households or more perturbs
(the README's census example swaps 5 %). Inflows (records changed into a cell) make a cell less
often exact, so leaving them out errs on the side of more exact columns, the safe side for the
checks.

Per column, not per cell: a file's stored records keep no link to the rows they came from, so
which cells a step left unchanged cannot be recomputed for the checks (nor for an earlier
version of a file). Steps without a realised count of changes (noise with ``c > 0``,
microaggregation, rank swapping, shuffling) change every value, or nearly, and stay perturbed.
"""

from __future__ import annotations

from collections.abc import Mapping

CELL = 10
PRAM_CONFIDENCE = 0.5
SWAP_CONFIDENCE = 0.9


def perturbed_columns(
    method: str, columns: tuple[str, ...], record: Mapping, values: int | None = None
) -> tuple[str, ...]:
    """The ``columns`` of a perturbative step (``method``, its log ``record``) that it changed
    enough to count as perturbed (the module docstring); the others count as exact.

    PRAM's record gives each column's ``changed`` count and the ``values`` it could change (a
    log written before it kept them: ``values`` here, the file's records, at least as many,
    so the rate errs low, on the exact side; none known: only a column of 0 changes is exact).
    A swap's gives ``swapped_households`` of ``households``. Any other step: every column."""
    if method == "swap":
        rate = _rate(record.get("swapped_households"), record.get("households"))
        return () if rate is not None and _negligible(rate, SWAP_CONFIDENCE) else columns
    if method != "pram":
        return columns
    kept = []
    for column in columns:
        details = record.get(column)
        if not isinstance(details, Mapping):
            kept.append(column)
            continue
        changed = details.get("changed")
        rate = _rate(changed, details.get("values", values))
        if changed == 0 or (rate is not None and _negligible(rate, PRAM_CONFIDENCE)):
            continue
        kept.append(column)
    return tuple(kept)


def _rate(changed, total) -> float | None:
    """``changed / total``, or None when either is missing or not a count."""
    if not isinstance(changed, int) or not isinstance(total, int) or total <= 0 or changed < 0:
        return None
    return changed / total


def _negligible(rate: float, confidence: float) -> bool:
    """Whether a cell of :data:`CELL` units is left as it was with probability at least
    ``confidence`` when each unit changes with probability ``rate``."""
    return (1 - rate) ** CELL >= confidence
