"""Anonymisation steps: parsed from ``METHOD:COLUMNS[:NAME=VALUE,...]`` and applied in order.

Steps (``sqlsdc anonymize --step``):

==================  ======================================================================
``microaggregate``  ``microaggregate:income,age:k=5,method=optimal`` (mdav | vmdav | optimal;
                    gamma= for vmdav, block= for partitioned mdav)
``pram``            ``pram:education:p=0.8[,invariant=1]`` — nE(p); invariant: two-stage R
``noise``           ``noise:income:c=0.1`` — correlated noise with covariance c·Σ
``rankswap``        ``rankswap:income:p=5[,top=5,bottom=5]`` — the top and bottom % coded to
                    their means (sdcMicro's defaults; 0: off), the rest swapped within p % of n
``shuffle``         ``shuffle:income,rent[:given=age/household_size]`` — data shuffling
``topcode``         ``topcode:income:upper=200000[,lower=0]``
``recode``          ``recode:age:breaks=18/30/45/65`` — intervals as labels
``suppress``        ``suppress:region,sex,age:k=3[,importance=1/2/3]`` — local suppression
``swap``            ``swap:region:household=household_id,risk=age/sex,similar=size,k=3,rate=0.1``
                    — targeted record swapping of whole households' geography
==================  ======================================================================

Randomised steps draw from a NumPy Philox generator keyed by :func:`generator`: 128 bits of
sqlsdc's keyed PRF (:class:`sqlsdc.mechanisms.prf.KeyedStream`) over the database secret, the
seed and the step's position and text. Same secret, seed, steps and input: same output, whatever
the output is called; without the secret the draws cannot be reproduced.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from difflib import get_close_matches

import numpy as np
import pandas as pd

from sqlsdc.errors import MicrodataError
from sqlsdc.mechanisms.prf import KeyedStream
from sqlsdc.microdata import perturb, pram
from sqlsdc.microdata.microaggregation import microaggregate
from sqlsdc.microdata.perturb import shuffle
from sqlsdc.microdata.swapping import swap_households

__all__ = ["Step", "apply_steps", "exact_columns", "generator", "parse_step"]

PRF_LABEL = "sqlsdc.microdata.v1"


@dataclass(frozen=True)
class Step:
    """One step: a method, the columns it changes and its parameters (as given)."""

    method: str
    columns: tuple[str, ...]
    params: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        params = ",".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.method}:{','.join(self.columns)}" + (f":{params}" if params else "")


def spelt_as(steps: Sequence[Step], columns) -> list[Step]:
    """``steps`` with each column (and shuffle's ``given``) spelt as ``columns`` spell it,
    names matched whatever their case, as DuckDB and the policy match them: a user's own
    table spells ``Turnover``, the policy ``turnover``, and a step naming either must change
    the same column (``turnover`` was "not in the data", new user s48e). A name no column
    has is kept, for :func:`apply_steps` to refuse."""
    spelt = {str(c).lower(): str(c) for c in columns}

    def respell(names):
        return tuple(spelt.get(n.lower(), n) for n in names)

    out = []
    for step in steps:
        params = dict(step.params)
        if "given" in params:
            params["given"] = "/".join(respell([g for g in params["given"].split("/") if g]))
        out.append(Step(step.method, respell(step.columns), params))
    return out


def parse_step(text: str) -> Step:
    """``"pram:education:p=0.8"`` → ``Step("pram", ("education",), {"p": "0.8"})``."""
    method, _, rest = text.strip().partition(":")
    columns, _, params = rest.partition(":")
    if method not in METHODS:
        close = get_close_matches(method, METHODS, n=1)
        guess = f"did you mean {close[0]}? " if close else ""
        raise MicrodataError(
            f"unknown step {method!r}; {guess}use one of {', '.join(sorted(METHODS))}"
        )
    cols = tuple(c.strip() for c in columns.split(",") if c.strip())
    if not cols:
        raise MicrodataError(f"step {text!r} names no column: write {method}:COL1,COL2[:k=v]")
    found: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in params.split(","))):
        name, eq, value = item.partition("=")
        if not eq:
            raise MicrodataError(f"step {text!r}: parameter {item!r} is not NAME=VALUE")
        found[name.strip()] = value.strip()
    allowed = PARAMS[method]
    unknown = sorted(set(found) - set(allowed))
    if unknown:
        raise MicrodataError(
            f"step {method}: unknown parameter(s) {unknown}; it takes {sorted(allowed)}"
        )
    missing = [p for p, required in allowed.items() if required and p not in found]
    if missing:
        raise MicrodataError(f"step {method} needs {', '.join(f'{p}=...' for p in missing)}")
    return Step(method, cols, found)


def generator(secret: bytes, seed: int, position: int, step: Step):
    """A Philox generator keyed by 128 bits of the keyed PRF (see the module docstring)."""
    stream = KeyedStream(secret, PRF_LABEL, int(seed), position, step.text())
    return np.random.Generator(np.random.Philox(key=stream.bits(128)))


def _number(step: Step, name: str, default=None, kind=float):
    if name not in step.params:
        return default
    try:
        value = kind(step.params[name])
    except ValueError:
        value = None
    if value is None or (kind is float and not math.isfinite(value)):  # nan, inf: a bug later
        what = "an int" if kind is int else "a finite number"
        raise MicrodataError(f"step {step.method}: {name}={step.params[name]!r} is not {what}")
    return value


def _list(step: Step, name: str, kind=float) -> list | None:
    if name not in step.params:
        return None
    try:
        values = [kind(v) for v in step.params[name].split("/")]
    except ValueError:
        values = None
    if values is None or (kind is float and not all(map(math.isfinite, values))):
        raise MicrodataError(f"step {step.method}: {name} is a /-separated list of finite numbers")
    return values


def _microaggregate(df, step, rng):
    k = _number(step, "k", kind=int)
    method = step.params.get("method", "mdav")
    result = microaggregate(df, list(step.columns), k, method=method,
                            seed=int(rng.integers(2**31)), gamma=_number(step, "gamma", 0.2),
                            block=_number(step, "block", None, int))  # fmt: skip
    return result.data, {"k": k, "method": method, "il": result.il, "il1s": result.il1s}


def _pram(df, step, rng):
    """PRAM of each column; its log gives the values it changed (``changed``, a missing value
    stays missing and is not counted) of those it could change (``values``), from which
    :mod:`sqlsdc.microdata.negligible` judges whether the column still counts as exact."""
    p = _number(step, "p")
    out, details = df.copy(), {}
    for c in step.columns:
        counts = df[c].dropna().value_counts().sort_index()
        P = pram.matrix_e(p, len(counts))
        if _number(step, "invariant", 0, int):
            P = pram.make_invariant(P, counts.to_numpy())
        out[c] = pram.apply(df[c], P, counts.index, rng)
        details[c] = {"categories": [str(v) for v in counts.index], "matrix": P.round(6).tolist(),
                      "changed": int((df[c].notna() & (out[c] != df[c])).sum()),
                      "values": int(counts.sum())}  # fmt: skip
    return out, details


LEAST_NOISE = 0.01
"""The least noise level c (a noise variance of c times the column's, Oganian & Karr): below,
a noisy value stays nearest its own original. Distance-based record linkage (the share of
records whose nearest original is their own, :func:`sqlsdc.microdata.risk.linkage_rate`) of the
20,000-person demo's weights and incomes: c = 1e-10: 98 % and 88 %; 1e-8: 54 %, 42 %; 1e-6: 7.4
%, 9.3 %; 1e-4: 0.8 %, 1.6 %; 0.01: 0.06 %, 0.18 %; 0.1 (the README's): 0.02 %, 0.07 %."""


def _noise(df, step, rng):
    """Noise on the records complete in the step's columns (missing values stay missing).
    ``c = 0`` is refused: it changes no value, and the file would hold the columns exactly
    while its report and the differencing check take them as perturbed (red team s39c:
    ``noise:income:c=0`` stored every income as it is). So is ``c`` below
    :data:`LEAST_NOISE`: each value moved by a hair, nearest its own original, and the
    column, taken as perturbed, linked two files record by record (red team s49b:
    ``noise:weight:c=1e-10`` beside a file of the exact weight, both released, 14,709 persons
    linked one to one by sex, age band and weight rounded as stored, 301 of them among fewer
    than 10 by the union of the keys, 6 unique)."""
    c = _number(step, "c")
    if c == 0:
        raise MicrodataError(
            f"step {step.text()!r} adds no noise (c = 0): the file would hold "
            f"{', '.join(step.columns)} exactly as perturbed; give c > 0"
        )
    if 0 < c < LEAST_NOISE:
        raise MicrodataError(
            f"step {step.text()!r} adds too little noise to hide a value among its neighbours "
            f"(c = {c:g}, a standard deviation of {c**0.5:.2g} times the column's): nearly every "
            f"noisy value is nearest its own original, and beside a file holding "
            f"{', '.join(step.columns)} exactly it links record by record; give c ≥ "
            f"{LEAST_NOISE:g}"
        )
    least = len(step.columns) + 2  # add_noise leaves fewer records as they are
    out, records = _on_complete_rows(
        df, step, (), lambda x, _s: perturb.add_noise(x, c, rng), least=least
    )
    return out, {"c": c, "records": records}


def _on_complete_rows(df, step, given, compute, *, least):
    """``compute(X, S)`` over the rows complete in the step's columns (X) and ``given`` (S);
    the other rows keep their values. The step's columns become floats. Fewer than ``least``
    complete rows (but some) are refused: the method returns them as they are, and the file
    would hold them exactly as perturbed (red team s47i: ``noise:income:c=1`` over the two
    persons of a municipality stored both incomes as they were)."""
    cols = list(step.columns)
    complete = df[cols + list(given)].notna().all(axis=1).to_numpy()
    if 0 < complete.sum() < least:
        raise MicrodataError(
            f"step {step.text()!r} changes nothing on {int(complete.sum())} record(s) complete "
            f"in its columns: it needs at least {least}; leave the column out of the file or "
            "use a step that does not need them (topcode, recode, suppress)"
        )
    try:  # only the conversion: the step's own errors say more than "needs numeric columns"
        values = df.loc[complete, cols].to_numpy(float)
        givens = df.loc[complete, list(given)].to_numpy(float)
    except (TypeError, ValueError):
        raise MicrodataError(f"step {step.method} needs numeric columns") from None
    result = compute(values, givens)
    out = df.copy()
    for j, c in enumerate(cols):
        column = out[c].to_numpy(dtype=float, na_value=np.nan).copy()
        column[complete] = result[:, j]
        out[c] = column
    return out, int(complete.sum())


LEAST_SWAP = 1
"""The least rank-swapping p (in % of the records). Swapped only with near ranks, a value stays
among so few others that the records of its window sharing its other columns are one: a file
of ``rankswap:weight:p=0.01`` (2 ranks of the demo's 20,000) beside one of the exact weight
linked 9,227 persons one to one by sex, age band and the window (399 among fewer than 10 by
the union of the keys); p = 0.05 (10 ranks): 580 (292); p = 1 (200 ranks): none (red team
s49b)."""


def _rankswap(df, step, rng):
    """Rank swapping of each column. A p that allows no swap is refused: ranks are swapped
    only closer than p·n/100, and at one or less the file would hold the columns exactly as
    perturbed (red team s47i: ``rankswap:income:p=0.001`` on 20,000 persons stored every
    income as it is, as ``noise:income:c=0`` did). So is p below :data:`LEAST_SWAP`: each value
    swapped with a near neighbour links as the exact column would (red team s49b). The ``top``
    and ``bottom`` % of each column are coded to their means first, as sdcMicro's ``rankSwap``
    does by default (5 and 5): a swap keeps every value, the largest ones too (s49d)."""
    p = _number(step, "p")
    if 0 < p and p * len(df) / 100 <= 1:
        raise MicrodataError(
            f"step {step.text()!r} swaps nothing: ranks are swapped only closer than p % of "
            f"the {len(df)} records ({p * len(df) / 100:g} here); give p > {100 / len(df):g}"
        )
    if 0 < p < LEAST_SWAP:
        raise MicrodataError(
            f"step {step.text()!r} swaps each value with a near neighbour only (p = {p:g} %, "
            f"ranks closer than {p * len(df) / 100:g}): beside a file holding "
            f"{', '.join(step.columns)} exactly, the few records of that window that share a "
            f"record's other columns link the two files record by record; give p ≥ {LEAST_SWAP:g}"
        )
    top, bottom = _number(step, "top", 5.0), _number(step, "bottom", 5.0)
    out = df.copy()
    for c in step.columns:
        out[c] = perturb.rank_swap(df[c].to_numpy(), p, rng, top=top, bottom=bottom)
    return out, {"p": p, "top": top, "bottom": bottom}


def _shuffle(df, step, rng):
    given = [c for c in step.params.get("given", "").split("/") if c]
    missing = [c for c in given if c not in df.columns]
    if missing:
        raise MicrodataError(f"step shuffle: given columns {missing} not in the data")
    out, records = _on_complete_rows(df, step, given, lambda x, s: shuffle(x, s, rng), least=3)
    return out, {"given": given, "records": records}


def _topcode(df, step, rng):
    upper, lower = _number(step, "upper"), _number(step, "lower")
    out = df.copy()
    for c in step.columns:
        out[c] = perturb.top_code(df[c], upper=upper, lower=lower)
    return out, {"upper": upper, "lower": lower}


def _recode(df, step, rng):
    breaks = _list(step, "breaks")
    out = df.copy()
    for c in step.columns:
        out[c] = perturb.recode(df[c], breaks)
    return out, {"breaks": breaks}


def _suppress(df, step, rng):
    k = _number(step, "k", kind=int)
    out, counts = perturb.local_suppression(df, step.columns, k, _list(step, "importance", int))
    return out, {"k": k, "suppressed": counts}


def _swap(df, step, rng):
    lists = {name: [c for c in step.params.get(name, "").split("/") if c]
             for name in ("risk", "similar")}  # fmt: skip
    return swap_households(
        df,
        household=step.params["household"],
        geography=list(step.columns),
        risk=lists["risk"],
        similar=lists["similar"],
        k=_number(step, "k", 3, int),
        rate=_number(step, "rate", 0.05),
        rng=rng,
    )


Method = Callable[[pd.DataFrame, Step, np.random.Generator], tuple[pd.DataFrame, dict]]
METHODS: dict[str, Method] = {
    "microaggregate": _microaggregate,
    "pram": _pram,
    "noise": _noise,
    "rankswap": _rankswap,
    "shuffle": _shuffle,
    "topcode": _topcode,
    "recode": _recode,
    "suppress": _suppress,
    "swap": _swap,
}
PARAMS: dict[str, dict[str, bool]] = {  # parameter -> required
    "microaggregate": {"k": True, "method": False, "gamma": False, "block": False},
    "pram": {"p": True, "invariant": False},
    "noise": {"c": True},
    "rankswap": {"p": True, "top": False, "bottom": False},
    "shuffle": {"given": False},
    "topcode": {"upper": False, "lower": False},
    "recode": {"breaks": True},
    "suppress": {"k": True, "importance": False},
    "swap": {"household": True, "risk": False, "similar": False, "k": False, "rate": False},
}


# steps that only coarsen or blank values: every count by their bands is a true count
NON_PERTURBATIVE = frozenset({"recode", "topcode", "suppress"})


def exact_columns(steps: Sequence[Step], columns: Sequence[str]) -> dict[str, tuple[Step, ...]]:
    """The columns of a file made by ``steps`` from records with ``columns`` that no
    perturbative step changed, each with the steps that coarsened it, in order (none: stored
    as it was).

    A file of records releases, as exact counts, every cross-tabulation of such columns over its
    population: recoding, top-coding and local suppression are non-perturbative (the band counts
    of the records are the true band counts; a suppressed value is counted as it was, which errs
    on the safe side, and the file's cell of a blanked column is short of its blanked records,
    which the differencing check compares too), while PRAM, noise, microaggregation, rank
    swapping, shuffling and record swapping change the values the counts are made of. Exact
    tables of the same data are linked to the file like two tables of one population: their
    cells are the file's own cross-tabulations, and differencing one against the other discloses
    what neither shows alone (Hundepool et al., *Statistical Disclosure Control*, Wiley 2012, on
    releasing microdata and tables of the same data; Massell, Zayatz & Funk, PSD 2006, LNCS
    4302, pp. 304-317: tables built from the released microdata are consistent with it, so a
    table of unperturbed columns is exact).

    A perturbative step that changed too few records to matter (:mod:`sqlsdc.microdata.negligible`:
    PRAM keeping 99.99 % of values) is left out of ``steps`` for the columns it left nearly as
    they were by the caller (:func:`sqlsdc.jobs.record_files.file_release`), from its log.
    """
    recipes: dict[str, tuple[Step, ...] | None] = {c: () for c in columns}
    for step in steps:
        for column in step.columns:
            if recipes.get(column) is None:
                continue  # not in the file, or perturbed already
            recipes[column] = recipes[column] + (step,) if step.method in NON_PERTURBATIVE else None
    return {c: r for c, r in recipes.items() if r is not None}


def apply_steps(
    df: pd.DataFrame,
    steps: Sequence[Step],
    *,
    secret: bytes,
    seed: int,
) -> tuple[pd.DataFrame, list[dict]]:
    """Apply ``steps`` in order; return the data and one record per step (text, details)."""
    out, log = df, []
    for position, step in enumerate(steps):
        missing = [c for c in step.columns if c not in out.columns]
        if missing:
            raise MicrodataError(
                f"step {step.text()!r}: columns {', '.join(missing)} not in the data; "
                f"available: {', '.join(map(str, out.columns))}"
            )
        rng = generator(secret, seed, position, step)
        out, details = METHODS[step.method](out, step, rng)
        log.append({"step": step.text(), **details})
    return out, log
