"""Special uniques: minimal sample uniques (MSUs) and SUDA scores (Elliot, Manning & Ford 2002).

A record's *minimal sample unique* is a set of key variables on which its values are unique in
the file while no proper subset of them is. Records unique on few variables, in many ways, are
"special uniques": the likeliest to be population uniques and so to be re-identified.

SUDA score of a record with M key variables, MSUs searched up to size ``max_size`` (≤ M − 1):

    score = Σ over its MSUs S of ∏_{i=|S|}^{max_size} (M − i)

so with ``max_size = M − 1`` an MSU of size k contributes (M − k)!. The contribution of a key
variable is the share of the file's total score carried by the MSUs that contain it. (On
a = (2, 1, 1), b = (0, 3, 0), c = (0, 6, 0): scores 2, 4, 2 and contributions 50, 37.5 and
37.5 %, as sdcMicro's ``suda2`` reports with its original scores.)

The search is exact: every subset of up to ``max_size`` key variables is scanned once (so
2^M subsets for M keys; M is refused above 16), and uniqueness on a subset is monotone, so a
set is minimal exactly when no subset one variable smaller is unique. A missing value is a
value of its own here (unlike :func:`sqlsdc.microdata.risk.frequencies`): SUDA asks what an
intruder can match on, and a suppressed value matches nothing specific.

Example:
    >>> import pandas as pd
    >>> result = suda(pd.DataFrame({"a": [2, 1, 1], "b": [0, 3, 0], "c": [0, 6, 0]}))
    >>> result.scores.tolist(), result.contributions
    ([2.0, 4.0, 2.0], {'a': 50.0, 'b': 37.5, 'c': 37.5})
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from math import prod

import numpy as np
import pandas as pd

from sqlsdc.errors import MicrodataError
from sqlsdc.microdata.groups import unique_rows

__all__ = ["SudaResult", "suda"]

MAX_KEYS = 16


@dataclass(frozen=True)
class SudaResult:
    """MSUs and SUDA scores of a file.

    Attributes:
        keys: the key variables.
        max_size: the largest MSU size searched.
        scores: SUDA score per record (indexed like the data).
        msu_counts: per record, the number of its MSUs of each size (columns ``1..max_size``).
        contributions: per key variable, the percentage of the total score carried by MSUs
            that contain it (they sum to more than 100 when MSUs have several variables).
    """

    keys: tuple[str, ...]
    max_size: int
    scores: pd.Series
    msu_counts: pd.DataFrame
    contributions: dict[str, float]

    def summary(self, top: int = 5) -> dict:
        """JSON-ready figures: records with an MSU, score quantiles, the top contributions."""
        s = self.scores
        return {
            "keys": list(self.keys),
            "max_size": self.max_size,
            "records_with_msu": int((s > 0).sum()),
            "msu_by_size": {str(k): int(v) for k, v in (self.msu_counts > 0).sum().items()},
            "max_score": float(s.max()) if len(s) else 0.0,
            "mean_score": float(s.mean()) if len(s) else 0.0,
            "contributions": dict(sorted(self.contributions.items(), key=lambda kv: -kv[1])[:top]),
        }


def suda(df: pd.DataFrame, keys: Sequence[str] | None = None, *, max_size: int | None = None
         ) -> SudaResult:  # fmt: skip
    """Find every record's MSUs on ``keys`` (default: all columns) up to ``max_size`` variables
    (default M − 1) and score them (see the module docstring).

    Raises:
        MicrodataError: unknown keys, more than 16 keys, or ``max_size`` outside 1..M − 1.
    """
    keys = tuple(df.columns if keys is None else keys)
    missing = [k for k in keys if k not in df.columns]
    if missing or not keys:
        raise MicrodataError(f"key variables {missing or []} not in the data: {list(df.columns)}")
    m = len(keys)
    if m > MAX_KEYS:
        raise MicrodataError(f"SUDA scans all subsets of the keys: use at most {MAX_KEYS}, not {m}")
    top = m - 1 if max_size is None else int(max_size)
    if m == 1:
        top = 1
    elif not 1 <= top <= m - 1:
        raise MicrodataError(f"max_size must lie in 1..{m - 1} for {m} key variables, got {top}")
    codes = np.stack(
        [pd.factorize(df[k].astype("string"), use_na_sentinel=False)[0] for k in keys], axis=1
    ).astype(np.int64)
    n = len(df)
    unique: dict[tuple[int, ...], np.ndarray] = {}
    scores = np.zeros(n)
    counts = np.zeros((n, top), dtype=np.int64)
    carried = np.zeros(m)
    for size in range(1, top + 1):
        weight = float(prod(m - i for i in range(size, top + 1))) if m > 1 else 1.0
        for subset in combinations(range(m), size):
            on = _unique_on(codes[:, subset])
            unique[subset] = on
            minimal = on.copy()
            if size > 1:
                for smaller in combinations(subset, size - 1):
                    minimal &= ~unique[smaller]
            found = int(minimal.sum())
            if found:
                scores[minimal] += weight
                counts[minimal, size - 1] += 1
                carried[list(subset)] += weight * found
        for subset in [s for s in unique if len(s) < size]:
            del unique[subset]  # only the previous size is needed
    total = scores.sum()
    contributions = {
        k: (float(100.0 * carried[j] / total) if total else 0.0) for j, k in enumerate(keys)
    }
    return SudaResult(
        keys=keys,
        max_size=top,
        scores=pd.Series(scores, index=df.index, name="suda"),
        msu_counts=pd.DataFrame(counts, index=df.index, columns=range(1, top + 1)),
        contributions=contributions,
    )


def _unique_on(codes: np.ndarray) -> np.ndarray:
    """Whether each row's combination of ``codes`` (non-negative) occurs exactly once."""
    radix = codes.max(axis=0) + 1
    if float(np.prod(radix.astype(float))) < 2.0**62:
        combined = codes @ np.cumprod(np.r_[1, radix[:-1]]).astype(np.int64)
        inverse = pd.factorize(combined)[0]  # hashed, not sorted: only the counts matter
        freq = np.bincount(inverse)
    else:
        _, inverse, freq = unique_rows(codes)
    return freq[inverse] == 1
