"""DP synthesis of categorical records from noisy margins: ``dp-ipf`` and ``dp-catall``.

Raab, "Utility and Disclosure Risk for Differentially Private Synthetic Categorical Data"
(digest ``seed_synth_papers.md`` Part C, "[RA]"):

* ``dp-ipf`` ([RA] §C.3, the log-linear model of all two-way margins by default): each of the
  M margins gets ε/M, so its cells get noise of scale Δ·M/ε (Δ: what one privacy unit can
  change in one margin, L1); the noisy margins are post-processed — made mutually consistent
  (:func:`consistent`, our improvement over [RA]), given the prior ``nprior`` spread over their
  cells, clamped at 1e-6 and rescaled to the estimated total (:func:`postprocess`) — and the
  full table is fitted to them by iterative proportional fitting (:func:`ipf`, [RA] step 3:
  cycle through the margins, ``x <- x·target/current``, stop when the largest change of a cell
  is below ``tol``), then records are drawn from the fitted table by one multinomial draw
  (:func:`sample_records`).
* ``dp-catall`` ([RA] §C.2, the saturated model, a benchmark baseline): noise of scale Δ/ε on
  every cell of the full table, then the same prior, clamp, rescale and multinomial draw.

Noise is the exact discrete Laplace of :mod:`sqlsdc.mechanisms.samplers` (integer counts plus
integer noise, every coin from a keyed stream: :func:`noisy_counts`), so it is ε-DP exactly,
not the floating-point Laplace of [RA]. The total N is not used: it is estimated from the
noisy margins (the weighted mean of their totals), so nothing but the noisy margins reaches
the model.

Structural zeros (cells that cannot occur, e.g. age 0–15 and widowed) are partial assignments
``{variable: level}``: their cells of the full table and of every margin that holds all their
variables are 0, get no noise and no prior, and so never appear in the output.

Example (T6 of the digest: exact two-way margins of a 2×2×2 table):
    >>> n = np.array([[[10, 20], [30, 5]], [[25, 5], [15, 90]]], float)
    >>> margins = {m: n.sum(axis=tuple(a for a in range(3) if a not in m))
    ...            for m in default_margins(3)}
    >>> fit, report = ipf(margins, (2, 2, 2))
    >>> round(float(fit[0, 0, 0]), 4), report["iterations"], report["converged"]
    (21.6542, 7, True)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction

import numpy as np

from sqlsdc.errors import SynthesisError
from sqlsdc.mechanisms.prf import KeyedStream
from sqlsdc.mechanisms.samplers import discrete_laplace

__all__ = [
    "DEFAULT_MAX_CELLS",
    "consistent",
    "default_margins",
    "ipf",
    "noisy_counts",
    "postprocess",
    "sample_records",
    "synthesize_dp_catall",
    "synthesize_dp_ipf",
    "zero_mask",
]

DEFAULT_MAX_CELLS = 10_000_000  # cells of the full table (8 bytes each, a few copies in IPF)
FLOOR = 1e-6  # [RA]: noisy cells below this are set to it (synthpop a309e70)
TOL = 1e-4  # [RA]: IPF stops when no cell changes by this much (synthpop a309e70)
MAX_ITERATIONS = 5000  # [RA]

Margin = tuple[int, ...]  # sorted variable positions
Zero = Mapping[int, int]  # a structural zero: variable position -> level position


def default_margins(p: int, order: int = 2) -> list[Margin]:
    """All ``order``-way margins of ``p`` variables ([RA]: all two-way, M = p(p−1)/2); the full
    table when ``p <= order``."""
    if p <= order:
        return [tuple(range(p))]
    return list(itertools.combinations(range(p), order))


def zero_mask(shape: Sequence[int], zeros: Sequence[Zero], axes: Sequence[int] | None = None):
    """Boolean array over the cells of the table of variables ``axes`` (default: all), True
    where a structural zero holds every one of its variables' levels; zeros naming a variable
    outside ``axes`` cannot be decided there and are left out."""
    axes = list(range(len(shape))) if axes is None else list(axes)
    mask = np.zeros([shape[a] for a in axes], bool)
    for zero in zeros:
        if not set(zero) <= set(axes):
            continue
        index = tuple(zero.get(a, slice(None)) for a in axes)
        mask[index] = True
    return mask


def noisy_counts(
    counts: np.ndarray, scale: Fraction, stream: Callable[[int], KeyedStream], fixed=None
) -> np.ndarray:
    """``counts`` (integers) plus discrete Laplace noise of ``scale`` drawn from
    ``stream(cell)`` (the keyed stream of each flat cell index); cells where ``fixed`` is True
    (structural zeros, public) stay 0."""
    flat = np.asarray(counts, dtype=np.int64).ravel()
    fixed = np.zeros(flat.shape, bool) if fixed is None else np.asarray(fixed).ravel()
    out = np.zeros(flat.shape, np.int64)
    for i in range(flat.size):
        if not fixed[i]:
            out[i] = int(flat[i]) + discrete_laplace(scale, stream(i))
    return out.reshape(np.shape(counts))


def _marginal(table: np.ndarray, axes: Margin, keep: Sequence[int]) -> np.ndarray:
    """The margin of ``table`` (over variables ``axes``) on the variables ``keep`` ⊆ axes."""
    drop = tuple(i for i, a in enumerate(axes) if a not in keep)
    return table.sum(axis=drop) if drop else table


def consistent(margins: Mapping[Margin, np.ndarray]) -> dict[Margin, np.ndarray]:
    """The noisy margins made mutually consistent: every set of variables that two margins
    share (and the empty set, the total) gets one marginal table, the mean of the margins'
    estimates weighted by their inverse variance, and each margin is shifted to it.

    This is the mutual-consistency step of PriView (Qardaji, Yang and Li, "PriView: Practical
    Differentially Private Release of Marginal Contingency Tables", SIGMOD 2014, §4.3),
    applied to [RA]'s margins before IPF. With equal noise on every cell, a cell of the A-margin
    summed from margin m adds c_m/c_A noisy cells (c: numbers of cells), so the weights are
    c_A/c_m; margin m is then shifted by (T_A − T_m,A)·c_A/c_m on every cell, spread evenly
    (the least-squares correction of m towards T_A). Subsets are processed from small to
    large, intersections included, so a later step keeps the earlier ones (PriView, Thm. 3).
    Cells may become negative; :func:`postprocess` clamps them.
    """
    out = {m: np.asarray(t, float).copy() for m, t in margins.items()}
    sets = {frozenset()}
    frontier = {frozenset(m) for m in out}
    while frontier:  # every intersection of margins (closed under intersection)
        new = {a & b for a in frontier | sets for b in map(frozenset, out)} - sets - frontier
        sets |= frontier
        frontier = {s for s in new if s}
        sets |= {s for s in new if not s}
    for subset in sorted(sets, key=lambda s: (len(s), sorted(s))):
        keep = tuple(sorted(subset))
        holders = [m for m in out if subset <= set(m)]
        if len(holders) < 2 and subset:
            continue
        parts = [_marginal(out[m], m, keep) for m in holders]
        cells_a = max(1, int(np.prod(parts[0].shape)) if keep else 1)
        ratios = [out[m].size / cells_a for m in holders]  # c_m / c_A
        weights = np.array([1 / r for r in ratios])
        target = sum(w * p for w, p in zip(weights, parts, strict=True)) / weights.sum()
        for m, part, ratio in zip(holders, parts, ratios, strict=True):
            shift = (target - part) / ratio
            shape = [out[m].shape[i] if a in subset else 1 for i, a in enumerate(m)]
            out[m] = out[m] + np.reshape(shift, shape)
    return out


def postprocess(
    margin: np.ndarray, total: float, *, prior: float = 1.0, zeros: np.ndarray | None = None
) -> np.ndarray:
    """[RA]'s post-processing of one noisy margin: ``prior`` spread evenly over the cells that
    are not structural zeros, every such cell at least 1e-6, rescaled to ``total``; structural
    zeros stay 0."""
    out = np.asarray(margin, float).copy()
    free = np.ones(out.shape, bool) if zeros is None else ~zeros
    if not free.any():
        raise SynthesisError("every cell of a margin is a structural zero; drop some zeros")
    out[free] += prior / free.sum()
    out[free] = np.maximum(out[free], FLOOR)
    out[~free] = 0.0
    return out * (total / out.sum())


def ipf(
    margins: Mapping[Margin, np.ndarray],
    shape: Sequence[int],
    *,
    zeros: np.ndarray | None = None,
    tol: float = TOL,
    max_iterations: int = MAX_ITERATIONS,
) -> tuple[np.ndarray, dict]:
    """Fit a table of ``shape`` to ``margins`` by iterative proportional fitting.

    [RA] step 3 (mipfp::Ipfp, as synthpop calls it): start from ones (zeros at structural
    zeros), then per iteration scale the table to each margin in turn, ``x <- x·target/current``
    (0 where the current margin is 0); stop when the largest absolute change of a cell in one
    iteration is below ``tol``, or after ``max_iterations``. Returns the fit and a report:
    iterations, converged, the last change and the largest gap left to any margin.
    """
    fit = np.ones(tuple(shape), float)
    if zeros is not None:
        fit[zeros] = 0.0
    order = list(margins)
    change = np.inf
    iterations = 0
    while iterations < max_iterations:
        before = fit.copy()
        for m in order:
            axes = tuple(a for a in range(fit.ndim) if a not in m)
            current = fit.sum(axis=axes, keepdims=True)
            target = np.expand_dims(np.asarray(margins[m], float), axes)
            with np.errstate(divide="ignore", invalid="ignore"):
                factor = np.where(current > 0, target / current, 0.0)
            fit *= factor
        iterations += 1
        change = float(np.abs(fit - before).max())
        if change < tol:
            break
    gap = max(
        float(np.abs(fit.sum(axis=tuple(a for a in range(fit.ndim) if a not in m)) - t).max())
        for m, t in margins.items()
    )
    report = {"iterations": iterations, "converged": bool(change < tol), "last_change": change,
              "largest_margin_gap": gap, "tol": tol}  # fmt: skip
    return fit, report


def sample_records(table: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` records (rows of level codes, one column per variable) drawn by one multinomial
    draw from the table's cell probabilities ([RA] step 5), in random order."""
    p = np.asarray(table, float).ravel()
    total = p.sum()
    if not np.isfinite(total) or total <= 0:
        raise SynthesisError("the fitted table is empty; nothing can be sampled")
    counts = rng.multinomial(int(n), p / total)
    cells = np.repeat(np.arange(p.size), counts)
    rng.shuffle(cells)
    return (
        np.stack(np.unravel_index(cells, table.shape), axis=1)
        if cells.size
        else np.zeros((0, table.ndim), np.int64)
    )


def synthesize_dp_ipf(
    margins: Mapping[Margin, np.ndarray],
    *,
    shape: Sequence[int],
    rng: np.random.Generator,
    n: int | None = None,
    zeros: Sequence[Zero] = (),
    prior: float = 1.0,
    project: bool = True,
    strata: int | None = None,
    tol: float = TOL,
    max_iterations: int = MAX_ITERATIONS,
) -> tuple[np.ndarray, dict]:
    """Records (level codes) from noisy ``margins`` of the table of ``shape``: consistency
    projection (``project``), prior, clamp and rescale, IPF, multinomial draw of ``n`` records
    (default: the estimated total).

    With ``strata`` (the position of the stratum variable, which every margin holds) each
    stratum is fitted on its own ([RA]: per-area synthesis; the strata are disjoint, so this is
    parallel composition) and gets records in proportion to its estimated total.
    """
    projected = consistent(margins) if project else {m: np.asarray(t, float) for m, t in
                                                       margins.items()}  # fmt: skip
    totals = [float(t.sum()) for t in projected.values()]
    sizes = [np.asarray(t).size for t in projected.values()]
    weights = 1 / np.asarray(sizes, float)  # var(total of m) = c_m·σ²
    estimated = max(float(np.dot(weights, totals) / weights.sum()), 0.0)
    n = int(round(estimated)) if n is None else int(n)
    if strata is None:
        groups = [(None, projected, list(shape))]
    else:
        inner = [s for a, s in enumerate(shape) if a != strata]
        groups = [
            (level, {_drop(m, strata): np.take(t, level, axis=m.index(strata))
                     for m, t in projected.items()}, inner)
            for level in range(shape[strata])
        ]  # fmt: skip
    fitted, reports = [], []
    for level, group, inner_shape in groups:
        held = _zeros_of(zeros, strata, level)
        total = estimated if level is None else float(np.mean([t.sum() for t in group.values()]))
        total = max(total, FLOOR)
        targets = {
            axes: postprocess(t, total, prior=prior, zeros=zero_mask(inner_shape, held, axes))
            for axes, t in group.items()
        }
        fit, report = ipf(targets, inner_shape, zeros=zero_mask(inner_shape, held), tol=tol,
                          max_iterations=max_iterations)  # fmt: skip
        fitted.append(fit)
        reports.append(report if level is None else {"stratum": level, **report})
    if strata is None:
        codes = sample_records(fitted[0], n, rng)
    else:
        shares = np.array([f.sum() for f in fitted])
        per = rng.multinomial(n, shares / shares.sum()) if shares.sum() > 0 else [0] * len(fitted)
        parts = []
        for level, (fit, k) in enumerate(zip(fitted, per, strict=True)):
            inner_codes = sample_records(fit, int(k), rng) if k else np.zeros(
                (0, len(shape) - 1), np.int64)  # fmt: skip
            parts.append(np.insert(inner_codes, strata, level, axis=1))
        codes = np.concatenate(parts)
        rng.shuffle(codes)
    details = {
        "estimated_total": estimated,
        "records": int(len(codes)),
        "consistency_projection": bool(project),
        "prior": prior,
        "ipf": reports if strata is not None else reports[0],
    }
    return codes, details


def synthesize_dp_catall(
    table: np.ndarray,
    *,
    rng: np.random.Generator,
    n: int | None = None,
    zeros: Sequence[Zero] = (),
    prior: float = 1.0,
) -> tuple[np.ndarray, dict]:
    """Records (level codes) from the noisy full table ([RA] §C.2): prior, clamp, rescale to
    the noisy total, multinomial draw of ``n`` records (default: the noisy total)."""
    estimated = max(float(np.sum(table)), 0.0)
    n = int(round(estimated)) if n is None else int(n)
    mask = zero_mask(table.shape, zeros)
    fitted = postprocess(table, max(estimated, FLOOR), prior=prior, zeros=mask)
    codes = sample_records(fitted, n, rng)
    return codes, {"estimated_total": estimated, "records": int(len(codes)), "prior": prior}


def _drop(margin: Margin, strata: int) -> Margin:
    """The margin's variables without the stratum, renumbered as in the per-stratum table."""
    return tuple(a - (a > strata) for a in margin if a != strata)


def _zeros_of(zeros: Sequence[Zero], strata: int | None, level: int | None) -> list[dict]:
    """The structural zeros that hold in one stratum, on the per-stratum variable numbering."""
    if strata is None:
        return [dict(z) for z in zeros]
    out = []
    for zero in zeros:
        if strata in zero and zero[strata] != level:
            continue
        out.append({a - (a > strata): v for a, v in zero.items() if a != strata})
    return out
