"""Multivariate microaggregation: MDAV, a local-search optimiser, and the SSE/SST loss.

The *microaggregation problem* (Domingo-Ferrer & Mateo-Sanz 2002; digest 2006 §2; Castro,
Gentile & Spagnolo-Arrizabalaga 2022, digest 2022 §1.1): partition the n records into groups of
at least k records and replace every record by its group centroid, minimising

    SSE = Σ_groups Σ_{i∈g} ‖x_i − x̄_g‖²,   IL = 100 · SSE / SST,   SST = Σ_i ‖x_i − x̄‖²,

on standardised variables. Optimal groups have between k and 2k − 1 records. The released
values are k-anonymous on the microaggregated variables.

* :func:`mdav` — Maximum Distance to Average Vector (Domingo-Ferrer & Mateo-Sanz 2002; digest
  2006 test case T8), compiled and linear in memory: 10^5 records × 5 variables in about 3 s.
* :func:`improve` — MDAV followed by a local search that moves single records between groups
  and swaps pairs of records (the two-swap of Castro et al. 2022, Fig. 1, extended by moves
  that keep every group within [k, 2k − 1]), repeated from perturbed solutions (an iterated
  local search, seeded, so deterministic; each round recomputes only what its perturbation
  may have changed). It never returns a worse partition than MDAV.

Example:
    >>> import numpy as np
    >>> x = np.array([[1.0], [2], [3], [10], [11], [12], [20], [21], [22]])
    >>> labels = mdav(x, 3)
    >>> sorted(map(len, groups(labels)))
    [3, 3, 3]
    >>> round(information_loss(x, labels, standardise=False), 4)
    1.0949
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.spatial import cKDTree

from sqlsdc.errors import MicrodataError
from sqlsdc.microdata import _kernels

__all__ = [
    "MicroaggregationResult",
    "groups",
    "il1s",
    "improve",
    "information_loss",
    "mdav",
    "microaggregate",
    "sse",
    "sst",
    "standardise",
    "vmdav",
]

METHODS = ("mdav", "vmdav", "optimal")


def standardise(X: np.ndarray) -> np.ndarray:
    """Centre each column and divide it by its standard deviation (ddof = 1, as R's ``scale``).

    A constant column is only centred (it adds nothing to SSE or SST). IL = SSE/SST does not
    depend on ddof: it scales every column alike.
    """
    X = np.asarray(X, dtype=float)
    sd = X.std(axis=0, ddof=1) if len(X) > 1 else np.ones(X.shape[1])
    sd = np.where(sd > 0, sd, 1.0)
    return (X - X.mean(axis=0)) / sd


def _matrix(X, k: int) -> np.ndarray:
    X = np.ascontiguousarray(np.asarray(X, dtype=float))
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2 or X.shape[1] == 0:
        raise MicrodataError(f"expected a records × variables matrix, got shape {X.shape}")
    if not np.isfinite(X).all():
        raise MicrodataError(
            "microaggregation needs finite values; impute or drop the missing values first"
        )
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 2:
        raise MicrodataError(f"k must be an integer ≥ 2, got {k!r}")
    if len(X) < k:
        raise MicrodataError(
            f"{len(X)} records cannot form a group of k = {k}; lower k or add records"
        )
    return X


def mdav(X, k: int, *, block: int | None = None) -> np.ndarray:
    """Group labels (0, 1, …) of MDAV (Domingo-Ferrer & Mateo-Sanz 2002; digest 2006 T8).

    While at least 3k records remain: r is the record farthest from the centroid of the
    remaining ones, s the record farthest from r; r and its k − 1 nearest records form a
    group, then s and its k − 1 nearest among the rest. With 2k..3k − 1 left, one more group
    around the record farthest from the centroid, and the rest form the last group; with fewer
    than 2k left, they form one group. Every group has k..2k − 1 records.

    MDAV's time grows with n²/k. With ``block``, files of more than ``block`` records are
    halved at the median of their first principal component, recursively, until every part
    holds at most ``block`` records, and each part is microaggregated alone (*partitioned
    MDAV*): about n·block/k time, at some loss of quality near the cuts
    (``benchmarks/README.md`` reports it).

    Distances are Euclidean on ``X`` as given: standardise first (:func:`standardise`).
    """
    X = _matrix(X, k)
    if block is None or len(X) <= block:
        return _kernels.mdav(X, int(k))
    if block < 2 * k:
        raise MicrodataError(f"block must hold at least 2k = {2 * k} records, got {block}")
    labels = np.empty(len(X), dtype=np.int64)
    offset = 0
    for part in _slices(X, np.arange(len(X)), block):
        local = _kernels.mdav(np.ascontiguousarray(X[part]), int(k))
        labels[part] = local + offset
        offset += local.max() + 1
    return labels


def _slices(X: np.ndarray, rows: np.ndarray, block: int) -> list[np.ndarray]:
    """Halve ``rows`` at the median of their first principal component until every part
    holds at most ``block`` records (compact cells, unlike slabs along one axis)."""
    if len(rows) <= block:
        return [rows]
    centred = X[rows] - X[rows].mean(axis=0)
    axis = np.linalg.eigh(centred.T @ centred)[1][:, -1]
    order = rows[np.argsort(centred @ axis, kind="stable")]
    half = len(order) // 2
    return _slices(X, order[:half], block) + _slices(X, order[half:], block)


def vmdav(X, k: int, *, gamma: float = 0.2) -> np.ndarray:
    """Group labels of V-MDAV, variable-size MDAV (Solanas & Martínez-Ballesté 2006; digest
    2022 §1.1).

    While at least k records are ungrouped: e is the record farthest from their centroid; e
    and its k − 1 nearest form a group, which then grows while it has fewer than 2k − 1
    records: u is the ungrouped record nearest to a member (at distance d_in), d_out its
    distance to the nearest other ungrouped record, and u joins if d_in < γ·d_out (γ ≈ 0.2
    for scattered data, ≈ 1.1 for clustered data). The fewer than k records left join the
    group with the nearest centroid, one by one.
    """
    X = _matrix(X, k)
    if gamma < 0:
        raise MicrodataError(f"gamma must be ≥ 0, got {gamma}")
    labels, rest = _kernels.vmdav(X, int(k), float(gamma))
    if len(rest):
        done = labels >= 0
        cents = _centroids(X[done], labels[done])
        sizes = np.bincount(labels[done])
        for i in rest:
            g = int(np.argmin(((cents - X[i]) ** 2).sum(axis=1)))
            cents[g] = (cents[g] * sizes[g] + X[i]) / (sizes[g] + 1)
            sizes[g] += 1
            labels[i] = g
    return labels


def groups(labels: np.ndarray) -> list[np.ndarray]:
    """Row positions of each group, in group order."""
    order = np.argsort(labels, kind="stable")
    cuts = np.flatnonzero(np.diff(labels[order])) + 1
    return np.split(order, cuts)


def _centroids(X: np.ndarray, labels: np.ndarray) -> np.ndarray:
    G = labels.max() + 1
    sums = np.zeros((G, X.shape[1]))
    np.add.at(sums, labels, X)
    return sums / np.bincount(labels, minlength=G)[:, None]


def sse(X, labels: np.ndarray) -> float:
    """Within-group sum of squares SSE = Σ_g Σ_{i∈g} ‖x_i − x̄_g‖² (Castro et al. 2022, §1)."""
    X = np.asarray(X, dtype=float).reshape(len(labels), -1)
    return float(((X - _centroids(X, labels)[labels]) ** 2).sum())


def sst(X) -> float:
    """Total sum of squares SST = Σ_i ‖x_i − x̄‖²."""
    X = np.asarray(X, dtype=float)
    X = X.reshape(len(X), -1)
    return float(((X - X.mean(axis=0)) ** 2).sum())


def information_loss(X, labels: np.ndarray, *, standardise: bool = True) -> float:
    """IL = 100 · SSE / SST (Castro et al. 2022, §1.1), on standardised variables by default."""
    X = np.asarray(X, dtype=float).reshape(len(labels), -1)
    if standardise:
        X = globals()["standardise"](X)
    total = sst(X)
    return 0.0 if total == 0 else 100.0 * sse(X, labels) / total


def il1s(original, masked) -> float:
    """IL1s = (1/(n·p)) Σ_j Σ_i |x_ij − x'_ij| / (√2 · S_j) (Templ, PSD 2006, digest §20).

    S_j is the standard deviation (ddof = 1) of original variable j; constant variables are
    left out.
    """
    X = np.asarray(original, dtype=float)
    Z = np.asarray(masked, dtype=float)
    X, Z = X.reshape(len(X), -1), Z.reshape(len(Z), -1)
    if X.shape != Z.shape:
        raise MicrodataError(f"original {X.shape} and masked {Z.shape} data differ in shape")
    sd = X.std(axis=0, ddof=1)
    keep = sd > 0
    if not keep.any():
        return 0.0
    return float((np.abs(X - Z)[:, keep] / (np.sqrt(2) * sd[keep])).mean())


class _Candidates:
    """For each record, the ``neighbours`` groups whose centroids are nearest to it:
    ``cKDTree(centroids).query(X, k=neighbours)``, asked again only for the records whose answer
    may have changed since the previous call.

    Between two calls of the iterated local search only a few groups change. Each call keeps,
    per record, the ``neighbours + 1`` nearest centroids and their distances. A record keeps
    its list (group numbers translated to the new labels, :func:`_kernels.same_groups`) when
    those ``neighbours + 1`` groups still have exactly the same records (hence the same
    centroids, summed in the same order), no new centroid is as near as the last of them, and
    the ``neighbours + 1`` distances are all different: then the nearest ``neighbours`` are
    unique and in a unique order, so the tree would return them. Records with equal distances
    (whose order is the tree's) are asked every time. The answer is the same array as a query
    of every record.
    """

    def __init__(self, X: np.ndarray, neighbours: int):
        self.X = X
        self.neighbours = neighbours
        self.labels: np.ndarray | None = None  # labels of the previous call

    def __call__(self, labels: np.ndarray) -> np.ndarray:
        X = self.X
        cents = _centroids(X, labels)
        q = min(self.neighbours, len(cents))
        if q == len(cents):
            self.labels = None
            return np.broadcast_to(np.arange(q), (len(X), q)).copy()
        tree = cKDTree(cents)
        if self.labels is None or self.near.shape[1] != q + 1:
            redo = np.ones(len(X), dtype=bool)
            self.near = np.empty((len(X), q + 1), dtype=np.int64)
            self.dist = np.empty((len(X), q + 1))
            self.ties = np.zeros(len(X), dtype=bool)
        else:
            image = _kernels.same_groups(self.labels, labels, self.groups, len(cents))
            fresh = np.ones(len(cents), dtype=bool)
            fresh[image[image >= 0]] = False
            redo = self.ties | _kernels.translate(self.near, image)
            bound = self.dist[:, q] ** 2 * (1 + 1e-9)
            redo |= _kernels.within(X, np.ascontiguousarray(cents[fresh]), bound)
        if redo.any():
            dist, near = tree.query(X[redo], k=q + 1)
            self.near[redo] = near
            self.dist[redo] = dist
            self.ties[redo] = (np.diff(dist, axis=1) == 0).any(axis=1)
        cand = np.ascontiguousarray(self.near[:, :q])
        if self.ties.any():
            cand[self.ties] = tree.query(X[self.ties], k=q)[1].reshape(-1, q)
        self.labels, self.groups = labels.copy(), len(cents)
        return cand


class _LocalSearch:
    """:func:`_kernels.local_search` from call to call, remembering which records found no
    improving step and which groups changed since (the kernel's ``seen`` and ``stamp``).

    Between calls a group keeps its stamp when the new labels have a group with exactly the
    same records (:func:`_kernels.same_groups`) and the previous call did not change it (its
    sums were then summed afresh in record order, as the new call sums them); every other group
    is stamped with the new call's clock, and a record whose candidate groups are not the same
    groups as before loses its ``seen``. A call thus evaluates only the records near what
    changed, and takes the same steps as a call that evaluates every record.
    """

    def __init__(self, n: int):
        self.seen = np.full(n, -1, dtype=np.int64)
        self.clock = 0
        self.labels: np.ndarray | None = None  # labels at the end of the previous call

    def __call__(self, X, labels, k, cand, max_sweeps) -> int:
        """Improve ``labels`` in place; return the number of sweeps."""
        self.clock += 1
        groups = int(labels.max()) + 1
        stamp = np.zeros(groups, dtype=np.int64)
        if self.labels is not None:
            image = _kernels.same_groups(self.labels, labels, len(self.stamp), groups)
            kept = image >= 0
            stamp[:] = self.clock
            old = self.stamp[kept]
            stamp[image[kept]] = np.where(old <= self.start, old, self.clock)
            if self.cand.shape == cand.shape:
                _kernels.forget(self.seen, self.cand, cand, image)
            else:
                self.seen[:] = -1
        self.start = self.clock
        sweeps, _, self.clock = _kernels.local_search(
            X, labels, k, cand, max_sweeps, stamp, self.seen, self.clock
        )
        self.labels, self.cand, self.stamp = labels.copy(), cand, stamp
        return sweeps


def _search(X, labels, k, candidates: _Candidates, local_search: _LocalSearch) -> np.ndarray:
    """Local search from ``labels`` to a local optimum (new candidates every 50 sweeps). Steps
    keep every group non-empty, so the labels stay 0..G-1."""
    labels = labels.copy()
    while local_search(X, labels, k, candidates(labels), 50) == 50:
        pass
    return labels


def _relabel(labels: np.ndarray) -> np.ndarray:
    return np.unique(labels, return_inverse=True)[1].astype(np.int64)


def improve(
    X,
    k: int,
    *,
    labels: np.ndarray | None = None,
    neighbours: int = 40,
    rounds: int = 200,
    time_limit: float = 30.0,
    seed: int = 0,
) -> np.ndarray:
    """A better-than-MDAV partition: local search, then an iterated local search.

    1. Start from ``labels`` (default: :func:`mdav`).
    2. Local search (:func:`sqlsdc.microdata._kernels.local_search`): for every record, the best
       move to, or swap with a record of, one of the ``neighbours`` groups with the nearest
       centroids; repeat until no step lowers the SSE. Moves keep every group within
       [k, 2k − 1], swaps keep sizes, so the result stays feasible.
    3. ``rounds`` times (and within ``time_limit`` seconds): pick a group at random, pool it
       with its two nearest groups, regroup the pool by MDAV, run the local search, and keep
       the result if its SSE is lower. The generator is seeded (``seed``): the same input
       gives the same partition.

    A round changes only a few groups, so the rounds carry over what did not change: the
    candidate lists of records far from the changed groups (:class:`_Candidates`) and the
    records whose last evaluation found no step and whose groups are as they were
    (:class:`_LocalSearch`). The steps, hence the partition, are those of recomputing
    everything every round (``tests/microdata/test_improve_incremental.py`` compares them);
    on 28,025 records × 1 variable, k = 5, 200 rounds take about 2 s instead of 25 s.

    The SSE never rises above that of the start.
    """
    X = _matrix(X, k)
    k = int(k)
    start = mdav(X, k) if labels is None else _relabel(np.asarray(labels))
    candidates, local_search = _Candidates(X, neighbours), _LocalSearch(len(X))
    best = _search(X, start, k, candidates, local_search)
    best_sse = sse(X, best)
    rng = np.random.default_rng(seed)
    deadline = time.monotonic() + time_limit
    for _ in range(rounds):
        if time.monotonic() > deadline:
            break
        trial = _perturb(X, best, k, rng)
        if trial is None:
            break
        trial = _search(X, trial, k, candidates, local_search)
        value = sse(X, trial)
        if value < best_sse - 1e-9 * (1 + best_sse):
            best, best_sse = trial, value
    if labels is None or best_sse <= sse(X, start):
        return best
    return start


def _perturb(X, labels, k, rng) -> np.ndarray | None:
    """Pool a random group with its two nearest groups and regroup the pool by MDAV."""
    cents = _centroids(X, labels)
    if len(cents) < 3:
        return None
    g = rng.integers(len(cents))
    _, near = cKDTree(cents).query(cents[g], k=3)
    pool = np.flatnonzero(np.isin(labels, near))
    sub = X[pool]
    # a random rotation of the pool changes which record MDAV starts from
    sub = sub @ np.linalg.qr(rng.standard_normal((X.shape[1], X.shape[1])))[0]
    sub = sub * rng.uniform(0.7, 1.3, X.shape[1])
    part = _kernels.mdav(np.ascontiguousarray(sub), k)
    trial = labels.copy()
    trial[pool] = labels.max() + 1 + part
    return _relabel(trial)


@dataclass(frozen=True)
class MicroaggregationResult:
    """Microaggregated data and the quality of the partition.

    Attributes:
        data: the input frame with the chosen columns replaced by their group means.
        labels: group number of every row (-1: a row with a missing value, left as it is).
        k: minimum group size.
        method: ``"mdav"`` or ``"optimal"``.
        il: 100 · SSE / SST on the standardised columns (Castro et al. 2022).
        il1s: IL1s between original and microaggregated columns (Templ 2006).
        seconds: time spent grouping.
    """

    data: pd.DataFrame
    labels: np.ndarray
    k: int
    method: str
    il: float
    il1s: float
    seconds: float


def microaggregate(
    df: pd.DataFrame,
    columns: list[str],
    k: int,
    *,
    method: str = "mdav",
    standardised: bool = True,
    seed: int = 0,
    time_limit: float = 30.0,
    gamma: float = 0.2,
    block: int | None = None,
) -> MicroaggregationResult:
    """Replace ``columns`` of ``df`` by the means of groups of at least ``k`` similar rows.

    Args:
        df: the records.
        columns: the numeric variables grouped together (multivariate microaggregation).
        k: minimum group size (≥ 2).
        method: ``"mdav"`` (:func:`mdav`), ``"vmdav"`` (:func:`vmdav`) or ``"optimal"``
            (:func:`improve`, which starts from MDAV and never does worse).
        standardised: group on z-scores (the usual choice; otherwise the raw scales weigh in).
        seed: seed of the optimiser's perturbations.
        time_limit: seconds the optimiser may spend on its perturbations.
        gamma: V-MDAV's gain.
        block: partitioned MDAV above this many records (``mdav(..., block=)``).

    Rows with a missing value in ``columns`` are left as they are (labelled -1) and take no
    part in the groups or the information loss.

    Raises:
        MicrodataError: unknown method or column, non-numeric values, k < 2 or fewer than k
            complete rows.
    """
    if method not in METHODS:
        raise MicrodataError(f"unknown microaggregation method {method!r}; use one of {METHODS}")
    missing = [c for c in columns if c not in df.columns]
    if missing or not columns:
        raise MicrodataError(
            f"columns {missing or columns} not in the data; available: {list(df.columns)}"
        )
    try:
        raw = df[list(columns)].to_numpy(dtype=float)
    except (TypeError, ValueError) as exc:
        raise MicrodataError(f"microaggregation needs numeric columns: {exc}") from None
    complete = np.isfinite(raw).all(axis=1)
    raw = _matrix(raw[complete], k)
    X = standardise(raw) if standardised else raw
    t0 = time.perf_counter()
    if method == "mdav":
        labels = mdav(X, k, block=block)
    elif method == "vmdav":
        labels = vmdav(X, k, gamma=gamma)
    else:
        labels = improve(X, k, seed=seed, time_limit=time_limit)
    seconds = time.perf_counter() - t0
    masked = _centroids(raw, labels)[labels]
    out = df.copy()
    for j, c in enumerate(columns):
        column = out[c].to_numpy(dtype=float, na_value=np.nan).copy()
        column[complete] = masked[:, j]
        out[c] = column
    full = np.full(len(df), -1, dtype=np.int64)
    full[complete] = labels
    return MicroaggregationResult(
        data=out,
        labels=full,
        k=int(k),
        method=method,
        il=information_loss(raw, labels),
        il1s=il1s(raw, masked),
        seconds=seconds,
    )
