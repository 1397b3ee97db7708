"""Sequential CART synthesis (synthpop's default method) with Bale & Quick's tuning and
inference-prevention steps.

The joint distribution is factorised along a *visit sequence* (Reiter 2005; Nowok, Raab &
Dibben 2016, synthpop ``syn(method="cart")``)::

    f(x1, ..., xp) = f(x1) · f(x2 | x1) · ... · f(xp | x1..x(p-1))

The first variable is drawn from its marginal; each next variable from a classification or
regression tree fitted on the original records with the variables already synthesised as
predictors: a synthetic record is dropped down the tree and takes the value of a random *donor*,
an original record of the same leaf. ``min_leaf`` (rpart's ``minbucket``, scikit-learn's
``min_samples_leaf``) is the privacy knob: the smaller, the closer to the data.

How donors are drawn (``draw``): ``"random"`` (default, synthpop) uniformly with replacement,
the first variable too (synthpop's ``syn.sample``: ``sample(y, size = xp, replace = TRUE)``;
``syn.cart`` samples a leaf's donors with replacement); ``"bayes"`` from a Bayesian bootstrap
of the leaf (Bale & Quick 2023, §3.3: the donors are first resampled with Dirichlet(1, ..., 1)
weights, and the first variable's records likewise); ``"balanced"`` (opt-in) without
replacement as long as the leaf's donors last: each leaf's synthetic records take its donors in
a random order, cycling. Every draw has the distribution of a uniform donor either way, but
with replacement the synthetic counts carry multinomial noise, so no marginal or cell is the
original's by construction (one may be by chance). Balanced draws remove that noise, which
lifts the fidelity scores (``benchmarks/synth``), and with it the protection of the counts: with
as many synthetic records as originals the first variable's marginal is the original's
exactly, and so is a leaf's table whenever its synthetic size equals its donors (red team s39c:
``sex, municipality, income`` of the persons demo gave all 350 municipality x sex cells, the 74
the suppression pattern hides among them). ``sqlsdc.jobs.synthesis_files.EXACT_DRAWS`` names the
draws whose files the synthesis job checks as exact ones.

Missing values: a categorical variable keeps NaN as a category of its own; a numeric variable
with NaN (or the special codes given in ``special_values``, synthpop's ``cont.na``) is synthesised
in two steps as synthpop does: first its *state* (value / NaN / each special code) as a
categorical variable, then the value itself for the records whose state is "value", from a tree
fitted on the original records that have a value.

Trees are scikit-learn's (CART with Gini or squared-error splits), grown as synthpop asks rpart:
``minbucket = min_leaf``, ``cp = 1e-8`` (no pruning to speak of), and so rpart.control's
``minsplit = 3 · minbucket`` (a node of fewer records is not split) and ``maxdepth = 30``.
Categorical predictors are integer codes ordered by the mean of the response in each category
(Breiman et al. 1984, §9.4: for a numeric or binary response this ordering gives the optimal
subset split, which is what rpart searches).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

from sqlsdc.errors import SynthesisError
from sqlsdc.synth.smoothing import SmoothingError, smooth_density

__all__ = [
    "SynthesisError",
    "synthesize_cart",
    "tune_cart",
    "prevent_inference",
    "is_categorical",
]

_VALUE = "__value__"
_NAN = "__nan__"


DRAWS = ("random", "bayes", "balanced")
MAX_LEAF = 1_000_000_000  # the tree library takes a C int; larger is one leaf anyway
RPART_MAX_DEPTH = 30  # rpart.control's maxdepth (its largest)


def is_categorical(column: pd.Series) -> bool:
    """True for columns synthesised as categories: strings, categories and booleans."""
    return not pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column)


def synthesize_cart(
    data: pd.DataFrame,
    *,
    rng: np.random.Generator,
    n: int | None = None,
    min_leaf: int | Mapping[str, int] = 5,
    visit_sequence: Sequence[str] | None = None,
    draw: str = "random",
    smoothing: bool | Sequence[str] = False,
    special_values: Mapping[str, Sequence[float]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Synthetic records drawn by sequential CART.

    Args:
        data: the original records.
        rng: the generator of every random draw (same generator state, same records).
        n: number of synthetic records (default ``len(data)``).
        min_leaf: minimum number of original records in a leaf, for all variables or per
            variable (a mapping; variables not named get 5).
        visit_sequence: order of synthesis (default: the column order).
        draw: how donors are drawn: ``"random"`` (default, synthpop: with replacement),
            ``"bayes"`` (Bale & Quick's Bayesian bootstrap) or ``"balanced"`` (each donor
            once per pass: exact marginals, opt-in), see the module docstring.
        smoothing: Gaussian-kernel smoothing of the values drawn for numeric variables
            (``True``, ``"density"`` or ``"all"`` for all, or the names, as a sequence or a
            comma-separated string), synthpop's ``smoothing="density"``
            (:func:`sqlsdc.synth.smoothing.smooth_density`): the variable's drawn values are
            replaced by N(value, h²) with h the Sheather-Jones bandwidth of those values, except
            a value held by over 70 % of them and a top-coded maximum; results are clipped to
            [min, max + h] of the observed values and rounded to their number of decimals.
            Default off here, as synthpop's, for reference comparisons; the synthesis job
            (:func:`sqlsdc.synth.job.synthesize`) smooths every measure by default
            (:mod:`sqlsdc.synth.measures`). Raises :class:`SmoothingError` (its ``column``
            set) where no bandwidth is found.
        special_values: per numeric variable, codes synthesised as categories apart from the
            values (synthpop's ``cont.na``), e.g. ``{"income": [-8]}``.
        progress: called with ``"cart: income (3 of 8)"`` as each variable starts, so that a
            job on a large table shows it is moving (one variable of a million records takes
            minutes; ``sqlsdc synthesize`` said nothing after "fitting cart": new user s47f).

    Returns:
        ``(records, details)``: the synthetic records with the columns and dtypes of ``data``,
        and a JSON-able dict of the parameters used and the time taken.

    Example:
        >>> frame = pd.DataFrame({"a": [1.0, 2, 3, 4] * 5, "b": list("xxyy") * 5})
        >>> syn, details = synthesize_cart(frame, rng=np.random.default_rng(1), min_leaf=2)
        >>> syn.shape, details["visit_sequence"]
        ((20, 2), ['a', 'b'])
    """
    started = time.perf_counter()
    n = len(data) if n is None else int(n)
    order = list(data.columns if visit_sequence is None else visit_sequence)
    _check(data, n, order, draw, special_values)
    leaves = _leaf_sizes(min_leaf, order)
    smooth = _smoothed(smoothing, order)
    special = {c: list(v) for c, v in (special_values or {}).items()}

    coder = _Coder(data, order, special)
    syn: dict[str, np.ndarray] = {}  # synthetic values, in the coded form of _Coder
    trees = {}
    for position, column in enumerate(order):
        if progress is not None:
            progress(f"cart: {column} ({position + 1} of {len(order)})")
        try:
            for part in coder.parts(column):
                y, keep = coder.response(part)
                target = coder.target_rows(part, syn, n)
                if position == 0:  # the first variable (and its state): from the marginal
                    drawn = _marginal(y[keep], target, rng, draw, part.kind)
                    if column in smooth and part.kind != "category" and target.any():
                        # synthpop's syn.sample smooths the sampled values as syn.cart does
                        drawn[target] = smooth_density(drawn[target], y[keep], rng)
                    syn[part.name] = drawn
                    trees[part.name] = "sample"
                    continue
                predictors = [p.name for c in order[:position] for p in coder.parts(c)]
                if part.kind == "value" and part.state:  # records of the state "value" only
                    predictors.append(part.state)
                drawn, leaves_used = _draw_from_tree(
                    coder, part, y, keep, predictors, syn, target, leaves[column], rng, draw,
                    smooth=column in smooth,
                )  # fmt: skip
                syn[part.name] = drawn
                trees[part.name] = leaves_used
        except SmoothingError as error:  # the job's refusal names the variable
            error.column = column
            raise
    records = coder.decode(syn, n)
    details = {
        "method": "cart",
        "visit_sequence": order,
        "min_leaf": leaves,
        "draw": draw,
        "smoothing": sorted(smooth),
        "special_values": special,
        "leaves": trees,
        "records": n,
        "seconds": round(time.perf_counter() - started, 4),
    }
    return records, details


def _check(data, n, order, draw, special_values) -> None:
    if len(data) == 0:
        raise SynthesisError("no records to synthesise from")
    if n < 0:
        raise SynthesisError(f"n must be >= 0, not {n}")
    missing = sorted(set(order) - set(data.columns))
    extra = sorted(set(data.columns) - set(order))
    if missing or extra or len(set(order)) != len(order):
        raise SynthesisError(
            f"the visit sequence must name every column once: unknown {missing}, left out {extra}"
        )
    if draw not in DRAWS:
        raise SynthesisError(f"draw must be one of {', '.join(DRAWS)}, not {draw!r}")
    for column in special_values or {}:
        if column not in data.columns or is_categorical(data[column]):
            raise SynthesisError(f"special_values: {column!r} is not a numeric column")


def _leaf_sizes(min_leaf, order) -> dict[str, int]:
    sizes = {c: 5 for c in order}
    if isinstance(min_leaf, Mapping):
        unknown = sorted(set(min_leaf) - set(order))
        if unknown:
            raise SynthesisError(f"min_leaf names unknown columns {unknown}")
        sizes.update({c: _leaf_size(v) for c, v in min_leaf.items()})
    else:
        sizes = {c: _leaf_size(min_leaf) for c in order}
    bad = {c: v for c, v in sizes.items() if not 1 <= v <= MAX_LEAF}
    if bad:
        raise SynthesisError(f"min_leaf must be from 1 to {MAX_LEAF:,}: {bad}")
    return sizes


def _leaf_size(value) -> int:
    """A leaf size given as a number or its text ("nan" and 10**20 were a bug report)."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise SynthesisError(f"min_leaf must be a whole number, got {value!r}") from None


class _Part:
    """One synthesised variable: a categorical column, a numeric column's state, or a numeric
    column's values (``state`` names the state part, when the column has one)."""

    def __init__(self, name: str, column: str, kind: str, state: str | None = None):
        self.name, self.column, self.kind, self.state = name, column, kind, state


class _Coder:
    """Codes the original columns into the arrays the trees see, and back.

    Categorical columns become integer codes (NaN a code of its own); a numeric column with
    missing or special values becomes a state code plus float values (NaN where no value)."""

    def __init__(self, data: pd.DataFrame, order: list[str], special: dict[str, list]):
        self.data, self.order = data, order
        self.codes: dict[str, np.ndarray] = {}
        self.levels: dict[str, list] = {}
        self._parts: dict[str, list[_Part]] = {}
        for column in order:
            series = data[column]
            if is_categorical(series):
                codes, levels = pd.factorize(series, use_na_sentinel=False)
                self.codes[column], self.levels[column] = codes.astype(np.int64), list(levels)
                self._parts[column] = [_Part(column, column, "category")]
                continue
            values = series.to_numpy(dtype=float, na_value=np.nan)
            states = np.full(len(values), _VALUE, dtype=object)
            states[np.isnan(values)] = _NAN
            for code in special.get(column, []):
                states[values == code] = code
            self.codes[column] = values
            if (states == _VALUE).all():
                self._parts[column] = [_Part(column, column, "value")]
                continue
            state = f"{column}\x00state"
            codes, levels = pd.factorize(pd.Series(states, dtype=object))
            self.codes[state], self.levels[state] = codes.astype(np.int64), list(levels)
            self._parts[column] = [
                _Part(state, column, "category"),
                _Part(column, column, "value", state),
            ]

    def parts(self, column: str) -> list[_Part]:
        return self._parts[column]

    def response(self, part: _Part) -> tuple[np.ndarray, np.ndarray]:
        """The part's original values and the mask of the records that have one."""
        y = self.codes[part.name]
        if part.kind == "value" and part.state:
            keep = np.asarray(self.levels[part.state], dtype=object)[self.codes[part.state]]
            return y, keep == _VALUE
        return y, np.ones(len(y), dtype=bool)

    def target_rows(self, part: _Part, syn: dict, n: int) -> np.ndarray:
        """Synthetic records that need a value of ``part``."""
        if part.kind == "value" and part.state:
            levels = np.asarray(self.levels[part.state], dtype=object)
            return levels[syn[part.state]] == _VALUE
        return np.ones(n, dtype=bool)

    def is_category(self, name: str) -> bool:
        return name in self.levels

    def decode(self, syn: dict[str, np.ndarray], n: int) -> pd.DataFrame:
        out = {}
        for column in self.order:
            series = self.data[column]
            if is_categorical(series):
                levels = np.asarray(self.levels[column], dtype=object)
                values = pd.Series(levels[syn[column]] if n else [], dtype=object)
                out[column] = values.astype(series.dtype) if n else series.iloc[:0].copy()
                continue
            values = syn[column].astype(float)
            parts = self._parts[column]
            if len(parts) == 2:
                states = np.asarray(self.levels[parts[0].name], dtype=object)[syn[parts[0].name]]
                values = np.where(states == _VALUE, values, np.nan)
                for code in set(states) - {_VALUE, _NAN}:
                    values[states == code] = float(code)
            out[column] = _cast(values, series)
        return pd.DataFrame(out, columns=list(self.data.columns))


def _cast(values: np.ndarray, like: pd.Series) -> pd.Series:
    """``values`` with the dtype of ``like`` (nullable integers where NaN must stay)."""
    dtype = like.dtype
    if pd.api.types.is_integer_dtype(dtype):
        if np.isnan(values).any():
            return pd.Series(values).round().astype("Int64" if dtype.kind in "iu" else dtype)
        return pd.Series(np.round(values)).astype(dtype)
    return pd.Series(values).astype(dtype)


def _marginal(y, target, rng, draw, kind) -> np.ndarray:
    """Draws from the records' values ``y`` for the synthetic records ``target`` (as one leaf
    holding every record); NaN (code 0) for the others."""
    out = np.zeros(len(target), dtype=np.int64) if kind == "category" else np.full(
        len(target), np.nan)  # fmt: skip
    size = int(target.sum())
    if size == 0 or len(y) == 0:
        return out
    out[target] = _donor_draw(y, np.zeros(len(y), np.int64), np.zeros(size, np.int64), rng, draw)
    return out


def _design(coder: _Coder, names: list[str], syn: dict, y, keep, categorical_y):
    """Predictor matrices for the original records (``keep``) and all synthetic records.

    Categorical predictors are coded by the mean response in each category (Breiman's
    ordering); for a categorical response, by the share of its most frequent value."""
    if categorical_y:
        top = np.bincount(y[keep]).argmax()
        response = (y[keep] == top).astype(float)
    else:
        response = y[keep].astype(float)
    original, synthetic = [], []
    for name in names:
        x = coder.codes[name][keep]
        s = syn[name]
        if coder.is_category(name):
            k = len(coder.levels[name])
            total = np.bincount(x, weights=response, minlength=k)
            count = np.bincount(x, minlength=k)
            means = np.where(count > 0, total / np.maximum(count, 1), np.inf)
            rank = np.empty(k)
            rank[np.argsort(means, kind="stable")] = np.arange(k)
            x, s = rank[x], rank[s]
        original.append(x.astype(float))
        synthetic.append(s.astype(float))
    return np.column_stack(original), np.column_stack(synthetic)


def _draw_from_tree(coder, part, y, keep, predictors, syn, target, min_leaf, rng, draw, *,
                    smooth):  # fmt: skip
    """Values of ``part`` for the synthetic records ``target``: each takes the value of a donor
    of its leaf in the tree fitted on the original records."""
    categorical = part.kind == "category"
    n = len(target)
    drawn = np.zeros(n, dtype=np.int64 if categorical else float)
    if not categorical:
        drawn[:] = np.nan
    donors_y = y[keep]
    if len(donors_y) == 0 or not target.any():
        return drawn, 0
    x_orig, x_syn = _design(coder, predictors, syn, y, keep, categorical)
    x_syn = x_syn[target]
    tree_class = DecisionTreeClassifier if categorical else DecisionTreeRegressor
    tree = tree_class(
        min_samples_leaf=min_leaf,
        min_samples_split=min(3 * min_leaf, 2 * MAX_LEAF),  # rpart: minsplit = 3 · minbucket
        max_depth=RPART_MAX_DEPTH,
        random_state=int(rng.integers(2**31)),
    )
    tree.fit(x_orig, donors_y)
    leaf_orig, leaf_syn = tree.apply(x_orig), tree.apply(x_syn)
    values = _donor_draw(donors_y, leaf_orig, leaf_syn, rng, draw)
    if smooth and not categorical:
        values = smooth_density(values, donors_y, rng)
    drawn[target] = values
    return drawn, int(tree.get_n_leaves())


def _donor_draw(donors, leaf_donor, leaf_target, rng, draw) -> np.ndarray:
    """For each target record, the value of a random donor of the same leaf, drawn as ``draw``
    says (module docstring)."""
    order = np.lexsort((rng.random(len(leaf_donor)), leaf_donor))  # by leaf, random within
    sorted_leaves = leaf_donor[order]
    start = np.searchsorted(sorted_leaves, leaf_target, side="left")
    count = np.searchsorted(sorted_leaves, leaf_target, side="right") - start
    if draw == "random":
        pick = start + np.floor(rng.random(len(leaf_target)) * count).astype(np.int64)
        return donors[order[pick]]
    if draw == "balanced":  # the k-th target of a leaf takes the (k mod m)-th donor
        targets = np.lexsort((rng.random(len(leaf_target)), leaf_target))
        sorted_targets = leaf_target[targets]
        rank = np.empty(len(leaf_target), dtype=np.int64)
        rank[targets] = np.arange(len(targets)) - np.searchsorted(sorted_targets, sorted_targets)
        return donors[order[start + rank % count]]
    # Bale & Quick: per leaf, resample its m donors with Dirichlet weights (a multinomial of
    # size m), then draw uniformly from that resample.
    _, first = np.unique(sorted_leaves, return_index=True)
    frequency = np.empty(len(order))
    for leaf_start, leaf_end in zip(first, np.append(first[1:], len(order)), strict=True):
        m = leaf_end - leaf_start
        frequency[leaf_start:leaf_end] = rng.multinomial(m, rng.dirichlet(np.ones(m)))
    cumulative = np.cumsum(frequency)
    before = np.where(start > 0, cumulative[np.maximum(start - 1, 0)], 0.0)
    u = before + rng.random(len(leaf_target)) * (cumulative[start + count - 1] - before)
    pick = np.searchsorted(cumulative, u, side="right")
    return donors[order[np.minimum(pick, start + count - 1)]]


def tune_cart(
    data: pd.DataFrame,
    *,
    rng: np.random.Generator,
    candidates: Sequence[int] = (3, 5, 10, 20, 40, 80, 160),
    copies: int = 5,
    per_variable: bool = False,
    degree: int = 1,
    null: str = "two-sample",
    **options,
) -> tuple[dict, dict]:
    """Bale & Quick's tuning job: the minimum leaf size that brings the mean pMSE ratio to 1.

    The objective (Bale & Quick 2023, eq. 24) is f(θ) = (1 − (1/m) Σ_i pMSE_i / E[pMSE])² over
    ``copies`` = m synthetic sets, pMSE from a logistic propensity model on polynomial features
    of degree ``degree`` (the paper: 3) and E[pMSE] the ``null`` expectation (the paper: the
    two-sample null, eq. 18). The paper minimises f by Bayesian optimisation over a box; this is
    the grid search the digest accepts as a first version: a global ``min_leaf`` over
    ``candidates``, then with ``per_variable`` one pass of coordinate search per variable (the
    paper tunes one leaf size per variable).

    Returns:
        ``(best, details)``: the best ``min_leaf`` (a dict per column) and the objective of
        every candidate tried.
    """
    from sqlsdc.synth.utility import propensity_pmse

    tried: list[dict] = []

    def objective(min_leaf) -> float:
        ratios = []
        for _ in range(copies):
            syn, _ = synthesize_cart(data, rng=rng, min_leaf=min_leaf, **options)
            ratios.append(propensity_pmse(data, syn, degree=degree, null=null)["ratio"])
        f = (1.0 - float(np.mean(ratios))) ** 2
        tried.append({"min_leaf": dict(min_leaf), "mean_ratio": float(np.mean(ratios)), "f": f})
        return f

    columns = list(data.columns)
    scores = {b: objective({c: b for c in columns}) for b in candidates}
    best_b = min(scores, key=scores.get)
    best, best_f = {c: best_b for c in columns}, scores[best_b]
    if per_variable:
        for column in columns:
            for b in candidates:
                if b == best[column]:
                    continue
                trial = {**best, column: b}
                f = objective(trial)
                if f < best_f:
                    best, best_f = trial, f
    return best, {"objective": best_f, "tried": tried, "copies": copies, "degree": degree,
                  "null": null}  # fmt: skip


def prevent_inference(
    original: pd.DataFrame,
    synthetic: pd.DataFrame,
    *,
    rng: np.random.Generator,
    target: str,
    continuous: Sequence[str] = (),
    categorical: Sequence[str] = (),
    c: float = 10.0,
    deltas: Sequence[float] = tuple(np.linspace(1e-5, 1.0, 20)),
    components: int = 10,
    batch: int = 10_000,
    max_passes: int = 10,
) -> tuple[pd.DataFrame, dict]:
    """Bale & Quick's inference-prevention step (2023, §4.4) for a binary sensitive ``target``.

    For each original record j (random order) and each δ in ``deltas``, the neighbourhood of
    its quasi-identifiers in the synthetic data (standardised Euclidean distance ≤ δ on
    ``continuous``, equality on ``categorical``) gives p̂ = share with j's target value; when
    p̂ / prior > ``c`` (prior: the original share of that value), ss = ⌈m / (c·prior) − nnum⌉
    decoys are added (m = neighbours with j's value, nnum = neighbourhood size): they copy j's
    categorical quasi-identifiers, take the other target value, and continuous
    quasi-identifiers drawn from the Gaussian-mixture component most responsible for j (a
    mixture of ``components`` fitted on the original continuous quasi-identifiers), keeping the
    ss draws nearest to j within δ. Passes repeat until no record violates the bound (at most
    ``max_passes``). The remaining columns of a decoy are copied from a random synthetic record.

    Caution (digest D.7): decoys sit around real sensitive records and may be a signal of their
    own; the paper measures a pMSE ratio of about 2.5 after this step.

    Returns:
        ``(synthetic with decoys appended, details)``.
    """
    from sqlsdc.synth.disclosure import decoys_needed

    values = original[target].dropna().unique()
    if len(values) != 2:
        raise SynthesisError(f"{target!r} must be binary, it has {len(values)} values")
    prior = original[target].value_counts(normalize=True).to_dict()
    mean = original[list(continuous)].mean().to_numpy(float) if continuous else np.zeros(0)
    sd = original[list(continuous)].std(ddof=0).replace(0, 1).to_numpy(float) if continuous \
        else np.zeros(0)  # fmt: skip
    y_cont = (original[list(continuous)].to_numpy(float) - mean) / sd if continuous else None
    mixture = None
    if continuous:
        from sklearn.mixture import GaussianMixture

        mixture = GaussianMixture(min(components, len(original)), random_state=int(
            rng.integers(2**31))).fit(y_cont)  # fmt: skip
    out = synthetic.reset_index(drop=True)
    added, passes = 0, 0
    for passes in range(1, max_passes + 1):  # noqa: B007 - reported below
        violations = 0
        for j in rng.permutation(len(original)):
            record = original.iloc[j]
            s_j = record[target]
            if pd.isna(s_j):
                continue
            z_cont = (out[list(continuous)].to_numpy(float) - mean) / sd if continuous else None
            same = np.ones(len(out), dtype=bool)
            for column in categorical:
                same &= (out[column] == record[column]).to_numpy()
            distance = (np.sqrt(((z_cont - y_cont[j]) ** 2).sum(axis=1)) if continuous
                        else np.zeros(len(out)))  # fmt: skip
            for delta in deltas:
                near = same & (distance <= delta)
                nnum = int(near.sum())
                if nnum == 0:
                    continue
                m = int((out.loc[near, target] == s_j).sum())
                if (m / nnum) / prior[s_j] <= c:
                    continue
                violations += 1
                ss = decoys_needed(m, nnum, prior[s_j], c)
                decoys = _decoys(out, record, ss, delta, target, values, continuous,
                                 categorical, mixture, y_cont[j] if continuous else None,
                                 mean, sd, rng, batch)  # fmt: skip
                out = pd.concat([out, decoys], ignore_index=True)
                added += len(decoys)
                break  # recompute the neighbourhoods with the decoys
        if violations == 0:
            break
    return out, {"decoys": added, "passes": passes, "c": c, "prior": prior,
                 "converged": violations == 0}  # fmt: skip


def _decoys(out, record, ss, delta, target, values, continuous, categorical, mixture, y_j, mean,
            sd, rng, batch) -> pd.DataFrame:  # fmt: skip
    decoys = out.iloc[rng.integers(0, len(out), size=ss)].copy()
    other = values[0] if record[target] == values[1] else values[1]
    decoys[target] = other
    for column in categorical:
        decoys[column] = record[column]
    if continuous:
        k = int(np.argmax(mixture.predict_proba(y_j[None, :])[0]))
        chosen = np.zeros((0, len(continuous)))
        for _ in range(100):
            draws = rng.multivariate_normal(mixture.means_[k], mixture.covariances_[k], batch)
            d = np.sqrt(((draws - y_j) ** 2).sum(axis=1))
            chosen = np.vstack([chosen, draws[d <= delta]])
            if len(chosen) >= ss:
                break
        if len(chosen) < ss:  # the component hardly reaches j: put the rest on j itself
            chosen = np.vstack([chosen, np.repeat(y_j[None, :], ss - len(chosen), axis=0)])
        d = np.sqrt(((chosen - y_j) ** 2).sum(axis=1))
        chosen = chosen[np.argsort(d)[:ss]] * sd + mean
        for i, column in enumerate(continuous):
            decoys[column] = _cast(chosen[:, i], out[column]).to_numpy()
    return decoys


def _smoothed(smoothing, order: Sequence[str]) -> set[str]:
    """The variables whose drawn values are smoothed (see ``synthesize_cart``)."""
    if smoothing is True or smoothing in ("density", "all"):
        return set(order)
    if smoothing is False or smoothing is None:
        return set()
    names = [c.strip() for c in smoothing.split(",")] if isinstance(smoothing, str) else smoothing
    unknown = sorted(set(names) - set(order))
    if unknown:
        raise SynthesisError(
            f"smoothing names {unknown}, not synthesised variables; use true (all numeric "
            f"variables) or some of {list(order)}"
        )
    return set(names)
