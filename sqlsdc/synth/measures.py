"""Which synthesised variables are confidential magnitudes, and cart's smoothing of them.

Sequential CART draws each synthetic value of a numeric variable from an original donor of its
leaf, so without smoothing every synthetic income is an original one: of the 203 persons of
R01 (CLI demo) unique by sex, age, education and occupation whose key shows one synthetic
income, 27 saw their own to the cent (red team s47i); with synthpop's ``smoothing =
"density"`` (:mod:`sqlsdc.synth.smoothing`), 1. So the synthesis job smooths, by default, every
variable whose values come from a column the policy declares a ``measure`` (traced through the
``--sql`` query with sqlglot's column lineage, as the anonymisation job traces identifiers).
An admin may still leave a measure out (``--option smoothing=false`` or a list without it):
the job then warns, and its report and audit entry name the measures whose synthetic values are
original values. The library function :func:`sqlsdc.synth.cart.synthesize_cart` keeps
synthpop's default (no smoothing) for reference comparisons.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from sqlglot import exp

from sqlsdc.engines import duckdb_schema
from sqlsdc.errors import SynthesisError
from sqlsdc.policy import ColumnRole

__all__ = [
    "measure_columns",
    "refuse_rare_special_values",
    "smoothing_choice",
    "unsmoothed_warning",
]


CONFIDENTIAL_NUMBERS = (ColumnRole.MEASURE, ColumnRole.WEIGHT)
"""The roles whose values cart smooths and tail-codes. A survey weight is as near unique as an
income (R01's 1,539 persons: 1,521 weights held once), and drawn from donors it told each
donor: a cart synthesis of R01's sex, age, education, occupation and weight (weight last)
stored 5,000 original weights, and the 4,945 held by one person showed her sex in 96 % of
them (chance 50 %), her occupation in 68 % (30 %), her exact age in 36 % (1 %), all four in
24 % (red team s49b), to anyone holding her weight (a released file of exact weights)."""


def measure_columns(con, policy, definition: str, frame: pd.DataFrame) -> list[str]:
    """The numeric columns of ``frame`` (read with ``definition``) computed from a ``measure``
    or ``weight`` column (:data:`CONFIDENTIAL_NUMBERS`) of a confidential table of the
    policy. A numeric column whose lineage cannot be traced counts as a measure (fail closed:
    it is smoothed).

    A column of another type computed from a measure (``CAST(income AS VARCHAR)``, a date or an
    interval made of it) is refused: cart draws it as a category, so each synthetic value is an
    original one, and smoothing (a density on numbers) cannot move it (red team s47o: 21 of
    the 217 unique persons of R01 saw their own income, without the unsmoothed warning). A
    non-numeric column whose lineage cannot be traced is refused for the same reason; either
    passes when every value it shows is shared by :data:`SHARED` records or more (a band)."""
    from sqlglot.lineage import lineage
    from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

    numeric = [c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])
               and not pd.api.types.is_bool_dtype(frame[c])]  # fmt: skip
    measures = {(t.name.lower(), c.name.lower()) for t in policy.confidential_tables
                for c in t.columns.values() if c.role in CONFIDENTIAL_NUMBERS}  # fmt: skip
    schema = {t: cols for t, cols in duckdb_schema.table_schemas(con).items() if policy.table(t)}
    try:
        roots = lineage(None, definition, schema=schema, dialect="duckdb")
    except Exception:  # noqa: BLE001 - not traced: every numeric column is smoothed
        roots = None
    out = []
    for column in frame.columns:
        key = normalize_identifiers(exp.to_identifier(column), dialect="duckdb").name
        root = None if roots is None else roots.get(key)
        if root is None:
            traced = False  # unknown: a measure if numeric, refused otherwise
        else:
            traced = any(
                isinstance(node.source, exp.Table)
                and isinstance(node.expression, exp.Table)
                and (node.source.name.lower(), node.name.split(".")[-1].lower()) in measures
                for node in root.walk()
            )
        if column in numeric:
            if root is None or traced:
                out.append(column)
        elif (root is None or traced) and _rare_values(frame[column]):
            raise SynthesisError(_not_a_number(column, traced))
    return out


SHARED = 3  # a category of a measure every value of which this many records show is a band


def _rare_values(values: pd.Series) -> bool:
    """Whether some value of ``values`` is shown by fewer than :data:`SHARED` records: an
    exact magnitude as text, not a band (``CASE WHEN income > 50000 THEN 'high' ...``), whose
    draws from donors tell no one's value."""
    counts = values.dropna().astype(str).value_counts()
    return bool(len(counts)) and int(counts.min()) < SHARED


def _not_a_number(column: str, traced: bool) -> str:
    """The refusal of a non-numeric column that is, or may be, a measure."""
    why = ("is computed from a policy measure" if traced
           else "cannot be traced to its source columns")  # fmt: skip
    return (
        f"cart cannot synthesise {column}: it {why} but is not a number, so cart would draw it "
        f"as a category and each synthetic value would be an original one (smoothing moves "
        f"numbers only), and some of its values are shown by fewer than {SHARED} records. Select "
        f"the measure as a number (no cast to text, date or interval), band it, name every "
        f"selected expression with AS, or leave {column} out (--columns)"
    )


def smoothing_choice(
    options: Mapping[str, object] | None, measures: Sequence[str], columns: Sequence[str]
) -> tuple[dict, list[str]]:
    """cart's options with ``smoothing`` defaulting to ``measures``, and the measures the
    options leave unsmoothed (their synthetic values are original values)."""
    from sqlsdc.synth.cart import _smoothed

    options = dict(options or {})
    if "smoothing" not in options:
        if measures:
            options["smoothing"] = list(measures)
        return options, []
    value = options["smoothing"]
    if not isinstance(value, bool | str | list | tuple) and value is not None:
        raise SynthesisError(f"smoothing={value!r}: write true, false, density or column names")
    smoothed = _smoothed(value, list(columns))
    return options, [m for m in measures if m not in smoothed]


def refuse_rare_special_values(
    options: Mapping[str, object] | None, measures: Sequence[str], frame: pd.DataFrame
) -> None:
    """Refuse a ``special_values`` code of a measure that fewer than :data:`SHARED` records of
    ``frame`` hold. cart synthesises a special code as a state (a category), drawn exactly and
    never smoothed: a code of 3 records or more is a band every record of which is shared, but
    a rarer one is that person's value shown to the cent (red team s47o: R01's largest income,
    706,147.09, given as a special value of income, appeared exactly in the synthetic file with
    no warning and no ``unsmoothed_measures``). A code no record holds is never drawn."""
    special = (options or {}).get("special_values") or {}
    if not isinstance(special, Mapping):
        raise SynthesisError("special_values: give a mapping of column to codes")
    for column, codes in special.items():
        if column not in measures or column not in frame:
            continue
        values = frame[column].to_numpy(dtype=float, na_value=np.nan)  # as cart codes them
        for code in codes if isinstance(codes, list | tuple) else [codes]:
            held = int((values == code).sum())
            if 0 < held < SHARED:
                raise SynthesisError(
                    f"special_values: a code of the measure {column} is held by {held} "
                    f"record(s), fewer than {SHARED}: cart draws special codes exactly, never "
                    f"smoothed, so the synthetic file could show that value as it is. Give "
                    f"only codes that {SHARED} records or more hold (e.g. 0 or a missing-value "
                    f"code), or top-code {column} first"
                )


def unsmoothed_warning(unsmoothed: Sequence[str]) -> str:
    """The job's warning when measures are left unsmoothed."""
    names = ", ".join(unsmoothed)
    return (
        f"warning: smoothing leaves out the measure(s) {names}: each of their synthetic values "
        "is an original value of a donor (but the 5 largest and 5 smallest, coded to their "
        "means), and a person unique by the other variables may see "
        "her own; drop --option smoothing (the default smooths every measure) unless this is "
        "intended"
    )
