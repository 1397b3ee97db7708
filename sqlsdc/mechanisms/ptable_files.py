"""Perturbation tables as files: τ-ARGUS's ptable format and R's CSV, written and read.

``to_tauargus`` writes what the R package **ptable**'s ``pt_export(..., SDCtool = "TauArgus")``
writes and τ-ARGUS reads (libtauargus ``PTable.cpp``, ``PTableCont.cpp``); ``to_csv`` R's
``pTable`` as CSV. Reading either back recomputes each entry's probability from its interval,
as τ-ARGUS does, so a table written and read with its parameters is the same table. The
tables themselves are built by :mod:`sqlsdc.mechanisms.ptable`.
"""

from __future__ import annotations

from itertools import groupby

from sqlsdc.mechanisms.ptable import (
    COLUMNS,
    NDIGITS,
    PTable,
    PTableError,
    PTableParams,
    PTableRow,
    entries,
)


def _fmt(x: float) -> str:
    """At most 8 decimals, no trailing zeros, never '-0' (like τ-ARGUS's own ptable files)."""
    s = f"{round(x, NDIGITS) + 0.0:.{NDIGITS}f}".rstrip("0").rstrip(".")
    return "0" if s == "-0" else s


def to_tauargus(*tables: PTable) -> str:
    """``pt_export(..., SDCtool = "TauArgus")``: a header line, then ``;``-separated entries.

    Counts: one table, columns i;j;p;v;p_int_ub. Magnitudes: one table of type 'all', or two of
    types 'even' and 'odd' (in the order given), columns i;j;p;v;p_int_ub;type. τ-ARGUS skips the
    header and reads i with atoi, the rest with atof (libtauargus PTable.cpp, PTableCont.cpp).
    """
    kinds = sorted(t.type for t in tables)
    nums = bool(tables) and tables[0].table == "nums"
    if (
        not tables
        or any(t.table != tables[0].table for t in tables)
        or kinds not in ([["all"]] if not nums else [["all"], ["even", "odd"]])
    ):
        raise PTableError(
            "τ-ARGUS takes one count ptable, one magnitude ptable of type 'all', or two of "
            f"types 'even' and 'odd' in one file (to_tauargus(even, odd)); got "
            f"{[(t.table, t.type) for t in tables]}"
        )
    cols = ("i", "j", "p", "v", "p_int_ub")
    lines = [";".join(cols + ("type",) * nums)]
    for t in tables:
        lines += [";".join([_fmt(getattr(e, c)) for c in cols] + [e.type] * nums) for e in t.rows]
    return "\n".join(lines) + "\n"


def to_csv(pt: PTable) -> str:
    """R's ``pTable`` as CSV: i,j,p,v,p_int_lb,p_int_ub,type (read back with ``from_csv``)."""
    lines = [",".join(COLUMNS)]
    lines += [",".join([_fmt(getattr(e, c)) for c in COLUMNS[:-1]] + [e.type]) for e in pt.rows]
    return "\n".join(lines) + "\n"


def _read(text, sep, table, type, params, columns) -> PTable:
    """Group the records by type and i; recompute lb (= previous ub) and p from the intervals."""
    lines = [ln for ln in text.replace("\r", "").split("\n") if ln.strip()]
    header = [h.strip().strip('"') for h in lines[0].split(sep)] if lines else []
    at = {name: k for k, name in enumerate(header)} if columns is None else columns
    if len(lines) < 2 or not {"i", "j", "v", "p_int_ub"} <= set(at):
        raise PTableError(
            f"not a ptable file: need a header and columns i, j, v, p_int_ub; got {header}"
        )
    try:
        recs = [[f.strip() for f in ln.split(sep)] for ln in lines[1:]]
        recs = [
            (
                int(float(f[at["i"]])),
                float(f[at["j"]]),
                float(f[at["v"]]),
                float(f[at["p_int_ub"]]),
                f[at["type"]] if "type" in at else "all",
            )
            for f in recs
        ]
    except (ValueError, IndexError) as e:
        raise PTableError(f"malformed ptable entry: {e}") from None
    types = sorted({rec[4] for rec in recs})
    if type is None and len(types) > 1:
        raise PTableError(f"the file holds ptables of types {types}; choose one with type=...")
    if table is None:
        table = (
            params.table
            if params
            else ("cnts" if all(r[1] % 1 == 0 for r in recs) and types == ["all"] else "nums")
        )
    rows: list[PTableRow] = []
    for (i, type_), group in groupby(
        (r for r in recs if r[4] == (type or types[0])), key=lambda r: (r[0], r[4])
    ):
        _, js, vs, ubs, _ = zip(*group, strict=True)
        rows += entries(i, js, vs, list(ubs), type_, table == "cnts")
    if not rows:
        raise PTableError(f"no entries of type {type!r}; the file holds {types}")
    return PTable(tuple(rows), table, params)


def from_tauargus(text: str, type: str | None = None, params: PTableParams | None = None) -> PTable:
    """Read a τ-ARGUS ptable (``pt_export`` or ``to_tauargus``): i;j;p;v;p_int_ub[;type].

    As τ-ARGUS, use the columns by position and recompute p from the intervals, so
    ``from_tauargus(to_tauargus(pt), params=pt.params) == pt``. A type column makes it a magnitude
    table; a file with even and odd rows needs ``type``.
    """
    nums = len(text.lstrip().split("\n", 1)[0].split(";")) >= 6
    cols = {"i": 0, "j": 1, "v": 3, "p_int_ub": 4} | ({"type": 5} if nums else {})
    return _read(text, ";", "nums" if nums else "cnts", type, params, cols)


def from_csv(text: str, type: str | None = None, params: PTableParams | None = None) -> PTable:
    """Read ``to_csv`` output or R's SAS export (``;``-separated), by column name.

    Without ``params`` the table is taken as counts when every j is an integer and the type is
    'all'; pass ``params`` to round-trip a magnitude table on an integer grid exactly.
    """
    sep = ";" if ";" in text.lstrip().split("\n", 1)[0] else ","
    return _read(text, sep, None, type, params, None)
