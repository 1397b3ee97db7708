"""l-diversity of sensitive variables within the key classes (Machanavajjhala, Kifer, Gehrke &
Venkitasubramaniam, "l-Diversity: Privacy Beyond k-Anonymity", ACM TKDD 1(1), 2007).

k-anonymity hides who a record is among k; it does not stop an intruder who learns the class
from learning the sensitive value when the class shares it. Per record, for the class of
records with its key (every key variable equal, a missing value a value of its own, as
sdcMicro's ``ldiversity`` groups them) and each sensitive variable with counts r_1 ≥ r_2 ≥ …
≥ r_m of its values in the class:

* distinct l-diversity: m, the number of distinct values (Definition 4.1's simplest form);
* entropy l-diversity: exp(-Σ p_i ln p_i), p_i = r_i / n (Definition 4.1: the class is entropy
  l-diverse when this is at least l);
* recursive (c, l)-diversity: the largest l with r_1 < c · (r_l + r_(l+1) + … + r_m)
  (Definition 4.2), 1 when no l ≥ 2 qualifies; c = 2 by default, as sdcMicro.

A missing sensitive value counts as one more value for the distinct and entropy measures when
the class has other values (not for the recursive one), as sdcMicro's ``measure_risk`` code
(src/Measure_Risk.h, ``compute_group_ldiversity``) does.

Example (women: a, a, b: 2 distinct values, entropy exp(0.6365) = 1.8899, and not recursive
(2, 2)-diverse since r_1 = 2 is not below 2 · r_2 = 2):
    >>> frame = pd.DataFrame({"sex": list("fffmm"), "disease": list("aabcc")})
    >>> l_diversity(frame, ["sex"], ["disease"]).round(4).values.tolist()[::3]
    [[2.0, 1.8899, 1.0], [1.0, 1.0, 1.0]]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from sqlsdc.errors import MicrodataError

__all__ = ["l_diversity"]


def l_diversity(
    df: pd.DataFrame, keys: Sequence[str], sensitive: Sequence[str], *, c: float = 2.0
) -> pd.DataFrame:
    """Distinct, entropy and recursive (c, l) l-diversity of each record's key class.

    Returns:
        One row per record (indexed like ``df``) with the columns ``<s>_distinct``,
        ``<s>_entropy`` and ``<s>_recursive`` for each sensitive variable ``s``.

    Raises:
        MicrodataError: unknown columns, a sensitive variable among the keys, or c <= 0.
    """
    keys, sensitive = list(keys), list(sensitive)
    missing = [col for col in [*keys, *sensitive] if col not in df.columns]
    if missing or not keys or not sensitive:
        raise MicrodataError(f"l-diversity needs keys and sensitive variables in the data; "
                             f"unknown or none: {missing or 'none given'}")  # fmt: skip
    if set(keys) & set(sensitive):
        raise MicrodataError("a sensitive variable cannot also be a key variable")
    if not c > 0:
        raise MicrodataError(f"the recursive constant c must be positive, got {c}")
    group = df[keys].astype(object).where(df[keys].notna(), "\x00NA")
    cls = group.groupby(keys, sort=False, dropna=False).ngroup().to_numpy()
    out = pd.DataFrame(index=df.index)
    for s in sensitive:
        by_class = df[s].reset_index(drop=True).groupby(cls, sort=False)
        measures = {g: _class_measures(values, c) for g, values in by_class}
        table = np.array([measures[g] for g in cls], dtype=float).reshape(len(df), 3)
        out[f"{s}_distinct"] = table[:, 0]
        out[f"{s}_entropy"] = table[:, 1]
        out[f"{s}_recursive"] = table[:, 2]
    return out


def _class_measures(values: pd.Series, c: float) -> tuple[float, float, float]:
    n = len(values)
    counts = values.dropna().value_counts().to_numpy()
    n_missing = int(values.isna().sum())
    parts = list(counts)
    if n_missing and len(counts):
        parts.append(n_missing)
    p = np.asarray(parts, dtype=float) / n
    entropy = float(np.exp(-(p * np.log(p)).sum())) if len(p) else 1.0
    r = np.sort(counts)[::-1]
    recursive = 1
    tail = c * float(r[1:].sum())
    for j in range(1, len(r)):
        if not tail > r[0]:
            break
        tail -= c * float(r[j])
        recursive += 1
    return float(len(parts)), entropy, float(recursive)
