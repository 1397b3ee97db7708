"""Targeted record swapping of households (TRS), as in the 2021 census round (digest 2022
part 1, §(b); sdcTools' ``recordSwapping``; Eurostat's census guidelines).

Whole households exchange their geography with a partner household in another area. Partners
agree on the *similar* variables (for example household size), so every table that crosses only
similar variables is unchanged, and every household keeps its own members and characteristics;
only where they live moves.

Which households are swapped:

1. Risk: a person is risky when the combination of the geography and the *risk variables* is
   shared by fewer than k persons (k-anonymity at the finest geography level); the risk weight
   of a household is the largest 1/f over its members.
2. Targets: every risky household, in an order drawn without replacement with probability
   proportional to its risk weight (partners may run out for the last ones), then, while the
   targets are fewer than ``ceil(rate × households / 2)``, households drawn uniformly from the
   others. As in sdcMicro's ``recordSwap`` (R/recordSwap.R and its manual @cf32510: "the set of
   records to be swapped is made up of all records which do not fulfil the k-anonymity as well
   as the remaining number of records such that the proportion of swapped records ... is in
   coherence with the swaprate"; "a single swap counts for swapping 2 households";
   src/recordSwap/recordSwap.cpp:304, ``totalDraws = nhid*(swaprate/2)``, and a household of
   risk above 1/k "will definitely be swapped"), the rate counts both households of a swap, and
   a household at risk is swapped whatever the rate.
   Until session 49 the targets were ``ceil(rate × households)`` households, risky ones first:
   a swap moved about twice the stated rate, and the risky households beyond it stayed where
   they were (297 of 447, two thirds, at k = 3 and rate 0.1 in the tests).
3. Partners: for each target in turn, a household drawn uniformly among those not yet swapped
   that agree on the similar variables and live in another area (different value of the
   first geography column); targets without a partner stay where they are and are counted.

All draws come from the given generator (keyed by the database secret in ``sqlsdc
anonymize``). The realised swap rate (swapped households, targets and partners, over all
households) is reported; it exceeds the target when more households are at risk than the rate
covers, as the literature reports (Geyer et al., PSD 2022: 13.2 % for a 10 % target).

sdcMicro allocates the rate to every area of the finest geography and swaps a household at
risk on a coarser level across that level; here the rate is allocated over the whole file and
every partner lives in another area of the first geography column.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import ceil

import numpy as np
import pandas as pd

from sqlsdc.errors import MicrodataError

__all__ = ["swap_households"]


def swap_households(
    df: pd.DataFrame,
    *,
    household: str,
    geography: Sequence[str],
    risk: Sequence[str] = (),
    similar: Sequence[str] = (),
    k: int = 3,
    rate: float = 0.05,
    rng: np.random.Generator,
) -> tuple[pd.DataFrame, dict]:
    """Swap the ``geography`` columns between pairs of households (see the module docstring).

    Returns the swapped records (same index and columns) and a report: households, risky
    households, targets, swapped households, realised rate, targets left without a partner.

    Raises:
        MicrodataError: a column is missing, a household spans several areas or differs on a
            similar variable between its members, k < 1, or the rate is outside (0, 1].
    """
    columns = [household, *geography, *risk, *similar]
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise MicrodataError(f"columns {missing} not in the data; available: {list(df.columns)}")
    if not geography:
        raise MicrodataError("name the geography columns to swap")
    if k < 1 or not 0 < rate <= 1:
        raise MicrodataError(f"need k ≥ 1 and a swap rate in (0, 1]; got k={k}, rate={rate}")
    if df[household].isna().any():
        raise MicrodataError(f"household identifiers in {household!r} are missing for some rows")
    homes = _households(df, household, [*geography, *similar])
    weight = _risk_weights(df, household, geography, risk, k)
    ids = homes.index.to_numpy()
    risky = ids[weight.reindex(ids).to_numpy() > 1.0 / k]
    wanted = min(len(ids), ceil(rate * len(ids) / 2))  # a swap moves two households
    targets = _targets(ids, risky, weight, wanted, rng)
    area = homes[geography[0]].astype("string").fillna("\0missing").to_numpy()
    group = (
        homes.groupby(list(similar), dropna=False, sort=True).ngroup().to_numpy()
        if similar
        else np.zeros(len(homes), dtype=np.int64)
    )
    position = {h: i for i, h in enumerate(ids)}
    taken = np.zeros(len(ids), dtype=bool)
    pairs: list[tuple[int, int]] = []
    unmatched = 0
    by_group = {key: np.flatnonzero(group == key) for key in np.unique(group)}
    for h in targets:
        i = position[h]
        if taken[i]:
            continue
        candidates = by_group[group[i]]
        candidates = candidates[~taken[candidates] & (area[candidates] != area[i])]
        if not len(candidates):
            unmatched += 1
            continue
        j = int(candidates[rng.integers(len(candidates))])
        taken[i] = taken[j] = True
        pairs.append((i, j))
    out = df.copy()
    if pairs:
        new_geo = homes[list(geography)].copy()
        first, second = (np.array(side) for side in zip(*pairs, strict=True))
        new_geo.iloc[first] = homes[list(geography)].iloc[second].to_numpy()
        new_geo.iloc[second] = homes[list(geography)].iloc[first].to_numpy()
        moved = new_geo.reindex(df[household].to_numpy())
        for c in geography:
            out[c] = moved[c].to_numpy()
            out[c] = out[c].astype(df[c].dtype)
    swapped = 2 * len(pairs)
    return out, {
        "households": int(len(ids)),
        "risky_households": int(len(risky)),
        "targets": int(len(targets)),
        "swapped_households": swapped,
        "swapped_records": int(df[household].isin(ids[taken]).sum()),
        "target_rate": float(rate),
        "realised_rate": float(swapped / len(ids)) if len(ids) else 0.0,
        "without_partner": unmatched,
    }


def _households(df: pd.DataFrame, household: str, constant: list[str]) -> pd.DataFrame:
    """One row per household with its geography and similar variables, which must not vary
    between its members."""
    per_household = df.groupby(household, sort=True)
    varying = [c for c in constant if (per_household[c].nunique(dropna=False) > 1).any()]
    if varying:
        raise MicrodataError(
            f"members of a household differ on {varying}: geography and similar variables must "
            "be household characteristics"
        )
    return per_household[constant].first()


def _risk_weights(df, household, geography, risk, k) -> pd.Series:
    """Per household, the largest 1/f over its members, f the count of persons sharing the
    member's geography and risk variables."""
    keys = [*geography, *risk]
    f = df.groupby(keys, dropna=False)[household].transform("size")
    return (1.0 / f).groupby(df[household]).max()


def _targets(ids, risky, weight, wanted, rng) -> list:
    """Every risky household, ordered by a draw ∝ risk weight without replacement, then others
    uniformly up to ``wanted`` targets."""
    chosen: list = []
    if len(risky):
        w = weight.reindex(risky).to_numpy(float)
        chosen = list(rng.choice(risky, size=len(risky), replace=False, p=w / w.sum()))
    if len(chosen) < wanted:
        others = np.setdiff1d(ids, risky)
        extra = rng.choice(others, size=min(len(others), wanted - len(chosen)), replace=False)
        chosen.extend(extra.tolist())
    return chosen
