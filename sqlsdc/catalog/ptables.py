"""Perturbation tables in the catalog: generated once per parameter set, never changed.

``ensure_ptables`` (run when a policy is applied) generates every ptable the policy's CKM rules
name and stores its rows with integer key intervals ``[lo, hi)`` on [0, 2^32), the form the
rewrite joins on. A stored table is checked before it is used: every row's intervals must tile
[0, 2^32) exactly and every count row 0..max_i must exist, so a cell key always finds exactly one
entry (a missing match would otherwise be silent).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from sqlsdc.catalog.schema import CATALOG_SCHEMA as S
from sqlsdc.catalog.store import now
from sqlsdc.engines.duckdb import one
from sqlsdc.errors import Error
from sqlsdc.mechanisms.ptable_build import (  # noqa: F401  (re-exported)
    MAX_EXACT_DIFFERENCE,
    check_differencing,
    generate,
    generated,
)
from sqlsdc.policy import Method, Policy, PTableSpec

KEY_MODULUS = 2**32
PTableKey = tuple[str, PTableSpec]  # ("counts" | "magnitudes" | "small_cells", parameters)


@dataclass(frozen=True)
class PTableRef:
    """A stored perturbation table as the rewrite needs it."""

    ptable_id: int
    max_i: float  # counts at or above it use the last row; magnitude ``a`` is capped at it
    m1sq: float = 0.0  # Σ v²·p of the last row (cellKey ``m_fixed_sq`` for small cells)
    classes: tuple[float, ...] = ()  # the rows i, ascending (magnitude lookups interpolate)
    noise: tuple[tuple[float, float], ...] = ()  # (v, p) of the last row: the noise of most cells

    @property
    def variance(self) -> float:
        return sum(v * v * p for v, p in self.noise)

    def interval(self, level: float) -> tuple[float, float]:
        """Noise quantiles (lower, upper) with at most (1 − level)/2 probability outside each."""
        tail, cumulative, low, high = (1 - level) / 2, 0.0, None, None
        for v, p in sorted(self.noise):
            cumulative += p
            if low is None and cumulative > tail:
                low = v
            if high is None and cumulative >= 1 - tail - 1e-12:
                high = v
        return low, high


def required_ptables(policy: Policy) -> set[PTableKey]:
    """Every (kind, parameters) pair the policy's CKM rules use."""
    needed: set[PTableKey] = set()
    for table in policy.confidential_tables:
        for aggregate_kind, rule in table.protection.items():
            if rule.method is not Method.CKM:
                continue
            needed.add((aggregate_kind.value, rule.ptable))
            if rule.magnitude is not None and rule.magnitude.small_cells is not None:
                needed.add(("small_cells", rule.magnitude.small_cells))
    return needed


def entries(kind: str, spec: PTableSpec) -> pa.Table:
    """The rows to store for one ptable: type, i, j, p, v and the integer key interval."""
    parts = []
    for table in generated(kind, spec):
        frame = table.to_frame()
        lo, hi = table.key_bounds(32)
        types = frame["type"].astype(str) if "type" in frame else "all"
        part = pa.table(
            {
                "type": pa.array(np.broadcast_to(types, len(frame)).astype(str)),
                "i": pa.array(frame["i"].to_numpy(dtype=float)),
                "j": pa.array(frame["j"].to_numpy(dtype=float)),
                "p": pa.array(frame["p"].to_numpy(dtype=float)),
                "v": pa.array(frame["v"].to_numpy(dtype=float)),
                "lo": pa.array(np.asarray(lo, dtype=np.int64)),
                "hi": pa.array(np.asarray(hi, dtype=np.int64)),
            }
        )
        parts.append(part)
    rows = pa.concat_tables(parts)
    rows = rows.filter(pa.compute.greater(rows.column("hi"), rows.column("lo")))  # p > 0 only
    if kind == "small_cells":  # looked up as the "all" rows of their own table
        rows = rows.set_column(0, "type", pa.array(["all"] * rows.num_rows))
    return rows


def ensure_ptables(con, policy: Policy) -> dict[PTableKey, PTableRef]:
    """Generate and store the ptables ``policy`` needs that are not stored yet."""
    for kind, spec in sorted(required_ptables(policy), key=lambda k: (k[0], _params(k[1]))):
        check_differencing(kind, spec)
        if _stored_id(con, kind, spec) is None:
            store_ptable(con, kind, spec, entries(kind, spec))
    return load_ptables(con, policy)


def store_ptable(con, kind: str, spec: PTableSpec, rows: pa.Table) -> int:
    _check_tiling(rows, kind, spec)
    (latest,) = one(con, f"SELECT coalesce(max(ptable_id), 0) FROM {S}.ptables")
    ptable_id = latest + 1
    max_i = float(max(rows.column("i").to_pylist()))
    last = rows.filter(pa.compute.equal(rows.column("i"), max_i))
    v, p = last.column("v").to_numpy(), last.column("p").to_numpy()
    m1sq = float(np.sum(v * v * p)) / max(1, len(set(last.column("type").to_pylist())))
    con.execute(
        f"INSERT INTO {S}.ptables VALUES (?, ?, ?, ?, ?, ?)",
        [ptable_id, kind, _params(spec), now(), max_i, m1sq],
    )
    con.register("__sqlsdc_ptable_rows", rows)
    try:
        con.execute(
            f"INSERT INTO {S}.ptable_entries SELECT ?, type, i, j, p, v, lo, hi "
            "FROM __sqlsdc_ptable_rows",
            [ptable_id],
        )
    finally:
        con.unregister("__sqlsdc_ptable_rows")
    return ptable_id


def load_ptables(con, policy: Policy) -> dict[PTableKey, PTableRef]:
    """References to the stored ptables of ``policy`` (missing ones are left out; the rewrite
    refuses a query that needs one), read in two statements whatever their number: the
    tables, then their entries' ``(type, i, v, p)``, from which the rows (classes) and the
    last row's noise are taken here. (A ``list(DISTINCT i)`` aggregate and a join with a
    correlated subquery, read by the engine, cost ~3 ms apiece on a newly opened database,
    ~6 ms of every guarded connection's opening; the entries number a few hundred.)"""
    required = {(kind, _params(spec)): (kind, spec) for kind, spec in required_ptables(policy)}
    stored = {
        (kind, params): (int(ptable_id), float(max_i), float(m1sq))
        for kind, params, ptable_id, max_i, m1sq in con.execute(
            f"SELECT kind, params, ptable_id, max_i, m1sq FROM {S}.ptables"
        ).fetchall()
        if (kind, params) in required
    }
    if not stored:
        return {}
    ids = sorted({ptable_id for ptable_id, _max_i, _m1sq in stored.values()})
    rows: dict[int, list[tuple[str, float, float, float]]] = {ptable_id: [] for ptable_id in ids}
    for ptable_id, kind_type, i, v, p in con.execute(
        f"SELECT ptable_id, type, i, v, p FROM {S}.ptable_entries "
        f"WHERE ptable_id IN ({', '.join('?' * len(ids))})",
        ids,
    ).fetchall():
        rows[ptable_id].append((kind_type, float(i), float(v), float(p)))
    return {
        required[key]: PTableRef(
            ptable_id, max_i, m1sq, *_classes_and_noise(rows[ptable_id], max_i)
        )
        for key, (ptable_id, max_i, m1sq) in stored.items()
    }


def _classes_and_noise(
    rows, max_i: float
) -> tuple[tuple[float, ...], tuple[tuple[float, float], ...]]:
    """The rows ``i`` of one ptable's entries ``(type, i, v, p)``, ascending, and the ``(v, p)``
    of its last row ``max_i`` in its first type, by ``v``."""
    if not rows:
        return (), ()
    first = min(kind_type for kind_type, _i, _v, _p in rows)
    noise = sorted((v, p) for kind_type, i, v, p in rows if kind_type == first and i == max_i)
    return tuple(sorted({i for _t, i, _v, _p in rows})), tuple(noise)


def stored_entries(con, ptable_id: int) -> pa.Table:
    return con.sql(
        f"SELECT type, i, j, p, v, lo, hi FROM {S}.ptable_entries "
        f"WHERE ptable_id = {int(ptable_id)} ORDER BY type, i, lo"
    ).to_arrow_table()


def _stored_id(con, kind: str, spec: PTableSpec) -> int | None:
    row = one(
        con,
        f"SELECT ptable_id FROM {S}.ptables WHERE kind = ? AND params = ?",
        [kind, _params(spec)],
    )
    return None if row is None else int(row[0])


def _params(spec: PTableSpec) -> str:
    return json.dumps(spec.as_dict(), sort_keys=True)


def _check_tiling(rows: pa.Table, kind: str, spec: PTableSpec) -> None:
    """Every (type, i) row's key intervals tile [0, 2^32); count rows 0..max_i all exist;
    every type has the same rows."""
    frame = rows.to_pandas().sort_values(["type", "i", "lo"])
    for (kind_type, i), group in frame.groupby(["type", "i"]):
        lo, hi = group["lo"].to_numpy(), group["hi"].to_numpy()
        if lo[0] != 0 or hi[-1] != KEY_MODULUS or np.any(lo[1:] != hi[:-1]) or np.any(hi <= lo):
            raise Error(
                f"ptable {kind} {_params(spec)}: row {kind_type} i={i} does not tile the keys"
            )
    classes = {t: sorted(set(g["i"])) for t, g in frame.groupby("type")}
    if len({tuple(c) for c in classes.values()}) != 1:
        raise Error(f"ptable {kind} {_params(spec)}: its types have different rows")
    rows_i = next(iter(classes.values()))
    if kind != "magnitudes" and rows_i != list(np.arange(0, max(rows_i) + 1, 1.0)):
        raise Error(f"ptable {kind} {_params(spec)}: rows are not 0..{max(rows_i)}")
