"""Records grouped by their combination of key codes, by hashing rather than sorting rows.

``np.unique(codes, axis=0, return_inverse=True, return_counts=True)`` sorts the rows (an
argsort per call): the risk report called it 32 times on 1,000,000 records (risk before and
after, SUDA's 30 subsets of five keys), about 1 s of CPU each (session 47's new-user test,
``sqlsdc anonymize`` of the 1,000,000-person demo). Where the combinations fit one 64-bit
number, :func:`unique_rows` packs each row into one, hashes those (``pandas.factorize``) and
sorts only the distinct ones: the same three arrays, in the same order.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def unique_rows(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(combinations, inverse, counts)`` of the rows of the integer matrix ``codes``, as
    ``np.unique(codes, axis=0, return_inverse=True, return_counts=True)`` returns them:
    distinct rows in lexicographic order, each row's index among them (1-D), their counts."""
    codes = np.asarray(codes, dtype=np.int64)
    if codes.ndim != 2 or not codes.size:
        combos, inverse, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
        return combos, inverse.ravel(), counts
    low = codes.min(axis=0)
    radix = codes.max(axis=0) - low + 1
    if float(np.prod(radix.astype(float))) >= 2.0**62:  # does not pack: sort the rows
        combos, inverse, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
        return combos, inverse.ravel(), counts
    # the first column most significant: packed order is the rows' lexicographic order
    place = np.r_[np.cumprod(radix[::-1])[::-1][1:], 1].astype(np.int64)
    packed = (codes - low) @ place
    inverse, distinct = pd.factorize(packed, sort=True)
    counts = np.bincount(inverse, minlength=len(distinct)).astype(np.int64)
    combos = (np.asarray(distinct)[:, None] // place) % radix + low
    return combos.astype(codes.dtype), inverse.astype(np.intp), counts
