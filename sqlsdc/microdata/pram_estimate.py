"""Unbiased table estimates from a PRAMmed file (Kooiman, Willenborg & Gouweleeuw 1997; digest
2006 §3): PRAM replaces category i of a variable by j with probability P[i, j], so the expected
observed counts are T* = Pᵀ·T and T̂ = (Pᵀ)⁻¹·T* = Σ_j Q[j, i]·T*_j with Q = P⁻¹ is unbiased.

:func:`corrected_counts` rewrites ``SELECT keys..., v, COUNT(*) FROM out [WHERE ...] GROUP BY
keys..., v`` over a released anonymised output whose column ``v`` was PRAMmed into a query
over the same table that weights each observed count by Q (a ``VALUES`` list of the matrix):
a pure sqlglot rewrite, run through the guard like any query. Estimates can be negative or
non-integer; that is what unbiased means here. The matrix is the one the job stored (rounded to
6 decimals) and must be the last step that changed the column.

Example:
    >>> import numpy as np
    >>> q = np.linalg.inv(np.array([[0.8, 0.2], [0.2, 0.8]]))
    >>> [round(float(x), 6) for x in q.T @ np.array([44.0, 56.0])]
    [40.0, 60.0]
"""

from __future__ import annotations

import numpy as np
import sqlglot
from sqlglot import exp

from sqlsdc.errors import MicrodataError, PolicyViolation

__all__ = ["corrected_counts", "pram_matrices"]


def pram_matrices(report: dict) -> dict[str, tuple[list[str], np.ndarray] | None]:
    """``{column: (categories, P)}`` of the PRAM steps of an anonymisation report whose column
    no later step changed; ``None`` for a column PRAMmed with an *invariant* matrix, which is
    built from the source's confidential frequencies (Tᵀ·R = Tᵀ): an estimate weighted by it
    would give them away exactly (its inverse read back row by row, T its left eigenvector),
    so it is never used."""
    found: dict[str, tuple[list[str], np.ndarray] | None] = {}
    for entry in report.get("steps", []):
        text = entry.get("step", "")
        method, _, rest = text.partition(":")
        columns, _, params = rest.partition(":")
        columns = columns.split(",")
        for column in columns:
            found.pop(column, None)  # a later step changed it: no estimate
        if method == "pram":
            invariant = any(
                name.strip() == "invariant" and value.strip() not in ("", "0")
                for name, _, value in (item.partition("=") for item in params.split(","))
            )
            for column in columns:
                details = entry[column]
                found[column] = None if invariant else (
                    details["categories"], np.asarray(details["matrix"], float)
                )  # fmt: skip
    return found


def corrected_counts(sql: str, table: str, matrices: dict) -> str:
    """The rewritten SQL (see the module docstring) of a count query on ``table``.

    Raises:
        PolicyViolation: the query is not ``SELECT keys, COUNT(*) FROM table [WHERE] GROUP BY
            keys`` with exactly one PRAMmed column among the keys, or its WHERE reads a
            PRAMmed column (whose observed values would select the wrong records).
    """
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError:
        raise PolicyViolation("the query could not be parsed") from None
    form = "write SELECT keys..., COUNT(*) FROM <output> [WHERE ...] GROUP BY keys..."
    if not isinstance(tree, exp.Select) or tree.args.get("with_") or tree.args.get("joins"):
        raise PolicyViolation("PRAM estimates answer one count query on one output", form)
    source = tree.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table) or source.this.name != table:
        raise PolicyViolation(f"PRAM estimates read the output {table} only", form)
    for key in ("having", "limit", "offset", "qualify", "distinct"):
        if tree.args.get(key):
            raise PolicyViolation(f"PRAM estimates take no {key.upper()}", form)
    group = tree.args.get("group")
    keys = [k for k in (group.expressions if group else [])]
    if not all(isinstance(k, exp.Column) for k in keys):
        raise PolicyViolation("PRAM estimates group by plain columns", form)
    names = [k.name for k in keys]
    prammed = [n for n in names if n in matrices]
    if len(prammed) != 1:
        raise PolicyViolation(
            f"group by exactly one PRAMmed column (here {sorted(matrices)}), not {prammed}", form
        )
    if matrices[prammed[0]] is None:
        raise PolicyViolation(
            f"{prammed[0]} was PRAMmed with an invariant matrix, which is built from the "
            "source's confidential frequencies and is therefore never used for estimates",
            "over the whole file the observed counts are already unbiased (that is what "
            "invariant means): count them with an ordinary query",
        )
    where = tree.args.get("where")
    prammed_names = {m.lower() for m in matrices}  # SQL identifiers ignore case
    if where is not None and any(
        c.name.lower() in prammed_names for c in where.find_all(exp.Column)
    ):
        raise PolicyViolation("the WHERE of a PRAM estimate may not read a PRAMmed column", form)
    counts, outputs = [], []
    for projection in tree.expressions:
        inner = projection.unalias()
        if isinstance(inner, exp.Count) and isinstance(inner.this, exp.Star):
            counts.append(projection.alias_or_name)
        elif isinstance(inner, exp.Column) and inner.name in names:
            outputs.append(inner.name)
        else:
            raise PolicyViolation("a PRAM estimate selects group keys and COUNT(*)", form)
    if len(counts) != 1:
        raise PolicyViolation("a PRAM estimate selects one COUNT(*)", form)
    return _rewrite(tree, prammed[0], names, counts[0], matrices[prammed[0]]).sql("duckdb")


def _rewrite(tree: exp.Select, column: str, keys: list[str], count: str, matrix) -> exp.Expr:
    """``WITH o AS (observed counts) SELECT ..., 'c_i', SUM(o.n · Q[j, i]) ... UNION ALL ...``:
    one branch per estimated category i, the weights Q[j, i] as a CASE over the observed
    category j (the guard allows plain SQL over a released table; no VALUES list needed)."""
    categories, p = matrix
    try:
        q = np.linalg.inv(p)
    except np.linalg.LinAlgError:
        raise MicrodataError(
            f"the PRAM matrix of {column} is singular: no unbiased estimate"
        ) from None
    order = tree.args.get("order")
    observed = tree.copy()
    observed.set("order", None)
    observed.set("expressions", [exp.column(k).as_(k) for k in keys]
                 + [exp.Count(this=exp.Star()).as_("pram_n")])  # fmt: skip
    others = [exp.column(k, "o") for k in keys if k != column]
    seen = exp.cast(exp.column(column, "o"), "VARCHAR")
    branches = []
    for i, category in enumerate(categories):
        weight = exp.Case(
            ifs=[exp.If(this=exp.EQ(this=seen.copy(), expression=exp.Literal.string(c)),
                        true=exp.cast(exp.Literal.number(repr(float(q[j, i]))), "DOUBLE"))
                 for j, c in enumerate(categories)],
            default=exp.cast(exp.Literal.number(0), "DOUBLE"),
        )  # fmt: skip
        select_list = []
        for projection in tree.expressions:
            inner = projection.unalias()
            if isinstance(inner, exp.Column):
                value = (exp.Literal.string(category) if inner.name == column
                         else exp.column(inner.name, "o"))  # fmt: skip
                select_list.append(value.as_(projection.alias_or_name))
            else:
                weighted = exp.Mul(this=exp.column("pram_n", "o"), expression=weight)
                select_list.append(exp.Sum(this=weighted).as_(count))
        branch = exp.select(*select_list).from_("o")
        branches.append(branch.group_by(*[c.copy() for c in others]) if others else branch)
    union = branches[0]
    for branch in branches[1:]:
        union = exp.union(union, branch, distinct=False)
    if order is not None:
        union.set("order", order)
    return union.with_("o", as_=observed)
