"""The value each cell of a CTA, IPF or rounding job was last published with, kept per job name
across all its versions and keyed by canonical identities, not by the job's SQL text.

Readers keep every version of a job's table that ``--replace`` overwrote
(:mod:`sqlsdc.jobs.replaced_sides`). A replacement read only the version it replaced, the
output table itself, and keyed its secret factors by its SQL text; red team s41c:

- a job replaced by one of another population under the same name (employees instead of
  turnover), then, after new data, by the first again: the third version read only the second,
  whose values are of another original, so the first version's sides were lost: 47 of the
  turnover cells crossed and the mean of the two versions gave 34 turnovers within 0.5;
- a rounding to base 5 replaced after each of six one-person changes: 7 of the 29 cells whose
  count never changed were rounded both ways, 4 possible counts instead of 9;
- seven respellings of one CTA job (case, column order, an alias, ``85 <= age``,
  ``age > 84``) stored with ``--replace`` on the same data drew new factors each, and each
  sensitive cell moved further whenever its new level was beyond its old distance: from 1.11
  to 1.40 levels to 1.45 to 1.49, which puts an original within 0.6 % where one version left
  5.5 %.

So ``sqlsdc.job_cells`` keeps, per job name, method and population, the value each cell was
published with by every version (:func:`record`, in the storing transaction), and a job reads
the latest values of its own population whatever versions came between (:func:`held`), a
rounding every version's (:func:`versions_of`). Identities:

- the population (:func:`identify`): the table, the measure (none for a count) and the rows,
  as the guard's cell identity describes them (:func:`~sqlsdc.planner.identity.
  aggregation_identity`: ``85 <= age``, ``NOT age < 85`` and ``(age >= 85)`` are one), or the
  population of a version of the job whose WHERE keeps the same rows in the data now
  (``age > 84`` of an integer age, which the simplifier cannot equate); described by the
  WHERE as the job's SQL writes it (:func:`~sqlsdc.jobs.tabulation.population_where`), also
  where it stands for the x·m condition of a unit-noised measure's class;
- the cell (:attr:`Cells.keys`): its codes by dimension name, dimensions at their total code
  left out, so a table of other dimensions or of another column order names a shared cell
  alike.

The secret factors of CTA and IPF are drawn per cell from these keys and the cell's original
value (:func:`sqlsdc.jobs.adjust._secret_levels`): a respelled job, or a table with a code
more, keeps the factor of every cell whose value did not change, and a cell whose value
changed draws a new one (with one factor kept, ``x·(1 + 0.3·f)`` and
``(x + d)·(1 + 0.3·f)`` gave a reader who knew the change ``d`` of one income the original
``x`` of 2 of 4 sensitive cells exactly, red team s41c). Only published values are kept,
which readers hold already: no originals, levels or sensitivity flags.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import pandas as pd
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import build_scope

from sqlsdc.errors import Error
from sqlsdc.jobs.stored_tables import same_rows
from sqlsdc.jobs.tabulation import parse_job, population_where
from sqlsdc.planner.identity import aggregation_identity
from sqlsdc.tabular.model import Table

S = "sqlsdc"  # the catalog schema, as sqlsdc.catalog.schema's


@dataclass(frozen=True)
class Cells:
    """The canonical identities of a job's cells: its ``population`` and, in the table's cell
    order, each cell's ``keys``."""

    population: str
    keys: list[str]

    def uniforms(self, key: bytes, state: np.ndarray) -> np.ndarray:
        """One number in [0, 1) per cell, keyed by ``key`` (secret), the cell's identity and
        its ``state`` (a row of numbers per cell, taken to 12 significant digits: a sum's last
        bits differ between runs): the same cell of the same population in the same state gets
        the same number in every version, and a new one when its state changed."""
        texts = (
            cell + "".join(f"\x1f{x:.12g}" for x in row)
            for cell, row in zip(self.keys, np.asarray(state, dtype=np.float64), strict=True)
        )
        digests = (hashlib.blake2b(t.encode(), key=key, digest_size=8).digest() for t in texts)
        return np.fromiter((int.from_bytes(d, "big") / 2.0**64 for d in digests),
                           dtype=np.float64, count=len(self.keys))  # fmt: skip


def identify(job, table: Table) -> Cells:
    """The identities of ``table``'s cells for ``job``: the population of a stored version of
    the job that keeps the same rows now, else its own canonical one."""
    mine = _population(job)
    stored = _stored_populations(job)
    if mine not in stored:
        spec = job.spec
        for population, sql in stored.items():
            try:
                theirs = parse_job(sql, job.policy, stored=True)
            except Error:
                continue
            if (theirs.table.lower(), theirs.measure) == (spec.table.lower(), spec.measure) and (
                same_rows(job.con, spec.table, spec.where, theirs.where)
            ):
                mine = population
                break
    return Cells(mine, _cell_keys(table))


def held(job, cells: Cells) -> np.ndarray | None:
    """The value each cell was last published with by a version of ``job`` of the same
    population (NaN where none did), or None when none is kept."""
    if not _kept(job.con):
        return None
    frame = job.con.execute(
        f"SELECT cell, arg_max(value, query_id) AS value FROM {S}.job_cells "
        "WHERE name = ? AND method = ? AND population = ? GROUP BY cell",
        [job.name, job.method, cells.population],
    ).df()
    if frame.empty:
        return None
    values = frame.set_index("cell")["value"]
    return pd.Series(cells.keys).map(values).to_numpy(np.float64)


def versions_of(job, cells: Cells) -> list[tuple[int, np.ndarray]]:
    """Every version of ``job`` (name, method) of the same table and aggregate that kept
    values, whatever its rows: its query id and the value it published per cell of ``cells``
    (NaN where it held none), oldest first (:mod:`sqlsdc.jobs.rounded_versions` reads them
    all, and compares their units with the job's: a version of other rows holds the same
    original where the units are the same, e.g. ``WHERE age >= 85 AND person_id NOT IN (...)``
    of persons who turned 85 since)."""
    if not _kept(job.con):
        return []
    frame = job.con.execute(
        f"SELECT query_id, population, cell, value FROM {S}.job_cells "
        "WHERE name = ? AND method = ? ORDER BY query_id",
        [job.name, job.method],
    ).df()
    mine = _aggregate(cells.population)
    keys = pd.Series(cells.keys)
    return [
        (int(query_id), keys.map(rows.set_index("cell")["value"]).to_numpy(np.float64))
        for query_id, rows in frame.groupby("query_id", sort=True)
        if rows["population"].iloc[0] == cells.population
        or (mine is not None and _aggregate(rows["population"].iloc[0]) == mine)
    ]


def _aggregate(population: str) -> tuple | None:
    """The table and measure a canonical population describes, or None (a population kept as
    SQL text, which is compared as a whole)."""
    try:
        described = json.loads(population)
    except ValueError:
        return None
    if not isinstance(described, dict) or "table" not in described:
        return None
    return str(described["table"]).lower(), json.dumps(described.get("measure"), sort_keys=True)


def record(job, cells: Cells, published) -> None:
    """Keep the value each cell is published with now (cells published as 0 too: readers read
    a missing cell as 0) beside those of earlier versions, which readers keep too (red team
    s44c, :mod:`sqlsdc.jobs.rounded_versions`); run inside the transaction that stores the
    output."""
    frame = pd.DataFrame({"cell": cells.keys, "value": np.asarray(published, dtype=np.float64)})
    con = job.con
    con.register("__kept_cells", frame)
    try:
        con.execute(
            f"INSERT INTO {S}.job_cells SELECT ?, ?, ?, cell, value, ? FROM __kept_cells",
            [job.name, job.method, cells.population, job.query_id],
        )
    finally:
        con.unregister("__kept_cells")


def _kept(con) -> bool:
    """Whether the catalog has ``job_cells`` (one no job has stored into since it was added
    has not)."""
    return bool(
        con.execute(
            "SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() "
            "AND schema_name = ? AND table_name = 'job_cells'",
            [S],
        ).fetchall()
    )


def _stored_populations(job) -> dict[str, str]:
    """Population -> the SQL of the latest version of ``job`` (name and method) that kept
    values of it, latest first."""
    if not _kept(job.con):
        return {}
    rows = job.con.execute(
        f"SELECT k.population, v.sql_text FROM (SELECT population, max(query_id) AS query_id "
        f"FROM {S}.job_cells WHERE name = ? AND method = ? GROUP BY population) AS k "
        f"JOIN {S}.output_versions AS v USING (query_id) ORDER BY k.query_id DESC",
        [job.name, job.method],
    ).fetchall()
    return dict(rows)


def _population(job) -> str:
    """The canonical population of ``job``: its table, measure and rows (the WHERE as the
    guard's cell identity describes it; its SQL text when that cannot be described)."""
    spec, where = job.spec, population_where(job.spec)  # a name; same_rows reads the rows
    try:
        rows = _rows_identity(job.con, spec.table, where)
    except (SqlglotError, Error):
        rows = {"where": None if where is None else where.sql("duckdb")}
    return json.dumps({"table": spec.table.lower(), "measure": spec.measure, "rows": rows},
                      sort_keys=True, separators=(",", ":"))  # fmt: skip


def _rows_identity(con, table: str, where: exp.Expr | None) -> dict:
    """The rows ``SELECT COUNT(*) FROM table WHERE where`` counts, as
    :func:`~sqlsdc.planner.identity.aggregation_identity` describes its population."""
    name = exp.to_identifier(table).sql("duckdb")
    columns = {row[0]: row[1] for row in con.execute(f"DESCRIBE {name}").fetchall()}
    schema = {table.lower(): columns}
    tree = exp.select(exp.Count(this=exp.Star())).from_(exp.to_table(table.lower()))
    if where is not None:
        tree = tree.where(where.copy())
    tree = qualify(sqlglot.parse_one(tree.sql("duckdb"), read="duckdb"), schema=schema,
                   dialect="duckdb")  # fmt: skip
    annotate_types(tree, schema=schema)
    return json.loads(aggregation_identity(build_scope(tree)).population.text)


def _cell_keys(table: Table) -> list[str]:
    """Each cell's codes by dimension name, its dimensions at the total code left out."""
    dims = list(table.dims)
    codes = table.cells[dims].astype(str).to_numpy()
    total = table.total
    return [
        json.dumps(
            {d: c for d, c in sorted(zip(dims, row, strict=True)) if c != total},
            separators=(",", ":"),
        )
        for row in codes
    ]
