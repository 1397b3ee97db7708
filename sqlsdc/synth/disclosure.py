"""Disclosure risk of synthetic data: what a synthetic release tells about original records.

- Identity disclosure: replicated uniques p0, p1, ru, ru/p1 (Raab 2024, §3; synthpop
  ``replicated.uniques``) and the share of synthetic records identical to an original one.
- Attribute disclosure for chosen keys (quasi-identifiers) and a target: TCAP (Taub et al.
  2018) and DiSCO (Raab, Nowok & Dibben 2024, synthpop ``disclosure``).
- Closeness against a hold-out (Bale & Quick 2023, §2.2, MOSTLY.AI's criteria): IMS, DCR and
  NNDR of the synthetic records compared with those of hold-out records.
- Bale & Quick's attribute-disclosure ratio (2023, eq. 15) and the decoys of their
  inference-prevention step (:func:`sqlsdc.synth.cart.prevent_inference`).

Formulas and worked cases: ``shared/reference/seed_synth_papers.md`` (C.4, D.2, D.3, T5, T10,
T11, T12), including the digest's errata (p0 counts empty cells, ru divides by N).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy.spatial import cKDTree

from sqlsdc.synth.cart import is_categorical

__all__ = [
    "replicated_uniques_counts",
    "replicated_uniques",
    "identical_share",
    "tcap",
    "disco",
    "distance_criteria",
    "holdout_tests",
    "expected_ims",
    "attribute_disclosure_ratio",
    "decoys_needed",
]

_NA = "\x00NA"


def replicated_uniques_counts(original: Sequence[int], synthetic: Sequence[int]) -> dict:
    """Replicated uniques from the cell counts y (original) and s (synthetic) of the full table
    of k cells (Raab 2024, §3, with the digest's errata: p0 counts cells with y = 0, ru divides
    by N)::

        p1 = 100 · #{i : y_i = 1} / N         p0 = 100 · #{i : y_i = 0} / k
        ru = 100 · #{i : s_i = 1, y_i = 1} / N     ru/p1 = 100 · ru / p1

    Example (worked case T5):
        >>> r = replicated_uniques_counts([1, 1, 2, 3, 0], [1, 0, 1, 2, 3])
        >>> round(r["p1"], 2), round(r["ru"], 2), r["ru_of_p1"], r["p0"]
        (28.57, 14.29, 50.0, 20.0)
    """
    y = np.asarray(original)
    s = np.asarray(synthetic)
    n = float(y.sum())
    p1 = 100 * float((y == 1).sum()) / n
    ru = 100 * float(((y == 1) & (s == 1)).sum()) / n
    return {
        "p0": 100 * float((y == 0).sum()) / len(y),
        "p1": p1,
        "ru": ru,
        "ru_of_p1": 100 * ru / p1 if p1 > 0 else None,
    }


def _keys(frame: pd.DataFrame, columns: Sequence[str]) -> pd.Series:
    """One hashable key per record over ``columns`` (NaN equal to NaN)."""
    return pd.Series(
        list(
            zip(
                *(frame[c].astype(object).where(frame[c].notna(), _NA) for c in columns),
                strict=True,
            )
        ),  # fmt: skip
        index=frame.index,
        dtype=object,
    )


def replicated_uniques(
    original: pd.DataFrame, synthetic: pd.DataFrame, columns: Sequence[str] | None = None
) -> dict:
    """:func:`replicated_uniques_counts` of the table of ``columns`` (default all): k is the
    product of the numbers of levels of the original columns (NaN a level), y and s the counts
    of each combination of values."""
    columns = list(original.columns if columns is None else columns)
    y = _keys(original, columns).value_counts()
    s = _keys(synthetic, columns).value_counts().reindex(y.index, fill_value=0)
    k = math.prod(int(original[c].nunique(dropna=False)) for c in columns)
    result = replicated_uniques_counts(y.to_numpy(), s.to_numpy())
    result["p0"] = 100 * (k - len(y)) / k
    result["uniques"] = int((y == 1).sum())
    result["replicated"] = int(((y == 1) & (s == 1)).sum())
    result["columns"] = columns
    return result


def identical_share(
    original: pd.DataFrame, synthetic: pd.DataFrame, columns: Sequence[str] | None = None
) -> float:
    """Share of synthetic records equal on ``columns`` (default all) to some original record.

    Example:
        >>> a = pd.DataFrame({"x": [1, 2], "y": ["a", "b"]})
        >>> identical_share(a, pd.DataFrame({"x": [1, 2, 2], "y": ["a", "a", "b"]}))
        0.6666666666666666
    """
    columns = list(original.columns if columns is None else columns)
    known = set(_keys(original, columns))
    return float(_keys(synthetic, columns).isin(known).mean()) if len(synthetic) else 0.0


def _unanimous(original, synthetic, keys, target):
    """For each original record: whether its key is in the synthetic data with one target
    value only (the synthetic key class is 'disclosive'), and whether that value is its own."""
    syn = pd.DataFrame({"key": _keys(synthetic, keys),
                        "t": synthetic[target].astype(object).where(synthetic[target].notna(),
                                                                    _NA)})  # fmt: skip
    classes = syn.groupby("key")["t"].agg(["nunique", "first"])
    disclosive = classes[classes["nunique"] == 1]["first"]
    own = original[target].astype(object).where(original[target].notna(), _NA)
    guess = _keys(original, keys).map(disclosive)
    matched = guess.notna().to_numpy()
    correct = matched & (guess.to_numpy() == own.to_numpy())
    return matched, correct


def tcap(original: pd.DataFrame, synthetic: pd.DataFrame, keys: Sequence[str], target: str):
    """Targeted correct attribution probability (Taub et al. 2018).

    An intruder who knows an original record's ``keys`` looks up the synthetic records with
    those keys; where they all share one target value (WEAP = 1) the intruder attributes it.
    TCAP is the share of correct attributions among the original records so matched; the
    baseline is the chance of a correct guess from the original marginal, Σ_t p_t².

    Returns:
        ``{"tcap", "baseline", "matched"}`` (``tcap`` None when no record is matched).

    Example:
        >>> o = pd.DataFrame({"k": [1, 1, 2, 3], "t": ["a", "a", "b", "a"]})
        >>> s = pd.DataFrame({"k": [1, 2, 2, 3], "t": ["a", "b", "a", "b"]})
        >>> tcap(o, s, ["k"], "t")
        {'tcap': 0.6666666666666666, 'baseline': 0.625, 'matched': 3}
    """
    matched, correct = _unanimous(original, synthetic, keys, target)
    shares = original[target].astype(object).fillna(_NA).value_counts(normalize=True)
    n = int(matched.sum())
    return {
        "tcap": float(correct.sum() / n) if n else None,
        "baseline": float((shares**2).sum()),
        "matched": n,
    }


def disco(original: pd.DataFrame, synthetic: pd.DataFrame, keys: Sequence[str], target: str):
    """DiSCO (Raab, Nowok & Dibben 2024; synthpop ``disclosure``): the percentage of original
    records whose keys are in the synthetic data with a single target value (Disclosive in
    Synthetic) that is their own (Correct Original); DiSDiO keeps those whose key class is
    also single-valued in the original.

    Example:
        >>> o = pd.DataFrame({"k": [1, 1, 2, 3], "t": ["a", "a", "b", "a"]})
        >>> s = pd.DataFrame({"k": [1, 2, 2, 3], "t": ["a", "b", "a", "b"]})
        >>> disco(o, s, ["k"], "t")
        {'disco': 50.0, 'disdio': 50.0}
    """
    _, correct = _unanimous(original, synthetic, keys, target)
    own = pd.DataFrame({"key": _keys(original, keys),
                        "t": original[target].astype(object).fillna(_NA)})  # fmt: skip
    single = own.groupby("key")["t"].transform("nunique").to_numpy() == 1
    n = len(original)
    return {
        "disco": 100 * float(correct.sum()) / n,
        "disdio": 100 * float((correct & single).sum()) / n,
    }


def distance_criteria(
    reference: np.ndarray, points: np.ndarray, *, delta: float = 0.0, k: int = 5
) -> dict:
    """Closeness of ``points`` to the ``reference`` records (Bale & Quick 2023, §2.2), with
    d1, dk the distances to the nearest and the k-th nearest reference record::

        IMS     = share of points with d1 ≤ δ (identical match share)
        DCR-P5  = 5th percentile of d1
        NNDR-P5 = 5th percentile of d1 / dk (0/0 taken as 1, as in their code)

    Percentiles interpolate linearly (numpy's default).

    Example (worked case T10):
        >>> r = distance_criteria(np.arange(6.0)[:, None], np.array([[0.0], [2.5], [10.0]]))
        >>> round(r["ims"], 4), round(r["dcr_p5"], 4), round(r["nndr_p5"], 4)
        (0.3333, 0.05, 0.02)
    """
    reference = np.asarray(reference, dtype=float)
    points = np.asarray(points, dtype=float)
    k = min(k, len(reference))
    distances, _ = cKDTree(reference).query(points, k=k)
    distances = distances.reshape(len(points), k)
    d1, dk = distances[:, 0], distances[:, -1]
    with np.errstate(invalid="ignore", divide="ignore"):
        nndr = np.where(dk > 0, d1 / dk, 1.0)
    return {
        "ims": float(np.mean(d1 <= delta)),
        "dcr_p5": float(np.percentile(d1, 5)),
        "nndr_p5": float(np.percentile(nndr, 5)),
    }


def _embed(reference: pd.DataFrame, *frames: pd.DataFrame) -> list[np.ndarray]:
    """Numeric columns standardised with the reference's means and SDs (Bale & Quick), NaN at
    the mean plus an indicator; categories one-hot scaled by 1/√2, so that two records that
    differ in one category are at distance 1 (one mismatch counts as one SD)."""
    out = [[] for _ in frames]
    for column in reference.columns:
        x = reference[column]
        if is_categorical(x):
            levels = pd.Index(pd.concat([f[column] for f in (reference, *frames)])
                              .astype(object).fillna(_NA).unique())  # fmt: skip
            for i, f in enumerate(frames):
                codes = levels.get_indexer(f[column].astype(object).fillna(_NA))
                out[i].append(np.eye(len(levels))[codes] / np.sqrt(2))
            continue
        values = x.to_numpy(float, na_value=np.nan)
        mean, sd = np.nanmean(values), np.nanstd(values)
        sd = sd if sd > 0 else 1.0
        for i, f in enumerate(frames):
            v = f[column].to_numpy(float, na_value=np.nan)
            out[i].append(np.where(np.isnan(v), 0.0, (v - mean) / sd)[:, None])
            if np.isnan(values).any():
                out[i].append(np.isnan(v)[:, None].astype(float))
    return [np.hstack(blocks) for blocks in out]


def holdout_tests(
    original: pd.DataFrame,
    holdout: pd.DataFrame,
    synthetic: pd.DataFrame,
    *,
    delta: float = 0.0,
    k: int = 5,
) -> dict:
    """Bale & Quick's three criteria (MOSTLY.AI's): the synthetic records must be no closer to
    the original records than hold-out records (never used for synthesis) are::

        IMS_Z ≤ IMS_H,   DCR-P5_Z ≥ DCR-P5_H,   NNDR-P5_Z ≥ NNDR-P5_H

    Distances: Euclidean on the columns standardised with the original's means and SDs
    (categories one-hot, :func:`_embed`); use ``delta`` = 0 for exact matches.

    Returns:
        ``{"synthetic": {...}, "holdout": {...}, "passed": {"ims", "dcr", "nndr"}}``.
    """
    ref, hold, syn = _embed(original, original, holdout, synthetic)
    z = distance_criteria(ref, syn, delta=delta, k=k)
    h = distance_criteria(ref, hold, delta=delta, k=k)
    return {
        "synthetic": z,
        "holdout": h,
        "passed": {
            "ims": z["ims"] <= h["ims"],
            "dcr": z["dcr_p5"] >= h["dcr_p5"],
            "nndr": z["nndr_p5"] >= h["nndr_p5"],
        },
        "delta": delta,
    }


def expected_ims(cell_probability: float, records: int) -> float:
    """E[IMS] = 1 − (1 − p_C)^N1 for a record drawn from the data's distribution, p_C the
    probability of its cell (Bale & Quick 2023, §2.2; the same for synthetic and hold-out).

    Example (worked case T12):
        >>> round(expected_ims(1 / 1000, 500), 6)
        0.393621
    """
    return 1 - (1 - cell_probability) ** records


def attribute_disclosure_ratio(
    original: pd.DataFrame,
    synthetic: pd.DataFrame,
    *,
    target: str,
    continuous: Sequence[str] = (),
    categorical: Sequence[str] = (),
    delta: float = 0.0,
    prior: dict | None = None,
) -> dict:
    """Bale & Quick's attribute-disclosure measure (2023, eq. 15).

    For original record j, its neighbourhood in the synthetic data holds the records within
    standardised Euclidean distance ``delta`` on ``continuous`` and equal on ``categorical``;
    p̂_j = share of the neighbourhood with j's target value, ratio_j = p̂_j / prior(value), where
    the prior is the original share of the value unless given. An empty neighbourhood gives
    ratio 1 (their code). The criterion is max_j ratio_j ≤ c (c = 10 in the paper).

    Returns:
        ``{"max_ratio", "mean_ratio", "ratios"}`` (per original record, in order).
    """
    prior = prior or original[target].value_counts(normalize=True).to_dict()
    cont = list(continuous)
    mean = original[cont].mean().to_numpy(float)
    sd = original[cont].std(ddof=0).replace(0, 1).to_numpy(float)
    zo = (original[cont].to_numpy(float) - mean) / sd
    zs = (synthetic[cont].to_numpy(float) - mean) / sd
    tree = cKDTree(zs) if cont else None
    if categorical:  # one integer per combination of categorical quasi-identifiers
        codes, _ = pd.factorize(pd.concat([_keys(original, categorical),
                                           _keys(synthetic, categorical)]))  # fmt: skip
        orig_cat, syn_cat = codes[: len(original)], codes[len(original) :]
    else:
        orig_cat = syn_cat = None
    syn_target = synthetic[target].to_numpy()
    ratios = np.ones(len(original))
    for j, value in enumerate(original[target].to_numpy()):
        if pd.isna(value):
            continue
        if tree is not None:
            near = np.zeros(len(synthetic), dtype=bool)
            near[tree.query_ball_point(zo[j], r=delta)] = True
        else:
            near = np.ones(len(synthetic), dtype=bool)
        if syn_cat is not None:
            near &= syn_cat == orig_cat[j]
        nnum = int(near.sum())
        if nnum:
            ratios[j] = (np.sum(syn_target[near] == value) / nnum) / prior[value]
    return {"max_ratio": float(ratios.max()) if len(ratios) else 1.0,
            "mean_ratio": float(ratios.mean()) if len(ratios) else 1.0,
            "ratios": ratios}  # fmt: skip


def decoys_needed(matching: int, neighbours: int, prior: float, c: float) -> int:
    """Decoys to add to a neighbourhood so that its ratio falls to ``c`` (Bale & Quick 2023,
    §4.4): ss = ⌈m / (c · prior) − nnum⌉, m the neighbours with the target's value.

    Example (worked case T11):
        >>> decoys_needed(2, 3, 152 / 9583, 10)
        10
    """
    return max(0, math.ceil(matching / (c * prior) - neighbours))
