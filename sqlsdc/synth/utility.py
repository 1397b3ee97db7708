"""Utility of synthetic data: how well synthetic records reproduce the original ones.

General measures (the whole distribution):

- table pMSE and its standardised ratio U (Raab 2024, §3; synthpop ``utility.tab``) for two- and
  three-way tables, with the mean and the worst table;
- propensity pMSE (Woo et al. 2009; Snoke et al. 2018), with a logistic model on polynomial
  features or a CART model, and its ratio to the null expectation (S_pMSE): one-sample null
  (synthetic data from a model fitted to the original), two-sample null (two independent samples,
  Bale & Quick 2023, eq. 18) or a permutation null (CART);
- ratio of counts (Taub et al. 2018), marginal distances (KS, total variation, Hellinger);
- the SDMetrics quality score (column shapes and column pair trends, as SDMetrics defines it).

Specific measures: confidence-interval overlap of regression coefficients and standardised
difference (Karr et al. 2006; McClure & Reiter eq. 1; Bale & Quick eq. 28).

Formulas and worked cases: ``shared/reference/seed_synth_papers.md`` (C.4, D.10, T1, T4, T13, T14).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from sqlsdc.synth.cart import is_categorical

__all__ = [
    "table_pmse",
    "table_utility",
    "utility_tables",
    "propensity_pmse",
    "null_pmse",
    "interval_overlap",
    "regression_overlap",
    "ratio_of_counts",
    "marginal_distances",
    "quality_score",
]


def table_pmse(original: Sequence[float], synthetic: Sequence[float]) -> dict:
    """pMSE of one table from its cell counts (Raab 2024, §3; synthpop ``utility.tab``).

    With cc = n_syn / (n_syn + n_orig), over the cells where y + s > 0 (y original, s synthetic
    counts)::

        VW   = Σ (s − y·cc/(1 − cc))² / ((s + y)·cc)        (Voas–Williamson; = Σ (y−s)²/((y+s)/2)
                                                              when both totals are equal)
        df   = #cells with y + s > 0, minus 1
        U    = S_pMSE = VW / df                              (expected 1 when the synthesiser
                                                              reproduces the table)
        pMSE = VW · cc · (1 − cc)² / N                       (the propensity scale; N = total)

    Example (worked case T4):
        >>> r = table_pmse([30, 20, 10, 0], [25, 25, 8, 2])
        >>> round(r["vw"], 6), r["df"], round(r["u"], 6), round(r["pmse"], 6)
        (6.464646, 3, 2.154882, 0.006734)
    """
    y = np.asarray(original, dtype=float).ravel()
    s = np.asarray(synthetic, dtype=float).ravel()
    total = y.sum() + s.sum()
    cc = s.sum() / total
    cells = (y + s) > 0
    y, s = y[cells], s[cells]
    vw = float((((s - y * cc / (1 - cc)) ** 2) / ((s + y) * cc)).sum())
    df = int(cells.sum()) - 1
    return {
        "vw": vw,
        "df": df,
        "u": vw / df if df > 0 else 0.0,
        "pmse": float(vw * cc * (1 - cc) ** 2 / total),
    }


def _groups(original: pd.Series, synthetic: pd.Series, bins: int, max_levels: int):
    """Levels of one variable in both sets: categories as they are (NaN a level), numeric
    variables with more than ``max_levels`` values cut at the original's quantiles into ``bins``
    groups (NaN a group of its own)."""
    if is_categorical(original) or original.nunique() <= max_levels:
        both = pd.concat([original, synthetic], ignore_index=True).astype(object)
        codes, _ = pd.factorize(both.where(both.notna(), "\x00NA"))
        return codes[: len(original)], codes[len(original) :]
    edges = np.unique(np.nanquantile(original.to_numpy(float), np.linspace(0, 1, bins + 1)))
    edges[0], edges[-1] = -np.inf, np.inf

    def cut(x):
        x = x.to_numpy(float, na_value=np.nan)
        return np.where(np.isnan(x), len(edges), np.searchsorted(edges, x, side="left"))

    return cut(original), cut(synthetic)


def table_utility(
    original: pd.DataFrame,
    synthetic: pd.DataFrame,
    columns: Sequence[str],
    *,
    bins: int = 5,
    max_levels: int = 20,
) -> dict:
    """:func:`table_pmse` of the cross-table of ``columns`` in both sets."""
    keys_o, keys_s = [], []
    for column in columns:
        o, s = _groups(original[column], synthetic[column], bins, max_levels)
        keys_o.append(o)
        keys_s.append(s)
    both = pd.DataFrame(
        {i: np.concatenate([o, s]) for i, (o, s) in enumerate(zip(keys_o, keys_s, strict=True))}
    )
    cell = both.groupby(list(both.columns), sort=False).ngroup().to_numpy()
    k = cell.max() + 1 if len(cell) else 0
    y = np.bincount(cell[: len(original)], minlength=k)
    s = np.bincount(cell[len(original) :], minlength=k)
    return table_pmse(y, s)


def utility_tables(
    original: pd.DataFrame,
    synthetic: pd.DataFrame,
    *,
    way: int = 2,
    columns: Sequence[str] | None = None,
    bins: int = 5,
    max_levels: int = 20,
) -> dict:
    """U of every ``way``-way table of ``columns`` (Raab 2024, Tables 2–3): the mean, the worst
    table and each table's U (keyed ``"a × b"``)."""
    columns = list(original.columns if columns is None else columns)
    tables = {
        " × ".join(combo): table_utility(
            original, synthetic, combo, bins=bins, max_levels=max_levels
        )["u"]
        for combo in itertools.combinations(columns, way)
    }
    if not tables:
        return {"way": way, "mean": None, "worst": None, "worst_table": None, "tables": {}}
    worst = max(tables, key=tables.get)
    return {
        "way": way,
        "mean": float(np.mean(list(tables.values()))),
        "worst": tables[worst],
        "worst_table": worst,
        "tables": tables,
    }


def null_pmse(features: int, c: float, n: int, *, null: str = "one-sample") -> float:
    """Expected pMSE of a logistic propensity model with ``features`` = k − 1 regressors under
    the null, with c = n_syn / n and n the total records (Snoke et al. 2018; Bale & Quick 2023,
    eq. 18)::

        one-sample (synthetic from a model fitted to the original): (k − 1)(1 − c)² c / n
        two-sample (two independent samples of one distribution):  2 (k − 1)(1 − c)² c / n

    Example (worked case T13):
        >>> round(null_pmse(55, 0.5, 6712), 7)
        0.0010243
        >>> round(null_pmse(55, 0.5, 6712, null="two-sample"), 7)
        0.0020486
    """
    if null not in ("one-sample", "two-sample"):
        raise ValueError(f"null must be 'one-sample' or 'two-sample', not {null!r}")
    expected = features * (1 - c) ** 2 * c / n
    return 2 * expected if null == "two-sample" else expected


def _features(original: pd.DataFrame, synthetic: pd.DataFrame, degree: int) -> np.ndarray:
    """Standardised numeric columns (NaN: the mean plus a missing indicator) and category
    indicators (first level dropped; NaN a level), expanded to polynomial and interaction terms
    of ``degree`` (no bias); constant and duplicate columns dropped."""
    from sklearn.preprocessing import PolynomialFeatures

    both = pd.concat([original, synthetic], ignore_index=True)
    blocks = []
    for column in both.columns:
        x = both[column]
        if is_categorical(x):
            dummies = pd.get_dummies(x.astype(object).fillna("\x00NA"), drop_first=True)
            blocks.append(dummies.to_numpy(float))
            continue
        values = x.to_numpy(float, na_value=np.nan)
        missing = np.isnan(values)
        if missing.any():
            blocks.append(missing[:, None].astype(float))
            values = np.where(missing, np.nanmean(values), values)
        sd = values.std()
        blocks.append(((values - values.mean()) / (sd if sd > 0 else 1.0))[:, None])
    matrix = np.hstack(blocks) if blocks else np.zeros((len(both), 0))
    if degree > 1:
        matrix = PolynomialFeatures(degree, include_bias=False).fit_transform(matrix)
    matrix = matrix[:, matrix.std(axis=0) > 1e-12]
    _, first = np.unique(np.round(matrix, 12), axis=1, return_index=True)
    return matrix[:, np.sort(first)]


def _pmse(propensity: np.ndarray, c: float) -> float:
    """pMSE = (1/N) Σ (p̂_i − c)² (Bale & Quick 2023, D.10)."""
    return float(np.mean((propensity - c) ** 2))


def _cart_propensity(x: np.ndarray, labels: np.ndarray, seed: int) -> np.ndarray:
    """In-sample propensities of Bale & Quick's CART propensity model (their code:
    min_samples_split 20, min_samples_leaf 7, ccp_alpha 1e-4, max_depth 30)."""
    from sklearn.tree import DecisionTreeClassifier

    tree = DecisionTreeClassifier(
        min_samples_split=20, min_samples_leaf=7, ccp_alpha=1e-4, max_depth=30, random_state=seed
    )
    return tree.fit(x, labels).predict_proba(x)[:, 1]


def propensity_pmse(
    original: pd.DataFrame,
    synthetic: pd.DataFrame,
    *,
    model: str = "logit",
    degree: int = 1,
    null: str | None = None,
    permutations: int = 20,
    rng: np.random.Generator | None = None,
    max_iter: int = 1000,
) -> dict:
    """Propensity-score pMSE and its ratio to the null (S_pMSE).

    The two sets are stacked with a label (1 = synthetic); a propensity model predicts the label
    and pMSE = (1/N) Σ (p̂_i − c)², c = n_syn/N. ``model="logit"``: unpenalised logistic
    regression on the polynomial features of ``degree`` (Bale & Quick use 3); nulls
    ``"one-sample"`` (default) or ``"two-sample"`` in closed form (:func:`null_pmse`), the
    standardised value (pMSE − E)/SD with SD = √(2(k − 1))(1 − c)² c / N (Snoke et al. 2018)
    for the one-sample null. ``model="cart"``: Bale & Quick's CART propensity model, with a
    permutation null (the mean pMSE of ``permutations`` refits on shuffled labels; synthpop's
    ``utility.gen`` does the same).

    Returns:
        ``{"pmse", "expected", "ratio", "standardized", "features", "model", "null",
        "converged"}`` (``converged`` False when the logistic fit stopped at ``max_iter``: with
        many features the two sets may be nearly separable and pMSE is then underestimated).
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    labels = np.r_[np.zeros(len(original)), np.ones(len(synthetic))]
    n = len(labels)
    c = len(synthetic) / n
    if model == "logit":
        null = null or "one-sample"
        x = _features(original, synthetic, degree)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            fit = LogisticRegression(C=np.inf, max_iter=max_iter).fit(x, labels)
        converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
        pmse = _pmse(fit.predict_proba(x)[:, 1], c)
        k1 = x.shape[1]
        expected = null_pmse(k1, c, n, null=null)
        sd = np.sqrt(2 * k1) * (1 - c) ** 2 * c / n if null == "one-sample" else None
    elif model == "cart":
        if null not in (None, "permutation"):
            raise ValueError("the CART propensity model has a permutation null only")
        null = "permutation"
        rng = rng if rng is not None else np.random.default_rng(0)
        x = _tree_features(original, synthetic)
        pmse = _pmse(_cart_propensity(x, labels, 0), c)
        draws = [
            _pmse(_cart_propensity(x, rng.permutation(labels), i), c) for i in range(permutations)
        ]
        expected, sd, k1 = float(np.mean(draws)), float(np.std(draws, ddof=1)), None
        converged = True
    else:
        raise ValueError(f"model must be 'logit' or 'cart', not {model!r}")
    return {
        "pmse": pmse,
        "expected": expected,
        "ratio": pmse / expected if expected > 0 else float("inf"),
        "standardized": (pmse - expected) / sd if sd else None,
        "features": k1,
        "model": model,
        "null": null,
        "converged": converged,
    }


def _tree_features(original: pd.DataFrame, synthetic: pd.DataFrame) -> np.ndarray:
    both = pd.concat([original, synthetic], ignore_index=True)
    columns = []
    for column in both.columns:
        x = both[column]
        if is_categorical(x):
            columns.append(pd.factorize(x.astype(object), use_na_sentinel=False)[0].astype(float))
        else:
            columns.append(x.to_numpy(float, na_value=np.nan))
    return np.column_stack(columns)


def interval_overlap(
    original: tuple[float, float], synthetic: tuple[float, float], *, clip: bool = True
) -> float:
    """Confidence-interval overlap (Karr et al. 2006; McClure & Reiter eq. 1; Bale & Quick
    eq. 28)::

        IO = ½ (U_i − L_i)/(U_d − L_d) + ½ (U_i − L_i)/(U_s − L_s)

    with (L_i, U_i) = (max(L_d, L_s), min(U_d, U_s)). Disjoint intervals give a negative value
    (Bale & Quick's code) or 0 with ``clip`` (McClure & Reiter).

    Example (worked case T1):
        >>> round(interval_overlap((1, 3), (2, 5)), 6), interval_overlap((1, 3), (4, 5), clip=False)
        (0.416667, -0.75)
    """
    (ld, ud), (ls, us) = original, synthetic
    inner = min(ud, us) - max(ld, ls)
    if clip:
        inner = max(inner, 0.0)
    return 0.5 * inner / (ud - ld) + 0.5 * inner / (us - ls)


def _ols(x: np.ndarray, y: np.ndarray):
    """OLS coefficients, standard errors and residual degrees of freedom (intercept first)."""
    design = np.column_stack([np.ones(len(x)), x])
    beta, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ beta
    dof = len(y) - design.shape[1]
    covariance = residual @ residual / dof * np.linalg.pinv(design.T @ design)
    return beta, np.sqrt(np.diag(covariance)), dof


def regression_overlap(
    original: pd.DataFrame,
    synthetic: pd.DataFrame,
    response: str,
    predictors: Sequence[str],
    *,
    level: float = 0.95,
) -> dict:
    """Per OLS coefficient of ``response ~ predictors``: the interval overlap (IO,
    :func:`interval_overlap`, clipped) and the standardised difference SD = |β̂_o − β̂_s| /
    se(β̂_o) (Bale & Quick 2023, §5.3), with t intervals at ``level``; rows with a missing value
    are left out. Categorical predictors enter as indicators (first level dropped)."""
    columns = [response, *predictors]
    o, s = original[columns].dropna(), synthetic[columns].dropna()
    both = pd.get_dummies(pd.concat([o, s])[list(predictors)], drop_first=True, dtype=float)
    names = ["(intercept)", *both.columns]
    x = both.to_numpy(float)
    bo, so, do = _ols(x[: len(o)], o[response].to_numpy(float))
    bs, ss, ds = _ols(x[len(o) :], s[response].to_numpy(float))
    to, ts = stats.t.ppf(0.5 + level / 2, do), stats.t.ppf(0.5 + level / 2, ds)
    out = {}
    for i, name in enumerate(names):
        ci_o = (bo[i] - to * so[i], bo[i] + to * so[i])
        ci_s = (bs[i] - ts * ss[i], bs[i] + ts * ss[i])
        out[name] = {
            "original": float(bo[i]),
            "synthetic": float(bs[i]),
            "io": interval_overlap(ci_o, ci_s) if so[i] > 0 and ss[i] > 0 else None,
            "sd": float(abs(bo[i] - bs[i]) / so[i]) if so[i] > 0 else None,
        }
    return out


def ratio_of_counts(original: Sequence[float], synthetic: Sequence[float]) -> float:
    """Ratio of counts (Taub et al. 2018): the mean over the cells where either proportion is
    positive of min(p_o, p_s) / max(p_o, p_s), with p the cell's share of its table (1 =
    identical tables, 0 = disjoint).

    Example:
        >>> round(ratio_of_counts([2, 2, 0], [1, 3, 0]), 6)
        0.583333
    """
    y = np.asarray(original, dtype=float).ravel()
    s = np.asarray(synthetic, dtype=float).ravel()
    p, q = y / y.sum(), s / s.sum()
    cells = (p + q) > 0
    return float(np.mean(np.minimum(p, q)[cells] / np.maximum(p, q)[cells]))


def _shares(original: pd.Series, synthetic: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    both = pd.concat([original, synthetic], ignore_index=True).astype(object)
    codes, levels = pd.factorize(both.where(both.notna(), "\x00NA"))
    k = len(levels)
    p = np.bincount(codes[: len(original)], minlength=k) / max(len(original), 1)
    q = np.bincount(codes[len(original) :], minlength=k) / max(len(synthetic), 1)
    return p, q


def marginal_distances(original: pd.DataFrame, synthetic: pd.DataFrame) -> dict:
    """Per column: the Kolmogorov–Smirnov statistic (numeric, NaN left out, with both shares
    of NaN), or the total variation distance ½ Σ |p − q| and the Hellinger distance
    √(½ Σ (√p − √q)²) of the category shares (NaN a category)."""
    out = {}
    for column in original.columns:
        o, s = original[column], synthetic[column]
        if is_categorical(o):
            p, q = _shares(o, s)
            out[column] = {
                "tvd": float(0.5 * np.abs(p - q).sum()),
                "hellinger": float(np.sqrt(0.5 * ((np.sqrt(p) - np.sqrt(q)) ** 2).sum())),
            }
        else:
            a, b = o.dropna().to_numpy(float), s.dropna().to_numpy(float)
            ks = _ks(a, b) if len(a) and len(b) else None
            out[column] = {"ks": ks, "missing": [float(o.isna().mean()), float(s.isna().mean())]}
    return out


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov–Smirnov statistic (the p-value is not needed)."""
    return float(stats.ks_2samp(a, b, method="asymp").statistic)


def _bins(original: pd.Series, synthetic: pd.Series, bins: int = 10):
    """SDMetrics' discretisation of a numeric column: 10 equal-width bins of the real values
    (outer edges open), NaN a bin of its own."""
    real = original.dropna().to_numpy(float)
    edges = np.histogram_bin_edges(real, bins=bins) if len(real) else np.array([0.0, 1.0])
    edges[0], edges[-1] = -np.inf, np.inf

    def cut(x: pd.Series):
        values = x.to_numpy(float, na_value=np.nan)
        return pd.Series(np.where(np.isnan(values), -1, np.digitize(values, edges)))

    return cut(original), cut(synthetic)


def quality_score(
    original: pd.DataFrame,
    synthetic: pd.DataFrame,
    *,
    correlation_threshold: float = 0.5,
    association_threshold: float = 0.3,
) -> dict:
    """The SDMetrics quality score of a single table (SDMetrics 0.32 ``QualityReport``).

    - Column Shapes: the mean over columns of KSComplement = 1 − KS statistic (numeric, NaN
      left out) or TVComplement = 1 − ½ Σ |p − q| (categorical, NaN a category).
    - Column Pair Trends: the mean over the pairs *associated in the original* of
      CorrelationSimilarity = 1 − |r_o − r_s| / 2 (Pearson, two numeric columns, rows with NaN
      left out; counted when |r_o| > ``correlation_threshold``) or ContingencySimilarity =
      1 − ½ Σ |p_ab − q_ab| of the normalised contingency tables (numeric columns cut into 10
      equal-width bins of the real data, NaN a category; counted when the original's Cramér's
      V > ``association_threshold``). SDMetrics' defaults are 0.5 and 0.3; 0 and 0 count
      every pair (SDMetrics before 0.2x).
    - Score: the mean of the two properties (Column Shapes alone when no pair is associated).

    Written from SDMetrics' documentation and source so that scores are comparable without the
    package (it detects column types and ids from SDV metadata, which this does not: every
    column is scored); ``benchmarks/synth`` checks it against the package.
    """
    shapes = {}
    for column in original.columns:
        o, s = original[column], synthetic[column]
        if is_categorical(o):
            p, q = _shares(o, s)
            shapes[column] = 1 - 0.5 * float(np.abs(p - q).sum())
        else:
            a, b = o.dropna().to_numpy(float), s.dropna().to_numpy(float)
            shapes[column] = 1 - _ks(a, b) if len(a) and len(b) else 0.0
    pairs, counted = {}, []
    for a, b in itertools.combinations(original.columns, 2):
        oa, ob, sa, sb = original[a], original[b], synthetic[a], synthetic[b]
        name = f"{a} × {b}"
        if not is_categorical(oa) and not is_categorical(ob):
            r_o = _pearson(oa, ob)
            pairs[name] = 1 - abs(r_o - _pearson(sa, sb)) / 2
            if abs(r_o) > correlation_threshold or correlation_threshold <= 0:
                counted.append(name)
            continue
        if not is_categorical(oa):
            oa, sa = _bins(oa, sa)
        if not is_categorical(ob):
            ob, sb = _bins(ob, sb)
        joint_o = oa.astype(str).str.cat(ob.astype(str).to_numpy(), sep="\x00")
        joint_s = sa.astype(str).str.cat(sb.astype(str).to_numpy(), sep="\x00")
        p, q = _shares(joint_o.reset_index(drop=True), joint_s.reset_index(drop=True))
        pairs[name] = 1 - 0.5 * float(np.abs(p - q).sum())
        if association_threshold <= 0 or _cramers_v(oa, ob) > association_threshold:
            counted.append(name)
    shape = float(np.mean(list(shapes.values())))
    trend = float(np.mean([pairs[n] for n in counted])) if counted else None
    return {
        "score": shape if trend is None else (shape + trend) / 2,
        "column_shapes": shape,
        "column_pair_trends": trend,
        "columns": shapes,
        "pairs": pairs,
        "pairs_counted": counted,
    }


def _cramers_v(a: pd.Series, b: pd.Series) -> float:
    """Cramér's V of two columns (NaN a category; 0 for a table with one row or column)."""
    table = pd.crosstab(a.astype(str).to_numpy(), b.astype(str).to_numpy())
    if min(table.shape) < 2:
        return 0.0
    return float(stats.contingency.association(table.to_numpy(), method="cramer"))


def _pearson(a: pd.Series, b: pd.Series) -> float:
    both = pd.DataFrame({"a": a.to_numpy(float, na_value=np.nan),
                         "b": b.to_numpy(float, na_value=np.nan)}).dropna()  # fmt: skip
    if len(both) < 2 or both["a"].std() == 0 or both["b"].std() == 0:
        return 0.0
    return float(np.corrcoef(both["a"], both["b"])[0, 1])
