"""Noise on aggregated cells, the same for the same cell every time.

The engine computes exact, bounded aggregates per cell in SQL; this module turns them into
released values. Each noisy value is drawn with the exact samplers of
:mod:`sqlsdc.mechanisms.samplers` from a keyed stream that depends only on the server secret, the
policy version and the *cell identity*, so asking for a cell again, in any query, gives the same
value (ARCHITECTURE.md §3), and rephrasing cannot average the noise away.

Cell identity (canonical encoding, version 1)
---------------------------------------------
A cell is identified by what was computed, over which population, at which group-key values:
a JSON document with sorted keys and no whitespace,

    {"aggregate": MEASURE, "data": DATA_VERSION, "keys": [[NAME, VALUE], ...],
     "mechanism": CALIBRATION, "scope": SCOPE, "table": TABLE, "v": 1}

- TABLE: the confidential table tabulated, SCOPE: the canonical population
  (:attr:`sqlsdc.planner.identity.Population.text`: relations, join graph and every predicate,
  derived tables and CTEs included), DATA_VERSION: a version of the data (``""`` if the data
  never change; see below).
- MEASURE: the canonical measure on base columns (``"*"`` for rows and units,
  ``'"persons"."income"'`` for sums, ``'DISTINCT "t"."x"'`` for distinct values),
  CALIBRATION: :meth:`Calibration.describe` (statistic, noise and parameter, bounds, rows and
  groups per unit, grid): a different mechanism or bounding is a different release.
- keys: ``[name, value]`` pairs sorted by the canonical key name (the base column expression,
  never the output alias, so ``SELECT region AS r`` and ``SELECT region`` are the same cells),
  values
  typed: ``null``, ``b:true``, ``i:42``, ``f:<repr>``, ``d:<decimal, exact>``, ``s:<text>``,
  ``date:``/``ts:``/``time:<ISO 8601>`` (nanoseconds kept), ``x:<hex bytes>``. Float NaN
  encodes as ``null``, so groups taken from the data are never keyed by floats (nor by times,
  whose ``24:00:00`` is Python's ``00:00:00``): the guard refuses those key types, as NaN and
  NULL are two groups (:func:`sqlsdc.guard.dp_release.release`). Other types are refused.

The PRF stream of a cell is ``KeyedStream(secret, policy_version, "sqlsdc.dp_cell.v1", TEXT)``
and its catalog key is ``SHA-256(TEXT)`` (:attr:`CellIdentity.digest`). The noise does not
depend on the user: everyone who asks for a cell sees the same value (each user is charged
once, see :mod:`sqlsdc.catalog.budget`).

Why DATA_VERSION matters: the same noise on two different exact values reveals their exact
difference. The per-user cache returns a cell's first value forever, but two users asking before
and after a data change would see ``x1 + z`` and ``x2 + z``. Pipelines over changing data must
put a data version (e.g. the table's load id) into the identity.

Values: counts are integers; sums are rounded to the grid g of their bounding (exact input
sums of grid-rounded values are multiples of g; floats are rounded to the nearest multiple),
noised in grid units and returned as exact Fractions (``NoisyCells.values``) and as floats in
the frame. A NULL exact value (SQL SUM over no rows) counts as 0.

Example:
    >>> import pandas as pd
    >>> from sqlsdc.mechanisms.accountant import Bounding, PrivacyCost, Statistic, calibrate
    >>> exact = pd.DataFrame({"region": ["North", "South"], "n": [120, 7]})
    >>> count = calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=Fraction(1)))
    >>> space = CellSpace.of("persons", ["region"])
    >>> out = add_noise(exact, space, {"n": CellMechanism("*", count)},
    ...                 secret=b"a server secret of 16+ bytes", policy_version=3)
    >>> out.frame["n"].tolist(), len(out.new_cells)
    ([120, 5], 2)
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Context, Decimal
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from sqlsdc.mechanisms.accountant import Calibration, Noise, Statistic
from sqlsdc.mechanisms.batch_samplers import discrete_gaussian_many, discrete_laplace_many
from sqlsdc.mechanisms.partition import keep_decision
from sqlsdc.mechanisms.permute_flip import permute_and_flip
from sqlsdc.mechanisms.prf import KeyedStream

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CELL_LABEL",
    "CellIdentity",
    "CellMechanism",
    "CellRecord",
    "CellSpace",
    "NoisyCells",
    "add_noise",
    "cell_digests",
    "noisy_values",
    "average",
    "cell_identity",
    "encode_key_value",
    "noisy_quantiles",
    "permute_and_flip",
    "quantile_scores",
    "statistic_identity",
    "stddev",
    "variance",
]

CELL_LABEL = "sqlsdc.dp_cell.v1"
"""Domain separation of cell streams; changing it changes every released DP value."""

Cached = Mapping[str, Fraction] | Callable[[list[str]], Mapping[str, Fraction]] | None


# --- cell identity ---------------------------------------------------------------------------


def encode_key_value(value: object) -> str:
    """The typed canonical text of one group-key value (module docstring)."""
    import pandas as pd

    if value is None or value is pd.NA or value is pd.NaT:
        return "null"
    if isinstance(value, bool | np.bool_):
        return "b:true" if value else "b:false"
    if isinstance(value, int | np.integer):
        return f"i:{int(value)}"
    if isinstance(value, float | np.floating):
        f = float(value)
        return "null" if math.isnan(f) else f"f:{f!r}"
    if isinstance(value, Decimal):
        if value.is_nan():
            return "null"
        # exact: the default context rounds to 28 digits, and two DECIMAL(38, x) groups that
        # differ beyond them (1.00000000000000000000000000001 and ...02) were one cell
        exact = Context(prec=max(len(value.as_tuple().digits), 1))
        return f"d:{value.normalize(exact)}"
    if isinstance(value, str):
        return f"s:{value}"
    if isinstance(value, pd.Timestamp):  # nanoseconds, which datetime drops, are kept
        value = value.to_pydatetime() if not value.nanosecond else value
    if isinstance(value, _dt.datetime):
        return f"ts:{value.isoformat()}"
    if isinstance(value, _dt.date):
        return f"date:{value.isoformat()}"
    if isinstance(value, _dt.time):
        return f"time:{value.isoformat()}"
    if isinstance(value, bytes | bytearray | memoryview):
        return f"x:{bytes(value).hex()}"
    raise TypeError(
        f"group-key value of type {type(value).__name__} has no canonical encoding; cast the "
        "key to a string, number, date or timestamp in SQL"
    )


@dataclass(frozen=True, slots=True)
class CellSpace:
    """What identifies the cells of one result, apart from their key values.

    ``keys`` pairs each key column of the frame with its canonical name (the source column).
    """

    table: str
    keys: tuple[tuple[str, str], ...] = ()
    scope: str = ""
    data_version: str = ""

    @classmethod
    def of(
        cls,
        table: str,
        keys: Sequence[str] | Mapping[str, str] = (),
        *,
        scope: str = "",
        data_version: str = "",
    ) -> CellSpace:
        """Key columns as a list (their names are canonical) or a ``{column: name}`` mapping."""
        pairs = tuple(keys.items()) if isinstance(keys, Mapping) else tuple((k, k) for k in keys)
        names = [name for _, name in pairs]
        if len(set(names)) != len(names):
            raise ValueError(f"canonical key names must be distinct, got {names}")
        return cls(table, pairs, scope, data_version)


@dataclass(frozen=True, slots=True)
class CellMechanism:
    """The canonical measure (``"*"`` for counts) and the calibration of one value column."""

    measure: str
    calibration: Calibration


@dataclass(frozen=True, slots=True)
class CellIdentity:
    text: str  # canonical JSON (module docstring)
    digest: str  # SHA-256 of text, hex: the catalog key

    def __repr__(self) -> str:
        return f"CellIdentity({self.digest[:16]}…)"


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _json(value) -> str:
    """Canonical JSON (sorted keys, no whitespace); one encoder for all cells, as
    ``json.dumps`` with these options builds a new one per call."""
    return _ENCODER.encode(value)


_KEYS_SLOT = "\x00keys\x00"


def _identity_prefix(space: CellSpace, mechanism: CellMechanism) -> tuple[str, str]:
    """The canonical JSON around the ``keys`` member, split so that each cell only encodes its
    keys: ``head + json(keys) + tail`` is exactly ``json(document)`` with sorted keys."""
    doc = {
        "v": 1,
        "table": space.table,
        "scope": space.scope,
        "data": space.data_version,
        "aggregate": mechanism.measure,
        "mechanism": mechanism.calibration.describe(),
        "keys": _KEYS_SLOT,
    }
    head, tail = _json(doc).split(_json(_KEYS_SLOT))
    return head, tail


def _identity(prefix: tuple[str, str], keys: str) -> CellIdentity:
    """The identity of the cell whose ``keys`` member is the JSON text ``keys``."""
    text = prefix[0] + keys + prefix[1]
    return CellIdentity(text, hashlib.sha256(text.encode("utf-8")).hexdigest())


def cell_identity(
    space: CellSpace, mechanism: CellMechanism, key_values: Mapping[str, object]
) -> CellIdentity:
    """The identity of one cell; ``key_values`` maps the frame's key columns to values.

    Example:
        >>> from sqlsdc.mechanisms.accountant import Bounding, PrivacyCost, Statistic, calibrate
        >>> m = CellMechanism("*", calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=1)))
        >>> a = cell_identity(CellSpace.of("persons", {"r": "region"}), m, {"r": "North"})
        >>> b = cell_identity(CellSpace.of("persons", ["region"]), m, {"region": "North"})
        >>> a == b, a.text[:40]
        (True, '{"aggregate":"*","data":"","keys":[["reg')
    """
    prefix = _identity_prefix(space, mechanism)
    keys = sorted([name, encode_key_value(key_values[col])] for col, name in space.keys)
    return _identity(prefix, _json(keys))


STATISTIC_LABEL = "sqlsdc.dp_statistic.v1"


def statistic_identity(
    space: CellSpace, mechanism: CellMechanism, domains: Sequence[Sequence[object]] | None
) -> CellIdentity:
    """The identity of one statistic over *all* cells of ``space``: what a query pays for.

    A query releases a statistic for every cell of its partition (the public domains of the
    keys, or every group present in the data version), so the budget is charged per statistic
    and space, before any exact value is computed; the cells then come for free. The document
    is that of :func:`cell_identity` without key values, plus the sorted canonical key names
    and the encoded domain of each key (``null`` for groups selected privately from the
    data), under its own label so it never equals a cell's.

    Example:
        >>> from sqlsdc.mechanisms.accountant import Bounding, PrivacyCost, Statistic, calibrate
        >>> m = CellMechanism("*", calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=1)))
        >>> a = statistic_identity(CellSpace.of("t", {"r": "region"}), m, [["N", "S"]])
        >>> b = statistic_identity(CellSpace.of("t", {"r": "region"}), m, [["S", "N", "E"]])
        >>> a == b, a.text.startswith('{"aggregate":"*"')
        (False, True)
    """
    names = [name for _col, name in space.keys]
    encoded = None
    if domains is not None:
        encoded = [sorted({encode_key_value(v) for v in d}) for d in domains]
        encoded = [e for _n, e in sorted(zip(names, encoded, strict=True))]
    doc = {
        "v": 1,
        "label": STATISTIC_LABEL,
        "table": space.table,
        "scope": space.scope,
        "data": space.data_version,
        "aggregate": mechanism.measure,
        "mechanism": mechanism.calibration.describe(),
        "keys": sorted(names),
        "domains": encoded,
    }
    text = _json(doc)
    return CellIdentity(text, hashlib.sha256(text.encode("utf-8")).hexdigest())


def _encoded_keys(frame: pd.DataFrame, space: CellSpace) -> list[str]:
    missing = [col for col, _ in space.keys if col not in frame.columns]
    if missing:
        raise ValueError(f"key columns {missing} are not in the frame (columns: {list(frame)})")
    return _encoded_key_rows({col: frame[col].tolist() for col, _ in space.keys}, space,
                             len(frame))  # fmt: skip


def _encoded_key_rows(columns: Mapping[str, list], space: CellSpace, n: int) -> list[str]:
    """Per cell, the JSON text of its canonical ``[name, encoded value]`` pairs sorted by
    name: exactly ``_json(pairs)``, built a column at a time (each value escaped as the JSON
    encoder escapes it, then the pairs joined), which takes a third of the time of one
    encoding per cell on results of thousands of cells."""
    order = sorted(range(len(space.keys)), key=lambda i: space.keys[i][1])
    parts = []
    for i in order:
        column, name = space.keys[i]
        opening = "[" + _JSON_STRING(name) + ","
        parts.append([opening + _JSON_STRING(e) + "]" for e in _encoded_column(columns[column])])
    if not parts:
        return ["[]"] * n
    return ["[" + ",".join(pairs) + "]" for pairs in zip(*parts, strict=True)]


_JSON_STRING = json.encoder.encode_basestring
"""The escaping of a string by :data:`_ENCODER` (``ensure_ascii=False``): the same function."""


def _encoded_column(values: list) -> list[str]:
    """:func:`encode_key_value` of each value; a column of plain ``str`` (or of plain ``int``)
    and NULLs is encoded in one pass without the per-value type tests, to the same texts."""
    kinds = set(map(type, values))
    if kinds <= _STR_KEYS:
        return ["null" if v is None else "s:" + v for v in values]
    if kinds <= _INT_KEYS:
        return ["null" if v is None else f"i:{v}" for v in values]
    return [encode_key_value(v) for v in values]


_STR_KEYS = frozenset((str, type(None)))
_INT_KEYS = frozenset((int, type(None)))  # not bool, whose type is not int


# --- drawing noise ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CellRecord:
    """A newly drawn noisy cell: to be charged and cached together (catalog.budget.charge)."""

    identity: CellIdentity
    column: str
    statistic: Statistic
    value: Fraction


@dataclass
class NoisyCells:
    """Noisy values: ``frame`` (keys + released columns), exact ``values`` per column, the
    cells drawn now (``new_cells``, to charge and cache; ``new_rows``: the row of each, from
    :func:`noisy_values`) and how many came from the cache."""

    frame: pd.DataFrame | None = None  # None from :func:`noisy_values`
    values: dict[str, list[Fraction]] = field(default_factory=dict)
    new_cells: list[CellRecord] = field(default_factory=list)
    reused: int = 0
    new_rows: list[int] = field(default_factory=list)


def _units(value: object, unit: Fraction) -> int:
    """An exact aggregate in grid units: exact types exactly, floats to the nearest unit."""
    import pandas as pd

    if type(value) is int and unit == 1:  # the common case (counts), without Fractions
        return value
    if value is None or value is pd.NA:
        return 0
    if isinstance(value, float | np.floating):
        if not math.isfinite(value):
            if math.isnan(value):
                return 0
            raise ValueError(f"exact aggregate {value} is not finite")
        return round(Fraction(float(value)) / unit)
    if isinstance(value, np.integer):
        value = int(value)
    if isinstance(value, int | Fraction | Decimal):
        return round(Fraction(value) / unit)
    raise TypeError(f"exact aggregate of type {type(value).__name__} is not a number")


def _draw_many(calibration: Calibration, streams: list[KeyedStream]) -> list[int]:
    """One noise draw per fresh cell stream, all cells at once
    (:mod:`sqlsdc.mechanisms.batch_samplers`: the scalar samplers' values, vectorised)."""
    if calibration.noise is Noise.LAPLACE:
        return discrete_laplace_many(calibration.scale, streams)
    if calibration.noise is Noise.GAUSSIAN:
        return discrete_gaussian_many(calibration.sigma2, streams)
    raise ValueError(f"{calibration.statistic.value} cells are not additive; use noisy_quantiles")


def _lookup(cached: Cached, digests: list[str]) -> Mapping[str, Fraction]:
    if cached is None:
        return {}
    return cached(digests) if callable(cached) else cached


def add_noise(
    frame: pd.DataFrame,
    space: CellSpace,
    mechanisms: Mapping[str, CellMechanism],
    *,
    secret: bytes,
    policy_version: int,
    cached: Cached = None,
) -> NoisyCells:
    """Noisy values for the exact cells in ``frame``, deterministic per cell.

    Args:
        frame: one row per cell: the key columns of ``space`` and the exact value columns
            named in ``mechanisms`` (counts, sums of grid-rounded clamped values, sums of
            squares). Other columns are ignored and not returned.
        space: table, canonical key names, scope and data version of the cells.
        mechanisms: value column -> measure and calibration (COUNT, COUNT_UNITS, SUM,
            SUM_SQUARES; quantiles go through :func:`noisy_quantiles`).
        secret: the server's PRF secret (never stored by this function).
        policy_version: the policy in force; part of every stream.
        cached: values already released to this user, by :attr:`CellIdentity.digest`: a
            mapping, or a function called once with all digests (e.g. a catalog lookup).
            Cached values are returned as they are and not drawn again.

    Returns:
        :class:`NoisyCells`; counts are int64 columns, sums float64 (exact in ``values``).
    """
    keys = _encoded_keys(frame, space)
    for column in mechanisms:
        if column not in frame.columns:
            raise ValueError(
                f"value column {column!r} is not in the frame (columns: {list(frame)})"
            )
    exact = {column: frame[column].tolist() for column in mechanisms}
    result = _noisy_values(keys, exact, space, mechanisms, secret, policy_version, cached)
    result.frame = out = frame[[col for col, _ in space.keys]].copy()
    for column, mechanism in mechanisms.items():
        values, unit = result.values[column], mechanism.calibration.unit
        if unit.denominator == 1 and all(v.denominator == 1 for v in values):
            out[column] = np.array([int(v) for v in values], dtype=np.int64)
        else:
            out[column] = np.array([float(v) for v in values], dtype=np.float64)
    return result


def noisy_values(
    keys: Mapping[str, list],
    exact: Mapping[str, list],
    space: CellSpace,
    mechanisms: Mapping[str, CellMechanism],
    *,
    secret: bytes,
    policy_version: int,
    cached: Cached = None,
) -> NoisyCells:
    """:func:`add_noise` on plain columns (``keys``: each key column of ``space``;
    ``exact``: each value column of ``mechanisms``, all of one length): the same values,
    without a frame (``frame`` None), for callers that keep their cells as lists."""
    n = len(next(iter(exact.values()), []))
    rows = _encoded_key_rows(keys, space, n)
    return _noisy_values(rows, exact, space, mechanisms, secret, policy_version, cached)


def cell_digests(
    keys: Mapping[str, list], space: CellSpace, mechanisms: Mapping[str, CellMechanism]
) -> list[str]:
    """The digests of the cells :func:`noisy_values` looks up for these keys, known before
    their exact values are (e.g. to look them up along with other digests)."""
    rows = _encoded_key_rows(keys, space, len(next(iter(keys.values()), [])))
    prefixes = [_identity_prefix(space, m) for m in mechanisms.values()]
    return [_identity(prefix, k).digest for prefix in prefixes for k in rows]


def _noisy_values(keys, exact_columns, space, mechanisms, secret, policy_version, cached):
    streams = KeyedStream(secret, policy_version, CELL_LABEL)
    identities: dict[str, list[CellIdentity]] = {}
    for column, mechanism in mechanisms.items():
        prefix = _identity_prefix(space, mechanism)
        identities[column] = [_identity(prefix, k) for k in keys]
    known = _lookup(cached, [i.digest for ids in identities.values() for i in ids])
    result = NoisyCells()
    for column, mechanism in mechanisms.items():
        cal = mechanism.calibration
        unit = cal.unit
        exact = exact_columns[column]
        values: list[Fraction | None] = [None] * len(exact)
        new: list[int] = []  # rows drawn now, in order
        for row, ident in enumerate(identities[column]):
            hit = known.get(ident.digest)
            if hit is not None:
                values[row] = hit if type(hit) is Fraction else Fraction(hit)
                result.reused += 1
            else:
                new.append(row)
        cell_streams = streams.derive_many([identities[column][row].text for row in new])
        if cal.noise is Noise.OPTIMAL_SELECTION:  # the keep decision of the group, 1 or 0
            drawn = [keep_decision(_units(exact[row], unit), cal, stream)
                     for row, stream in zip(new, cell_streams, strict=True)]  # fmt: skip
        else:
            noise = _draw_many(cal, cell_streams)
            drawn = [_units(exact[row], unit) + z for row, z in zip(new, noise, strict=True)]
        for row, units in zip(new, drawn, strict=True):
            noisy = Fraction(units) if unit == 1 else units * unit
            values[row] = noisy
            result.new_cells.append(CellRecord(identities[column][row], column, cal.statistic,
                                               noisy))  # fmt: skip
        result.new_rows += new
        result.values[column] = values
    return result


# --- post-processing (no privacy cost) -------------------------------------------------------


def average(noisy_sum, noisy_count, lower, upper) -> np.ndarray:
    """AVG = noisy sum / noisy count, count floored at 1, clamped to [lower, upper].

    Post-processing of two released cells (no further cost); the clamp keeps every answer in
    the declared domain (as SmartNoise SQL and Tumult do).
    """
    s = np.asarray(noisy_sum, dtype=np.float64)
    n = np.maximum(np.asarray(noisy_count, dtype=np.float64), 1.0)
    return np.clip(s / n, float(lower), float(upper))


def variance(noisy_sum_squares, noisy_sum, noisy_count, lower, upper, *, ddof: int = 1):
    """VAR from noisy sum of squares, sum and count: S2/n - mean^2, times n/(n - ddof) when
    n > ddof (ddof = 1: SQL VAR_SAMP), clamped to [0, ((upper - lower)/2)^2], the largest
    variance of a variable in [lower, upper]."""
    n = np.maximum(np.asarray(noisy_count, dtype=np.float64), 1.0)
    mean = average(noisy_sum, n, lower, upper)
    var = np.asarray(noisy_sum_squares, dtype=np.float64) / n - mean**2
    correction = np.where(n > ddof, n / np.maximum(n - ddof, 1.0), 1.0)
    top = ((float(upper) - float(lower)) / 2) ** 2
    return np.clip(var * correction, 0.0, top)


def stddev(noisy_sum_squares, noisy_sum, noisy_count, lower, upper, *, ddof: int = 1):
    """STDDEV = sqrt(:func:`variance`)."""
    return np.sqrt(variance(noisy_sum_squares, noisy_sum, noisy_count, lower, upper, ddof=ddof))


# --- quantiles: Smith (2011) scores, permute-and-flip (McKenna and Sheldon 2020) -------------


def quantile_scores(histogram: Sequence[int], alpha: Fraction) -> np.ndarray:
    """Integer scores of the candidates c_0 < ... < c_k (lower is better) for the alpha-quantile.

    With ``histogram[j]`` rows at candidate c_j, lt_j = #rows below c_j, gt_j = #rows above,
    and alpha = a/b: score_j = |(b - a) lt_j - a gt_j| = b |lt_j - alpha (lt_j + gt_j)|, zero
    where c_j splits the rows in the ratio alpha : 1 - alpha (Smith 2011's utility; OpenDP's
    ``make_quantile_score_candidates``). One row more or less moves lt or gt by one, so a score
    moves by at most max(a, b - a).
    """
    h = np.asarray(histogram, dtype=np.int64)
    if (h < 0).any():
        raise ValueError("histogram counts must be >= 0")
    below = np.concatenate(([0], np.cumsum(h)[:-1]))
    above = h.sum() - below - h
    return _scores(below, above, alpha, int(h.sum()))


def _scores(below: np.ndarray, above: np.ndarray, alpha: Fraction, rows: int) -> np.ndarray:
    """|(b - a) lt - a gt| exactly: int64 where every product fits (``rows``, the most rows of
    a cell, times max(a, b - a) below 2^63), else Python ints (an object array, which
    :func:`~sqlsdc.mechanisms.permute_flip.permute_and_flip` takes as they are). int64 wrapped
    silently past 2^63 (alpha = 0.1 + 0.2, b = 10^17, over a cell of 93 rows: the released
    quantile was the draw of wrapped scores, 2,668 for an exact 216), and a b - a past 2^63
    (alpha = 1e-300) raised OverflowError after the charge (red team s47b). The rewrite
    refuses a b over 10^9 (:data:`~sqlsdc.rewrite.dp_aggregates.MAX_QUANTILE_DENOMINATOR`), so
    the Python ints are for cells of billions of rows only."""
    a, b = alpha.numerator, alpha.denominator
    if max(a, b - a) * max(rows, 0) < 1 << 63:
        return np.abs((b - a) * below - a * above)
    below, above = below.astype(object), above.astype(object)
    return np.abs((b - a) * below - a * above)


def noisy_quantiles(
    histograms: pd.DataFrame,
    space: CellSpace,
    mechanism: CellMechanism,
    *,
    secret: bytes,
    policy_version: int,
    column: str = "quantile",
    bin_column: str = "bin",
    count_column: str = "count",
    cached: Cached = None,
    max_scores: int | None = None,
    check: Callable[[], object] | None = None,
) -> NoisyCells:
    """One noisy alpha-quantile per cell from per-cell histograms over the bounded domain.

    ``histograms`` is long: key columns, ``bin_column`` = j (the clamped value rounded to the
    grid, j = (value - lower)/g in 0..k) and ``count_column`` = rows in that bin; absent bins
    count 0. A cell with no data must appear (e.g. one row with count 0) to be released. The
    released value is the candidate lower + j g chosen by :func:`permute_and_flip` on
    :func:`quantile_scores` with the calibration's rate.

    ``max_scores`` bounds the scores held at once (cells x candidates, 8 bytes each): the
    cells are scored in blocks of at most that many scores (at least one cell each), so the
    memory does not grow with the number of cells, which private groups take from the data.

    ``check`` is called before each block and each cell is drawn, and within draws
    (:func:`permute_and_flip`, whose cost is set by k + 1 and the rate, not by the data);
    it raises to stop (the statement timeout, a cancel).
    """
    import pandas as pd

    cal = mechanism.calibration
    if cal.statistic is not Statistic.QUANTILE:
        raise ValueError(f"noisy_quantiles needs a QUANTILE calibration, got {cal.statistic.value}")
    b = cal.bounding
    k = int((b.upper - b.lower) / b.granularity)
    key_cols = [col for col, _ in space.keys]
    bins = histograms[bin_column].to_numpy(dtype=np.int64)
    if len(bins) and (bins.min() < 0 or bins.max() > k):
        raise ValueError(f"{bin_column} must be in 0..{k} (clamp and round values in SQL)")
    counts = histograms[count_column].to_numpy(dtype=np.int64)
    if (counts < 0).any():
        raise ValueError("histogram counts must be >= 0")
    if key_cols:
        codes, uniques = pd.MultiIndex.from_frame(histograms[key_cols]).factorize()
        frame = uniques.to_frame(index=False, name=key_cols)
        if (codes < 0).any():  # pandas gives -1 to keys it cannot factorize
            raise ValueError(f"cannot group the histogram by {key_cols}")
    else:
        codes, frame = np.zeros(len(histograms), dtype=np.int64), pd.DataFrame(index=[0])
    keys = _encoded_keys(frame, space)
    prefix = _identity_prefix(space, mechanism)
    identities = [_identity(prefix, kv) for kv in keys]
    known = _lookup(cached, [i.digest for i in identities])
    streams = KeyedStream(secret, policy_version, CELL_LABEL)
    result = NoisyCells(frame)
    values = []
    block = len(frame) if max_scores is None else max(1, max_scores // (k + 1))
    order = np.argsort(codes, kind="stable")  # histogram rows by cell, to cut into blocks
    codes, bins, counts = codes[order], bins[order], counts[order]
    for start in range(0, len(frame), max(block, 1)):
        stop = min(start + block, len(frame))
        if check is not None:
            check()
        scores = _block_scores(codes, bins, counts, start, stop, k, cal.alpha)
        for row, ident in enumerate(identities[start:stop]):
            hit = known.get(ident.digest)
            if hit is not None:
                values.append(Fraction(hit))
                result.reused += 1
                continue
            if check is not None:
                check()
            j = permute_and_flip(scores[row], cal.rate, streams.derive(ident.text), check)
            value = b.lower + j * b.granularity
            values.append(value)
            result.new_cells.append(CellRecord(ident, column, cal.statistic, value))
    result.values[column] = values
    frame[column] = np.array([float(v) for v in values], dtype=np.float64)
    return result


def _block_scores(codes, bins, counts, start: int, stop: int, k: int, alpha: Fraction):
    """:func:`quantile_scores` of the cells ``start`` to ``stop`` (codes sorted), one row each."""
    lo, hi = np.searchsorted(codes, [start, stop])
    hist = np.zeros((stop - start, k + 1), dtype=np.int64)
    np.add.at(hist, (codes[lo:hi] - start, bins[lo:hi]), counts[lo:hi])
    below = np.cumsum(hist, axis=1) - hist
    totals = hist.sum(axis=1, keepdims=True)
    above = totals - below - hist
    return _scores(below, above, alpha, int(totals.max(initial=0)))
