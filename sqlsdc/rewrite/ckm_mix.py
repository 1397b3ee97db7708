"""The cell key method's keyed mix in SQL (:func:`sqlsdc.mechanisms.ckm.statistic_key`), its
secret constants read from the catalog table ``sqlsdc.ckm_mix`` joined as ``__mix``: the SQL
text names the table, never the constants, so no log, error or plan shows them."""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.mechanisms.ckm import MIX_PRIME, statistic_salt
from sqlsdc.rewrite.sql import cast, number

MIX = "__mix"
CKM_MIX = exp.Table(this=exp.to_identifier("ckm_mix"), db=exp.to_identifier("sqlsdc"))


def join_mix(select: exp.Select) -> None:
    """Append ``LEFT JOIN sqlsdc.ckm_mix AS __mix ON TRUE`` (one row: the rows stay as they
    are) to ``select`` (mutated), once: the unit noise of a sum and the keys of a distinct
    count may both need it in one select (``SUM(age), COUNT(DISTINCT household_id)``)."""
    if not has_mix(select):
        select.append("joins", exp.Join(this=CKM_MIX.copy().as_(MIX), side="LEFT", on=exp.true()))


def has_mix(select: exp.Select) -> bool:
    """Whether ``select`` joins the mix as ``__mix`` already."""
    return any(j.this.alias_or_name == MIX for j in select.args.get("joins") or [])


def statistic_key_sql(cell_key: exp.Expr, name: str) -> exp.Expr:
    """:func:`sqlsdc.mechanisms.ckm.statistic_key` in SQL over a select that joins the mix
    (:func:`join_mix`): integer arithmetic below 2^62."""
    y = keyed_mix_sql(cell_key, name)
    parity = exp.Mod(this=cast(cell_key.copy(), "BIGINT"), expression=number(2))
    return exp.Add(this=exp.Mul(this=number(2), expression=y), expression=parity)


def keyed_mix_sql(value: exp.Expr, name: str) -> exp.Expr:
    """:func:`sqlsdc.mechanisms.ckm.keyed_mix` of ``value`` (an integer below 2^32) salted by
    ``name``, over a select that joins the mix: y in [0, 2^31 − 1), integer arithmetic below
    2^62."""
    p = number(MIX_PRIME)

    def mod(value: exp.Expr) -> exp.Expr:
        return exp.Mod(this=exp.Paren(this=value), expression=p.copy())

    def constant(column: str) -> exp.Expr:
        return exp.column(column, MIX)

    value = cast(value.copy(), "BIGINT")  # below 2^32; BIGINT arithmetic, not HUGEINT
    y = mod(exp.Add(this=value, expression=number(statistic_salt(name))))
    y = mod(exp.Add(this=exp.Mul(this=y, expression=y.copy()), expression=constant("k_square")))
    y = mod(
        exp.Add(
            this=exp.Mul(this=y, expression=constant("k_scale")), expression=constant("k_shift")
        )
    )
    return mod(exp.Add(this=exp.Mul(this=y, expression=y.copy()), expression=constant("k_final")))


def mix_missing() -> exp.Expr:
    """Whether the joined mix has no row (its constants NULL): a fault, never a silent NULL."""
    return exp.Is(this=exp.column("k_square", MIX), expression=exp.null())
