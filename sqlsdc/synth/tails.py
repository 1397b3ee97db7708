"""Top and bottom coding of a numeric column before it is synthesised.

A synthesizer that draws original values (cart's donors) or interpolates between them
(parametric's quantile function) shows the largest original, or converges to it as more rows
are drawn: the largest of 100 times the source's rows of R01 showed its largest income to
0.003 % (parametric) and 0.02 % (cart, smoothed; red team s47i). Coding the ``TAIL`` largest
values to their mean, and the ``TAIL`` smallest to theirs, bounds every synthetic value by an
average of ``TAIL`` originals: top and bottom coding (Hundepool et al., *Statistical
Disclosure Control*, 2012, §3.4; sdcMicro ``topBotCoding`` with the coded values' mean as
``replacement``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from sqlsdc.errors import SynthesisError

__all__ = ["TAIL", "code_tails", "coded_measures", "refuse_few_values"]

TAIL = 5
"""How many of a column's largest (and smallest) values are replaced by their mean."""


def code_tails(values: np.ndarray, tail: int = TAIL) -> np.ndarray:
    """``values`` (in their order, NaN kept) with the ``tail`` largest replaced by their mean
    and the ``tail`` smallest by theirs; fewer than ``2·tail`` values all replaced by their
    mean (one value: itself, so the synthesis job refuses such a column,
    :func:`refuse_few_values`). Ties at a boundary are coded by position.

    Example:
        >>> code_tails(np.array([5.0, 1.0, np.nan, 2.0, 3.0, 4.0, 9.0]), tail=2).tolist()
        [7.0, 1.5, nan, 1.5, 3.0, 4.0, 7.0]
    """
    out = np.asarray(values, dtype=np.float64).copy()
    seen = np.flatnonzero(~np.isnan(out))
    if seen.size == 0:
        return out
    if seen.size < 2 * tail:
        out[seen] = out[seen].mean()
        return out
    order = seen[np.argsort(out[seen], kind="stable")]
    if tail:
        low, high = order[:tail], order[-tail:]
        out[low], out[high] = out[low].mean(), out[high].mean()
    return out


def coded_measures(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """A copy of ``frame`` with each numeric column of ``columns`` tail-coded
    (:func:`code_tails`); integer columns rounded back to integers."""
    out = frame.copy()
    for name in columns:
        column = out[name]
        if not pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column):
            continue
        coded = code_tails(pd.to_numeric(column).to_numpy(dtype=float, na_value=np.nan))
        if pd.api.types.is_integer_dtype(column):
            coded = np.rint(coded)
        out[name] = pd.Series(coded, index=column.index).astype(column.dtype)
    return out


def refuse_few_values(frame: pd.DataFrame, columns: Sequence[str]) -> None:
    """Refuse a column of ``columns`` that ``frame`` holds 1 to ``2·TAIL - 1`` values of.

    :func:`code_tails` replaces such values by their mean, so every synthetic value is that
    mean exactly (cart's smoothing leaves a value most draws hold where it is): a synthesis
    of 5 persons of a municipality showed their mean income to the cent, of one person her
    income, and two syntheses of populations one person apart her income by difference (red
    team s49b). With ``2·TAIL`` values or more each coded value is a mean of ``TAIL``."""
    for name in columns:
        held = int(frame[name].notna().sum())
        if 0 < held < 2 * TAIL:
            raise SynthesisError(
                f"{name} has {held} value(s) in the source, fewer than {2 * TAIL}: its "
                f"{TAIL} largest and {TAIL} smallest values are coded to their means, so every "
                f"synthetic {name} would be the mean of these {held} records exactly (of one "
                f"record, its value). Synthesise a population with {2 * TAIL} values of {name} "
                f"or more, or leave {name} out (--columns)"
            )
