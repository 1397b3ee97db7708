"""A CTA or IPF job stored with ``--replace`` keeps each sensitive cell on the side of its
original that the version it replaces published it on, at least as far from it.

Readers keep the version a replacement overwrites (a release database, an analyst's copy).
CTA and IPF's safe values publish a sensitive cell at its original plus or minus its protection
level enlarged by a secret factor (:func:`sqlsdc.jobs.adjust._secret_levels`), the same factor
for the same job name, rules and cell (its canonical identity, :mod:`sqlsdc.jobs.kept_cells`)
as long as the cell's value does not change. Two findings of red team s40d:

- which way a cell moves was not kept: the fixed-direction LP alternates down, up, … over the
  sensitive cells by decreasing value, so one cell that becomes or stops being sensitive turns
  every smaller one round, and IPF moves a cell the way a plain raking to the new margins
  does. The two versions held ``x − f·L`` and ``x + f·L``, whose mean is the original ``x``
  (one enterprise's turnover revised, then the demo's nace x region CTA replaced: 38 of the
  39 cells that turned round exactly; IPF to new margins: 4 of 4 sensitive incomes);
- a replacement under another frequency rule's safety range (30 % then 40 %) held
  ``x·(1 + 0.3·f)`` and ``x·(1 + 0.4·f)``, so ``x = 4·v1 − 3·v2`` (4 of 4 incomes to the cent).
  The factor is now keyed by the rules too, and a cell is published where the replaced
  version put it whenever that is still beyond its new level (:meth:`Replaced.levels`): the
  same value again tells nothing new, and a cell that must move further moves by a factor
  drawn afresh.

So a replacement moves each sensitive cell the way the replaced version did
(:meth:`Replaced.directions`), at least as far unless that is beyond any level its rules could
draw (then the original was another; of another population, its side is not held either:
:func:`replaced`), and a result that still crosses one (the MILP starts from the LP with these
directions but chooses its own; a bound that leaves no room) is refused
(:meth:`Replaced.refuse_crossed`).

Besides the version being replaced, the values the latest version of the job's own
population published are read (:mod:`sqlsdc.jobs.kept_cells`, keyed by canonical identities):
with a version of another population in between, the first version's sides stay held (red team
s41c). A version of other dimensions is matched on the cells both hold (its other dimensions at
Total). Each replacement keeps its predecessor's sides, so the versions agree as long as a cell
stays sensitive; a cell that is sensitive, then not (other rules), then sensitive again is held
to the side its latest publication put it on, which may not be its first. Replacements under
rules changed back and forth draw a factor each time a cell must move further: many of them
push its distance towards the largest factor's (respellings of one job no longer do: the
factors are keyed by the cells' identities, not by the SQL's text).

Open (red team s41c, analysed by s42i): a cell whose original changes in every version (monthly
updates) draws a factor each time, and "at least as far" makes its distance the running
maximum of those draws, towards 1.5 levels. A fresh level at each change, on the kept side,
ends the drift but not the leak: each version is another range of the original, and to a
reader who knows the changes the originals consistent with every version narrow from 24 % of
the cell to 6.9 % after 5 updates and 1.9 % after 23 (this rule: 4.7 % and 0.5 % to a reader
who also uses which versions held the value, 11.5 % and 3.7 % from the ranges alone; on the
demo one cell 31 % -> 5.8 %, with fresh levels 1.7 %:
``test_redteam_s41c.test_monthly_updates_leave_a_reader_who_knows_them_...``). Only a level
whose excess over the rule's level stays fixed per cell (stored, as it cannot be recomputed
from published values) keeps one version's range, at the price of publishing each change of a
sensitive cell exactly (``(1 ± s)·d`` under the frequency rule), which the revisions of
suppression jobs treat as a disclosure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sqlsdc.errors import Error, TabularError
from sqlsdc.jobs.kept_cells import Cells, held
from sqlsdc.jobs.session import OUTPUT_SCHEMA
from sqlsdc.jobs.stored_tables import same_rows
from sqlsdc.jobs.tabulation import parse_job
from sqlsdc.tabular.model import TOTAL, Table

_FLAGS = ("lower_bound", "upper_bound")  # CTA's intervals, stored beside the value


@dataclass(frozen=True)
class Replaced:
    """The sensitive cells of a job as the version it replaces published them, per cell of its
    table: ``sides`` +1 above the original (as it is now), −1 below, 0 elsewhere (not
    sensitive now, published at the original, or no such version); ``distance`` how far."""

    sides: np.ndarray
    distance: np.ndarray

    def directions(self, table: Table, sensitive: np.ndarray, secret: np.ndarray) -> np.ndarray:
        """The LP's fixed directions: the sides kept where they are set, elsewhere the CTA's
        ``alternate`` rule (:func:`~sqlsdc.tabular.cta.choose_directions`: half the cells
        down, half up) over the cells in decreasing ``secret`` order (one secret number in
        [0, 1) per cell), not by value, the first down or up by a secret bit (a low bit of the
        first one's number). By value, as that rule goes, the direction followed from the
        originals' order, which a reader of ``--intervals`` (they name the sensitive cells)
        often sees in the adjusted values: a lone sensitive cell always went down (red team
        s47l). A cell whose side is kept (an inner cell of the replaced version, a margin of
        this one) passes it to the sensitive inner cells it adds up that have none, so that it
        moves that way too (the LP fixes the directions of inner cells)."""
        s = np.flatnonzero(sensitive)
        order = s[np.lexsort((s, -secret[s]))]
        first = int(secret[order[0]] * 2**30) % 2 if order.size else 0
        found = np.zeros(secret.size)
        found[order] = np.where((np.arange(order.size) + first) % 2 == 0, -1.0, 1.0)
        return np.where(self.sides != 0, self.sides, self._inherited(table, sensitive, found))

    def _inherited(self, table: Table, sensitive: np.ndarray, found: np.ndarray) -> np.ndarray:
        """``found`` with the side of every kept cell on the sensitive inner cells under it
        that have no side of their own."""
        if table.X is None or not np.any(self.sides != 0):
            return found
        out = found.copy()
        inner = np.asarray(table.inner)
        for cell in np.flatnonzero(self.sides != 0).tolist():
            under = inner[table.X[:, cell].nonzero()[0]]
            free = under[sensitive[under] & (self.sides[under] == 0)]
            out[free] = self.sides[cell]
        return out

    def levels(self, upl: np.ndarray, lpl: np.ndarray, most: tuple[np.ndarray, np.ndarray]
               ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """The protection levels ``upl``, ``lpl``, on a kept side at least the replaced
        version's distance: an adjustment then puts the cell where that version did unless its
        new level is larger. Not where that distance is beyond the ``most`` the rules' levels
        can be enlarged to: the replaced version was of another original then (another WHERE,
        new data), and holding the cell that far would only distort it."""
        near = self.distance <= np.where(self.sides > 0, most[0], most[1])
        up = np.where((self.sides > 0) & near, np.maximum(upl, self.distance), upl)
        down = np.where((self.sides < 0) & near, np.maximum(lpl, self.distance), lpl)
        return up, down

    def refuse_crossed(self, table: Table, published: np.ndarray, hint: str) -> None:
        """Refuse a result that publishes a sensitive cell on the other side of its original
        from the version it replaces: the mean of the two versions would be the original."""
        now = np.sign(np.asarray(published, dtype=np.float64) - table.values)
        crossed = (self.sides != 0) & (now != 0) & (now != self.sides)
        if not crossed.any():
            return
        cells = table.cells.loc[crossed, list(table.dims)].astype(str).head(3).to_dict("records")
        raise TabularError(
            f"{int(crossed.sum())} sensitive cell(s) would be published on the other side of "
            f"its original from the version this job replaces, e.g. {cells}; readers keep that "
            "version, and the mean of a cell moved up in one and down in the other by the same "
            f"secret level is its original. Nothing was stored; {hint}"
        )


def replaced(job, table: Table, sensitive: np.ndarray, cells: Cells, most=None) -> Replaced:
    """The sensitive cells of ``table`` as the output ``job`` replaces published them, or, for
    a cell a version of the job's own population (``cells``) published, as the latest such
    version did (:func:`sqlsdc.jobs.kept_cells.held`, whatever versions came between). A cell
    that output leaves out was published as 0 (readers read it so); an output of other
    dimensions is matched on the cells both tables hold (:func:`_replaced_values`).

    ``most``: the largest upper and lower levels the job's rules can draw. When the replaced
    output tabulated another population (other rows or measure), a cell it published farther
    from this job's original than that was of another original, and its side says nothing of
    this one: it is not held (red team s40i: incomes aged 85+ by region x education, replaced
    by every person's under ``freq:1500,30``, then by the first job again: every person's
    values lay above each 85+ cell, so the third version moved every sensitive cell up, and
    the 2 the first had moved down by the same secret factor were the mean of the first and
    third to 1e-10). Of the same population every side is held: a margin may move farther
    than its own level."""
    sides = np.zeros(table.values.size)
    distance = np.zeros(table.values.size)
    earlier = _replaced_values(job, table)
    if earlier is not None:
        gap = earlier - table.values
        matched = sensitive & ~np.isnan(earlier)
        if most is not None and not _same_population(job):
            matched &= np.abs(gap) <= np.where(gap > 0, most[0], most[1])
        sides[matched] = np.sign(gap)[matched]
        distance[matched] = np.abs(gap)[matched]
    own = held(job, cells)
    if own is not None:
        gap = own - table.values
        matched = sensitive & ~np.isnan(own)
        sides[matched] = np.sign(gap)[matched]
        distance[matched] = np.abs(gap)[matched]
    return Replaced(sides, distance)


def published_before(job, table: Table, cells: Cells) -> np.ndarray:
    """The value each cell of ``table`` was last published with by a version of the job's own
    population (``cells``), else by the output it replaces (NaN where neither published it):
    a rounding keeps a cell's multiple where it is still an adjacent one."""
    own = held(job, cells)
    earlier = _replaced_values(job, table)
    if earlier is None:
        earlier = np.full(table.values.size, np.nan)
    return earlier if own is None else np.where(np.isnan(own), earlier, own)


def _same_population(job) -> bool:
    """Whether the output ``job`` replaces tabulated the same measure of the same rows."""
    found = job.con.execute(
        "SELECT sql_text FROM sqlsdc.outputs WHERE name = ?", [job.name]
    ).fetchall()
    if not found:
        return False
    try:
        theirs = parse_job(found[0][0], job.policy, stored=True)
    except Error:
        return False
    mine = job.spec
    return (
        theirs.table.lower() == mine.table.lower()
        and theirs.measure == mine.measure
        and same_rows(job.con, mine.table, mine.where, theirs.where)
    )


def _replaced_values(job, table: Table) -> np.ndarray | None:
    """The values the output ``job`` replaces published, in ``table``'s cell order (NaN for a
    cell that output cannot hold), or None.

    Two tables of other dimensions share the cells at Total of the dimensions the other lacks
    (red team s40i: a CTA of incomes by region x education x sex replaced by one by region x
    education turned all 4 sensitive (region, education) cells round, and the mean of the two
    versions gave each income within 5 %, for a level of 30 %)."""
    con = job.con
    known = con.execute(
        "SELECT 1 FROM sqlsdc.outputs WHERE name = ? AND method = ?", [job.name, job.method]
    ).fetchall()
    if not known:
        return None
    present = con.execute(
        "SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = ? AND table_name = ?",
        [OUTPUT_SCHEMA, job.into],
    ).fetchall()
    if not present:
        raise TabularError(
            f"{OUTPUT_SCHEMA}.{job.into} is listed as an output but its table is missing "
            "(dropped outside sqlsdc?): a replacement keeps the cells its readers hold on "
            "their side, and they cannot be read; store the job under another name (the "
            f"earlier version's cells are still checked), or restore {OUTPUT_SCHEMA}."
            f"{job.into} from a backup"
        )
    frame = con.sql(f'SELECT * FROM {OUTPUT_SCHEMA}."{job.into}"').df()
    dims = list(table.dims)
    theirs = [c for c in frame.columns if c not in {"value", *_FLAGS}]
    shared = [d for d in dims if d in theirs]
    cells = table.cells[dims].astype(str).reset_index(drop=True)
    codes = frame[theirs].astype(str)
    mine = (cells[[d for d in dims if d not in shared]] == TOTAL).all(axis=1).to_numpy()
    held = (codes[[d for d in theirs if d not in shared]] == TOTAL).all(axis=1)
    values = codes.loc[held, shared].assign(value=frame.loc[held, "value"].astype(np.float64))
    key = "\x00cell"  # one key column, also when no dimension is shared (the grand totals)
    left = cells[shared].assign(**{key: 0})
    merged = left.merge(values.assign(**{key: 0}), on=[*shared, key], how="left",
                        validate="many_to_one")  # fmt: skip
    found = pd.to_numeric(merged["value"]).fillna(0.0).to_numpy(np.float64)
    return np.where(mine, found, np.nan)
