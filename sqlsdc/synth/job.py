"""The synthesis job: synthetic records of a confidential table, stored as ``protected.<into>``
(issue 19).

:func:`synthesize` (``sqlsdc synthesize``) is an admin's back-end job, built like the
anonymisation job (:mod:`sqlsdc.jobs.anonymize`): one audited catalog opening
(:func:`sqlsdc.jobs.session.job_catalog`); a refused job is audited ``refused``, a failed one
``failed``, and neither leaves a table. The methods are a registry (:data:`METHODS`):

* ``parametric`` (:mod:`sqlsdc.synth.parametric`) and ``cart`` (:mod:`sqlsdc.synth.cart`) read
  the records (in a fixed order, direct identifiers and internal columns such as record keys
  left out, as the anonymisation job does) and fit their model in Python;
* ``dp-ipf`` and ``dp-catall`` (:mod:`sqlsdc.synth.ipf`) never read a record into Python: the
  job computes the margins in SQL (one ``GROUP BY`` per margin over the bounded rows), adds
  keyed discrete Laplace noise, and gives the method the noisy margins only.

DP synthesis is charged like a DP query (:mod:`sqlsdc.guard.dp_release`): under the table's
privacy unit, with the contribution bound of the policy's ``dp`` section of the table (a unit
keeps at most ``max_rows_per_unit`` rows, else ``max_groups × max_rows``, 1 without a ``dp``
section; the keyed choice of rows is ``hash`` of the row with its secret record key), one
charge of ε for the whole job through :func:`sqlsdc.catalog.budget.charge` against the keys
that apply to the acting admin and the table — so ``(*, table)`` limits, which every release
of the table counts against, bound synthesis too. The charge is committed before any margin is
computed (as a DP query pays before its exact cells are computed): a job refused for want of
budget stores nothing, a job that fails later has paid. With a bound of K rows per unit, one
unit changes the cells of a margin by K in total (L1), so each of the M margins gets
ε/M and noise of scale K·M/ε ([RA] §C.3; the stratum variable, if any, is one more variable of
every margin, so strata compose in parallel).

Stored: ``protected.<into>`` (with an INTEGER ``synthetic_copy`` first when ``copies`` ≥ 2), a
view ``synthetic.<into>`` over it, the ``sqlsdc.outputs`` record (method ``synthesize``, the
SELECT the records were read with, the report: ``synthetic``, ``method``, ``source``,
``source_sql``, ``columns``, ``seed``, ``epsilon``, ``copies``, ``parameters``, ``details``),
one ledger row per column and the ``accepted`` audit entry, in one transaction. Analysts read
it row by row through the guarded connection only when the policy lists it under
``releases:`` (:mod:`sqlsdc.guard.releases`); ``sqlsdc publish`` copies it to the release
database.

Example (admins; the demo database, after granting a budget on persons):
    >>> report = synthesize("sqlsdc-demo.duckdb", user="admin", source="persons",  # doctest: +SKIP
    ...     into="persons_syn", method="dp-ipf", epsilon="1",
    ...     columns=["sex", "education", "age"], bins={"age": [0, 15, 30, 45, 65, 111]})
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
from sqlglot import exp

from sqlsdc.catalog import store
from sqlsdc.catalog.budget import charge, policy_limits
from sqlsdc.errors import Error, SynthesisError
from sqlsdc.jobs.anonymize import check_records_job, read_records, records_definition, store_file
from sqlsdc.jobs.output_store import date_columns
from sqlsdc.jobs.session import OUTPUT_SCHEMA, job_catalog, json_safe
from sqlsdc.jobs.synthesis_files import (
    DP_METHODS,
    earlier_draws,
    exact_synthesis,
    refuse_exact_synthesis,
    refuse_synthesis_size,
)
from sqlsdc.mechanisms.accountant import PrivacyCost, amount_text, exact_text, fraction
from sqlsdc.policy import ColumnRole
from sqlsdc.policy.model import DpSettings
from sqlsdc.synth import ipf
from sqlsdc.synth.measures import (
    measure_columns,
    refuse_rare_special_values,
    smoothing_choice,
    unsmoothed_warning,
)
from sqlsdc.synth.parametric import coded_columns, synthesize_parametric
from sqlsdc.synth.rng import noise_stream, synth_rng
from sqlsdc.synth.smoothing import SmoothingError
from sqlsdc.synth.tails import coded_measures, refuse_few_values
from sqlsdc.synth.weak_noise import weak_noise_note

JOB = "synthesize"
VIEW_SCHEMA = "synthetic"
COPY_COLUMN = "synthetic_copy"
MAX_COPIES, MAX_ROWS = 1000, 100_000_000  # per job: beyond, a loop for hours or a bug report

Progress = Callable[[str], None]


def _cart(data, *, rng, n=None, progress=None, **options):
    try:
        from sqlsdc.synth.cart import synthesize_cart  # the cart module of issue 19
    except ImportError:
        raise SynthesisError("method cart is not available in this installation") from None
    return synthesize_cart(data, rng=rng, n=n, progress=progress, **options)


OPTIONS = {"cart": ("min_leaf", "visit_sequence", "draw", "smoothing", "special_values")}
"""The --option names of each method (the others take none)."""

METHODS: dict[str, Callable] = {
    "dp-ipf": ipf.synthesize_dp_ipf,
    "dp-catall": ipf.synthesize_dp_catall,
    "parametric": synthesize_parametric,
    "cart": _cart,
}


@dataclass(frozen=True)
class SynthReport:
    """What a synthesis job stored (the ``report`` of its ``sqlsdc.outputs`` record)."""

    name: str
    view: str
    synthetic: bool
    method: str
    source: str
    source_sql: str
    columns: list[str]
    dropped: list[str]
    records: int
    copies: int
    seed: int
    epsilon: str | None
    parameters: dict
    details: dict

    def to_dict(self) -> dict:
        return json_safe(asdict(self))


@dataclass(frozen=True)
class Variable:
    """A categorical variable of DP synthesis: its public levels (None: the missing level,
    when asked for) and the SQL condition each level is read with."""

    name: str
    levels: tuple
    conditions: tuple  # sqlglot conditions, one per level


def synthesize(
    db: str | Path,
    *,
    user: str,
    into: str,
    method: str,
    source: str | None = None,
    sql: str | None = None,
    columns: Sequence[str] | None = None,
    epsilon: str | Fraction | int | None = None,
    margins: Sequence[Sequence[str]] | None = None,
    bins: Mapping[str, Sequence[float]] | None = None,
    levels: Mapping[str, Sequence] | None = None,
    missing: Sequence[str] = (),
    zeros: Sequence[Mapping[str, object]] = (),
    stratify: str | None = None,
    max_cells: int = ipf.DEFAULT_MAX_CELLS,
    prior: float = 1.0,
    project: bool = True,
    seed: int = 0,
    copies: int = 1,
    rows: int | None = None,
    options: Mapping[str, object] | None = None,
    replace: bool = False,
    progress: Progress | None = None,
) -> SynthReport:
    """Synthesise the records of table ``source`` (or query ``sql``; DP methods read a table)
    with ``method`` and store them as ``protected.<into>`` (admins only).

    Args:
        db: the DuckDB file with the sqlsdc catalog.
        user: the acting admin.
        into: the output name (a plain name).
        method: ``dp-ipf``, ``dp-catall``, ``parametric`` or ``cart``.
        source: a confidential table of the policy; or
        sql: a SELECT over the policy's tables (non-DP methods only).
        columns: the variables to synthesise (default: every column but direct identifiers
            and internal ones; DP methods: the table's dimension columns).
        epsilon: DP methods: the privacy budget the job spends (exact: ``"1"``, ``"1/2"``).
        margins: DP ``dp-ipf``: the margin sets (lists of column names); default all two-way.
        bins: DP: breaks of numeric columns, ``{"age": [0, 15, 30, 65, 111]}`` (levels
            ``[0-15)``, ...).
        levels: DP: the public levels of a column (instead of the policy's ``domain``).
        missing: DP: columns whose missing values are a level of their own ([RA]: NA is a
            level); without it, and for values outside a column's levels, the record is left
            out of every margin (a per-record filter: the bound and the cost are unchanged).
        zeros: DP: structural zeros, each ``{column: level, ...}`` (``None`` = missing).
        stratify: DP: a column every margin is crossed with (per-stratum fits).
        max_cells: DP: the largest full table (per stratum) the job builds.
        prior: DP: [RA]'s ``nprior``, spread evenly over each margin's cells.
        project: ``dp-ipf``: make the noisy margins consistent before IPF.
        seed: seed of the keyed draws (with the database secret: same seed, same data).
        copies: synthetic copies stored in one table (column ``synthetic_copy``).
        rows: records per copy (default: the source's count; DP: the estimated count).
        options: method options (``cart``: min leaf size, ...). ``cart``'s ``smoothing``
            defaults to every variable traced to a policy ``measure``
            (:mod:`sqlsdc.synth.measures`); leaving one out warns (``details["warnings"]``,
            ``details["unsmoothed_measures"]``, the audit reason), and a measure without a
            bandwidth is refused.
        replace: overwrite an existing ``protected.<into>``.
        progress: called with the name of each step as it starts.

    Raises:
        AccessDenied: ``user`` is not an admin.
        SynthesisError: bad method, column, bins, levels, margins, or too many cells.
        BudgetExhausted: a DP job's ε would exceed an applicable budget (nothing stored).
        MicrodataError: bad name, source or SQL (the checks of the anonymisation job).
    """
    say = progress or (lambda _message: None)
    if method not in METHODS:
        raise SynthesisError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    dp = method in DP_METHODS
    request = json.dumps({"job": JOB, "method": method, "into": into, "from": source or sql,
                          "columns": columns, "epsilon": None if epsilon is None else str(epsilon),
                          "margins": margins, "bins": bins, "levels": levels,
                          "missing": list(missing),
                          "zeros": [dict(z) for z in zeros], "stratify": stratify, "seed": seed,
                          "copies": copies, "rows": rows, "options": options},
                         default=str)  # fmt: skip
    with job_catalog(db, user, JOB, into, request) as (con, query_id, fingerprint, audit):
        try:
            if (source is None) == (sql is None):
                raise SynthesisError("read either a table (--from TABLE) or a query (--sql QUERY)")
            _check_options(method, options)
            if not 1 <= copies <= MAX_COPIES or not 0 <= (rows or 0) <= MAX_ROWS:
                raise SynthesisError(
                    f"--copies must be from 1 to {MAX_COPIES} and --rows from 0 to {MAX_ROWS:,}"
                )
            version, policy = check_records_job(con, user, into, replace)
            exact = False  # may the file hold its source's counts (synthesis_files)
            unsmoothed: list[str] = []  # cart: measures whose values are donors' (measures)
            measures: list[str] = []  # cart: tail-coded before it is fitted (synth.tails)
            note = None  # a DP synthesis's margins exact more often than not (weak_noise)
            if dp:
                plan = _dp_plan(con, policy, source, sql, columns, epsilon, margins, bins,
                                levels, missing, zeros, stratify, max_cells, method)  # fmt: skip
                definition = plan["definition"]
                note = weak_noise_note(policy, plan["table"], plan["scale"], plan["epsilon"],
                                       len(plan["margins"]), plan["bound"])  # fmt: skip
                dropped: list[str] = []
            else:
                if epsilon is not None:
                    raise SynthesisError(f"{method} is not differentially private; --epsilon "
                                         "applies to dp-ipf and dp-catall")  # fmt: skip
                original, dropped = read_records(
                    con, policy, source, records_definition(source, sql), None
                )
                original = _columns(original, columns)
                definition = _source_sql(source, sql, list(original.columns))
                drawn = (len(original) if rows is None else rows) * copies
                if method not in DP_METHODS:  # with the draws readers hold (red team s42c)
                    drawn += earlier_draws(con, policy, source or sql, list(original.columns))
                exact = exact_synthesis(method, options, drawn, len(original))
                if rows is None and method not in DP_METHODS:  # its size: the source's count
                    refuse_synthesis_size(con, policy, into, source or sql, len(original))
                if exact:  # balanced draws or more records than the source: exact counts
                    refuse_exact_synthesis(con, policy, into, source or sql,
                                           list(original.columns))  # fmt: skip
                if method == "cart":  # smooth the measures unless told (s47m)
                    measures = measure_columns(con, policy, definition, original)
                    options, unsmoothed = smoothing_choice(options, measures,
                                                           list(original.columns))  # fmt: skip
                    refuse_rare_special_values(options, measures, original)
                # fewer than 10 values are all coded to their mean: shown exactly (s49b)
                refuse_few_values(
                    original, measures if method == "cart" else coded_columns(original)
                )
            store.ensure_secret(con)
            ((secret,),) = con.execute(
                f"SELECT material FROM {store.S}.secrets WHERE name = 'prf'"
            ).fetchall()
            secret = bytes(secret)
            if note is not None:
                say(note)
            if dp:
                say(f"charging ε = {amount_text(plan['epsilon'])} to the privacy budget")
                charge(con, user=user, tables=[plan["table"]],
                       cost=PrivacyCost(epsilon=plan["epsilon"]), query_id=query_id,
                       limits=policy_limits(policy), policy_version=version, sql=request,
                       fingerprint=fingerprint)  # fmt: skip
        except Error as refusal:
            audit("refused", reason=store.audit_reason(refusal))
            raise
        except BaseException as failure:  # Ctrl-C while the records are read: audited too
            audit("failed", reason=store.audit_reason(failure))
            raise
        try:
            started = time.perf_counter()
            if dp:
                frames, details = _run_dp(con, plan, secret, seed, copies, rows, prior, project,
                                          say)  # fmt: skip
                out_columns = [v.name for v in plan["variables"]]
            else:
                say(f"fitting {method} to {len(original)} records")
                try:
                    # cart draws donors' values: its measures' extremes are coded first, or
                    # many rows show the largest income (red team s47i; parametric codes
                    # every numeric marginal itself)
                    fitted = coded_measures(original, measures) if measures else original
                    frames, details = _run(method, fitted, secret, seed, copies, rows,
                                           options, say)  # fmt: skip
                except SmoothingError as error:
                    refusal = _smoothing_refusal(error)
                    audit("refused", reason=store.audit_reason(refusal))
                    raise refusal from None
                out_columns = list(original.columns)
            details["seconds"] = round(time.perf_counter() - started, 3)
            # columns whose counts may be the source's (sqlsdc.jobs.synthesis_files): none when
            # drawn with replacement (at most the source's records in all), every one with
            # cart's balanced draws or more records than the source
            details["exact_columns"] = out_columns if not dp and exact else []
            if note is not None:
                details["notes"] = [note]
            warning = unsmoothed_warning(unsmoothed) if unsmoothed else None
            if warning is not None:  # the report and the audit entry record the choice
                details["unsmoothed_measures"] = unsmoothed
                details["warnings"] = [warning]
            result = _stack(frames)
            report = SynthReport(
                name=f"{OUTPUT_SCHEMA}.{into}",
                view=f"{VIEW_SCHEMA}.{into}",
                synthetic=True,
                method=method,
                source=source or sql,
                source_sql=definition,
                columns=out_columns,
                dropped=dropped,
                records=len(result),
                copies=copies,
                seed=int(seed),
                epsilon=exact_text(plan["epsilon"]) if dp else None,
                parameters=_parameters(
                    method, plan if dp else None, prior, project, rows, options
                ),  # fmt: skip
                details=details,
            )
            say(f"storing {report.name}")
            store_file(con, result, report, user, version, definition, query_id, fingerprint,
                       into, method=JOB, mechanism=method, view=VIEW_SCHEMA,
                       note="; ".join(x for x in (note, warning) if x) or None,
                       dates=date_columns(con, definition))  # fmt: skip
        except BaseException as failure:
            audit("failed", reason=store.audit_reason(failure))
            raise
        return report


# ---------------------------------------------------------------------------- non-DP methods


def _columns(frame: pd.DataFrame, columns: Sequence[str] | None) -> pd.DataFrame:
    if columns is None:
        return frame
    wanted = [c.lower() for c in columns]
    present = {c.lower(): c for c in frame.columns}
    missing = [c for c in wanted if c not in present]
    if missing:
        raise SynthesisError(
            f"columns {missing} are not among the records' columns "
            f"({', '.join(frame.columns)}); direct identifiers and internal columns are never "
            "synthesised"
        )
    return frame[[present[c] for c in wanted]]


def _source_sql(source: str | None, sql: str | None, columns: list[str]) -> str:
    """The SELECT the records were read with (``SELECT <columns> FROM T`` for a table)."""
    if source is None:
        return sql
    select = exp.select(*(exp.column(c) for c in columns)).from_(exp.to_identifier(source))
    return select.sql("duckdb")


def _smoothing_refusal(error: SmoothingError) -> SynthesisError:
    """The job's refusal when a measure cannot be smoothed: it stores no original values."""
    column = error.column or "a variable"
    return SynthesisError(
        f"cart cannot smooth {column}: {error}. Without smoothing its synthetic values would be "
        f"original values, so nothing is stored. Top-code or recode {column} so that no few "
        f"records stand apart (e.g. --sql with least({column}, <cap>)), leave it out of the "
        f"synthesis (--columns), or leave it out of smoothing knowingly (--option "
        f"smoothing=false, or a list of the other measures; the job then warns)"
    )


def _check_options(method: str, options) -> None:
    """Option names the method has: an unknown one was a TypeError reported as a bug in
    sqlsdc, and a DP method ignored every option without a word."""
    unknown = sorted(set(options or {}) - set(OPTIONS.get(method, ())))
    if unknown:
        takes = ", ".join(OPTIONS.get(method, ())) or "no option"
        raise SynthesisError(f"method {method} takes {takes}; unknown: {', '.join(unknown)}")


def _exact(value, name: str) -> Fraction:
    """``value`` as an exact number; text that is none ("nan", "1e-999") is the user's error."""
    try:
        return fraction(value, name)
    except (TypeError, ValueError) as error:
        raise SynthesisError(str(error)) from None


def _run(method, data, secret, seed, copies, rows, options, say):
    """Each copy drawn by ``method``; cart says each variable as it starts (``say``), with
    the copy when there are several."""
    frames, details = [], {}
    for copy in range(1, copies + 1):
        rng = synth_rng(secret, seed, f"{method}:copy{copy}")
        extra = {}
        if method == "cart":
            extra["progress"] = (
                say
                if copies == 1
                else (lambda message, copy=copy: say(f"copy {copy} of {copies}: {message}"))
            )
        frame, details = METHODS[method](data, rng=rng, n=rows, **dict(options or {}), **extra)
        frames.append(frame)
    return frames, details


def _stack(frames: list[pd.DataFrame]) -> pd.DataFrame:
    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    parts = [f.reset_index(drop=True).assign(**{COPY_COLUMN: i + 1}) for i, f in enumerate(frames)]
    stacked = pd.concat(parts, ignore_index=True)
    return stacked[[COPY_COLUMN, *[c for c in stacked.columns if c != COPY_COLUMN]]].astype(
        {COPY_COLUMN: "int32"}
    )


def _parameters(method, plan, prior, project, rows, options) -> dict:
    out: dict = {"rows": rows, "options": dict(options or {})}
    if plan is not None:
        out.update(
            margins=[[plan["variables"][a].name for a in m] for m in plan["margins"]],
            levels={v.name: [None if x is None else str(x) for x in v.levels]
                    for v in plan["variables"]},
            zeros=plan["zeros_named"],
            stratify=plan["stratify"],
            unit=plan["unit"],
            rows_per_unit=plan["bound"],
            noise="discrete_laplace",
            scale=str(plan["scale"]),
            prior=prior,
            consistency_projection=bool(project) if method == "dp-ipf" else None,
        )  # fmt: skip
    return out


# ------------------------------------------------------------------------------- DP methods


def _dp_plan(con, policy, source, sql, columns, epsilon, margins, bins, levels, missing,
             zeros, stratify, max_cells, method) -> dict:  # fmt: skip
    """Everything a DP job needs before it spends: the table, its unit and row bound, the
    variables and their public levels, the margins, the cost and the noise scale."""
    if sql is not None or source is None:
        raise SynthesisError(
            f"{method} reads one confidential table (--from TABLE), so that its privacy unit "
            "bounds every contribution; bin numeric columns with --bins and name public "
            "levels with --levels instead of a --sql query"
        )
    table = policy.declared(source)
    if table.is_public:
        raise SynthesisError(f"{source} is not a confidential table of the policy")
    if table.privacy_unit is None:
        raise SynthesisError(f"{source} declares no privacy_unit; DP synthesis needs one")
    if epsilon is None:
        raise SynthesisError(f"{method} needs --epsilon (the budget the job spends, e.g. 1)")
    eps = _exact(epsilon, "epsilon")
    if eps <= 0:
        raise SynthesisError(f"--epsilon must be positive, got {eps}")
    bins, levels = dict(bins or {}), dict(levels or {})
    if columns is None:
        columns = [c.name for c in table.columns.values() if c.role is ColumnRole.DIMENSION
                   and c.name != stratify]  # fmt: skip
    names = [c.lower() for c in columns]
    if stratify is not None:
        names = [n for n in names if n != stratify.lower()] + [stratify.lower()]
    if len(set(names)) != len(names) or not names:
        raise SynthesisError("name each variable once, at least one")
    types = {r[0].lower(): r[1] for r in con.execute(f'DESCRIBE "{table.name}"').fetchall()}
    missing = {m.lower() for m in missing}
    unknown = sorted(missing - set(names))
    if unknown:
        raise SynthesisError(f"--missing names columns that are not variables: {unknown}")
    variables = [_variable(table, types, n, bins, levels, n in missing) for n in names]
    position = {v.name: i for i, v in enumerate(variables)}
    strata = position[stratify.lower()] if stratify is not None else None
    inner = [i for i in range(len(variables)) if i != strata]
    if method == "dp-catall":
        chosen = [tuple(range(len(variables)))]
    elif margins is None:
        chosen = [tuple(sorted((*(inner[a] for a in m), *((strata,) if strata is not None
                                                           else ()))))
                  for m in ipf.default_margins(len(inner))]  # fmt: skip
    else:
        chosen = []
        for m in margins:
            unknown = [c for c in m if c.lower() not in position]
            if unknown or not m:
                raise SynthesisError(f"margin {list(m)} names columns that are not variables "
                                     f"({', '.join(position)}): {unknown}")  # fmt: skip
            axes = {position[c.lower()] for c in m} | ({strata} if strata is not None else set())
            chosen.append(tuple(sorted(axes)))
        covered = set().union(*map(set, chosen))
        if covered != set(range(len(variables))):
            left = [variables[i].name for i in range(len(variables)) if i not in covered]
            raise SynthesisError(f"every variable must be in a margin; not in any: {left}")
    shape = [len(v.levels) for v in variables]
    cells = int(np.prod([s for i, s in enumerate(shape) if i != strata], dtype=object))
    if cells > max_cells:
        raise SynthesisError(
            f"the full table has {cells:,} cells{' per stratum' if strata is not None else ''}, "
            f"above the cap of {max_cells:,} (--max-cells); synthesise fewer variables, bin "
            "them more coarsely, or stratify by one of them"
        )
    zero_codes, zeros_named = _zeros(zeros, variables, position)
    settings = table.dp or DpSettings()
    bound = settings.max_rows_per_unit or settings.max_groups * settings.max_rows
    scale = Fraction(bound * len(chosen)) / eps
    definition = exp.select(*(exp.column(v.name) for v in variables)).from_(
        exp.to_identifier(table.name)
    )
    return {"table": table.name, "unit": table.privacy_unit, "bound": bound, "epsilon": eps,
            "variables": variables, "margins": chosen, "shape": shape, "strata": strata,
            "stratify": stratify, "zeros": zero_codes, "zeros_named": zeros_named,
            "scale": scale, "method": method, "definition": definition.sql("duckdb")}  # fmt: skip


def _variable(table, types: dict, name: str, bins: dict, levels: dict, missing: bool) -> Variable:
    declared = table.column(name)
    if declared is None or name not in types or name.startswith("__"):
        raise SynthesisError(f"{name!r} is not a declared column of {table.name}")
    if declared.role in (ColumnRole.IDENTIFIER, ColumnRole.HIDDEN):
        raise SynthesisError(f"{name!r} is a {declared.role.value} column; it is never synthesised")
    column = exp.column(name)
    given = {k.lower(): v for k, v in levels.items()}
    if name in {k.lower() for k in bins}:
        breaks = [_exact(str(b), f"--bins {name}") for b in
                  next(v for k, v in bins.items() if k.lower() == name)]  # fmt: skip
        if len(breaks) < 2 or any(b >= c for b, c in zip(breaks, breaks[1:], strict=False)):
            raise SynthesisError(f"--bins {name}: give at least two increasing breaks")
        labels = tuple(f"[{_num(lo)}-{_num(hi)})" for lo, hi in zip(breaks, breaks[1:],
                                                                    strict=False))  # fmt: skip
        conditions = tuple(
            exp.and_(exp.GTE(this=column.copy(), expression=_literal(lo)),
                     exp.LT(this=column.copy(), expression=_literal(hi)))
            for lo, hi in zip(breaks, breaks[1:], strict=False)
        )  # fmt: skip
        return _with_missing(Variable(name, labels, conditions), missing)
    values = given.get(name)
    if values is None and declared.domain is not None:
        values = list(declared.domain)
    if values is None:
        numeric = any(t in types[name].upper() for t in ("INT", "DOUBLE", "FLOAT", "DECIMAL",
                                                           "REAL", "DATE", "TIME"))  # fmt: skip
        hint = f"bin it with --bins {name}=B0,B1,..." if numeric else (
            f"name its public levels with --levels {name}=A,B,... or declare `domain:` for it "
            "in the policy")  # fmt: skip
        raise SynthesisError(
            f"{name!r} has no public levels: DP synthesis needs the levels of every variable "
            f"without reading them from the data; {hint}"
        )
    values = list(dict.fromkeys(values))
    text = exp.cast(column.copy(), "VARCHAR")
    conditions = tuple(exp.EQ(this=text.copy(), expression=exp.Literal.string(str(v)))
                       for v in values)  # fmt: skip
    return _with_missing(Variable(name, tuple(values), conditions), missing)


def _with_missing(variable: Variable, missing: bool) -> Variable:
    if not missing:
        return variable
    null = exp.Is(this=exp.column(variable.name), expression=exp.Null())
    return Variable(variable.name, (*variable.levels, None), (*variable.conditions, null))


def _num(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else str(float(x))


def _literal(x: Fraction) -> exp.Expr:
    return exp.Literal.number(_num(x))


def _zeros(zeros, variables, position) -> tuple[list[dict], list[dict]]:
    codes, named = [], []
    for zero in zeros:
        code = {}
        for column, value in zero.items():
            if column.lower() not in position:
                raise SynthesisError(f"structural zero {dict(zero)}: {column!r} is not a variable")
            var = variables[position[column.lower()]]
            shown = [None if v is None else str(v) for v in var.levels]
            key = None if value is None or str(value).upper() == "NULL" else str(value)
            if key not in shown:
                raise SynthesisError(f"structural zero {dict(zero)}: {value!r} is not a level of "
                                     f"{var.name} ({', '.join(map(str, shown))})")  # fmt: skip
            code[position[column.lower()]] = shown.index(key)
        codes.append(code)
        named.append({variables[a].name: None if variables[a].levels[v] is None else
                      str(variables[a].levels[v]) for a, v in code.items()})  # fmt: skip
    return codes, named


def _coded_rows(plan) -> str:
    """The bounded rows as level codes: each unit keeps at most ``bound`` rows (those of
    smallest ``hash`` of the row with its secret record key), each variable a code 0..L−1;
    rows with a value outside a variable's levels are left out (after bounding: a filter
    on each record alone, so one unit still moves at most ``bound`` records)."""
    unit = exp.column(plan["unit"], table="__src")
    order = exp.func("hash", exp.column("__src"))  # the whole row, its secret record key too
    rank = exp.Window(this=exp.RowNumber(), partition_by=[unit],
                      order=exp.Order(expressions=[exp.Ordered(this=order)]))  # fmt: skip
    bounded = (
        exp.select("*").from_(exp.to_table(exp.to_identifier(plan["table"])).as_("__src"))
        .qualify(exp.LTE(this=rank, expression=exp.Literal.number(plan["bound"])))
    )  # fmt: skip
    coded = []
    for j, v in enumerate(plan["variables"]):
        case = exp.Case()
        for k, condition in enumerate(v.conditions):
            case = case.when(condition.copy(), exp.Literal.number(k))
        coded.append(exp.alias_(case.else_(exp.Literal.number(-1)), f"__v{j}"))
    codes = exp.select(*coded).from_(bounded.subquery("__bounded"))
    inside = exp.and_(*(exp.GTE(this=exp.column(f"__v{j}"), expression=exp.Literal.number(0))
                        for j in range(len(plan["variables"]))))  # fmt: skip
    return exp.select("*").from_(codes.subquery("__codes")).where(inside).sql("duckdb")


def _margin_counts(con, axes, shape) -> np.ndarray:
    keys = [exp.column(f"__v{a}") for a in axes]
    query = exp.select(*keys, exp.alias_(exp.Count(this=exp.Star()), "n")).from_("__synth_codes")
    rows = con.execute(query.group_by(*[k.copy() for k in keys]).sql("duckdb")).fetchall()
    counts = np.zeros([shape[a] for a in axes], np.int64)
    for *index, n in rows:
        counts[tuple(index)] = n
    return counts


def _run_dp(con, plan, secret, seed, copies, rows, prior, project, say):
    shape, variables = plan["shape"], plan["variables"]
    say("computing the margins in SQL")
    con.execute(f"CREATE OR REPLACE TEMP TABLE __synth_codes AS {_coded_rows(plan)}")
    try:
        # the noise is keyed by the data: a version that the same codes added or removed in
        # pairs keep (an XOR of hashes alone) gave two data sets the same noise, and two
        # syntheses their exact difference (red team s38b); the sum of hashes tells them apart,
        # as sqlsdc.engines.duckdb_schema.data_version does
        digest = con.execute(
            "SELECT count(*), bit_xor(hash(__synth_codes)), sum(hash(__synth_codes)) "
            "FROM __synth_codes"
        ).fetchone()
        data_version = f"{plan['table']}:{digest[0]}:{digest[1]}:{digest[2] or 0}"
        noisy = {}
        say(f"adding discrete Laplace noise of scale {plan['scale']} to {len(plan['margins'])} "
            "margins")  # fmt: skip
        for m in plan["margins"]:
            counts = _margin_counts(con, m, shape)
            label = ",".join(variables[a].name for a in m)
            fixed = ipf.zero_mask(shape, plan["zeros"], m)
            noisy[m] = ipf.noisy_counts(
                counts, plan["scale"],
                # keyed by the scale too: at two scales the sampler turns the same bits into
                # X and X // 5 (12 and 12/5), and two outputs gave the count (red team s37c)
                lambda i, label=label: noise_stream(secret, seed, data_version, plan["method"],
                                                    f"scale={plan['scale']}", label, i),
                fixed=fixed,
            )  # fmt: skip
    finally:
        con.execute("DROP TABLE IF EXISTS __synth_codes")
    frames, details = [], {}
    say(f"fitting {plan['method']}")
    for copy in range(1, copies + 1):
        rng = synth_rng(secret, seed, f"{plan['method']}:copy{copy}")
        if plan["method"] == "dp-ipf":
            codes, details = ipf.synthesize_dp_ipf(
                noisy, shape=shape, rng=rng, n=rows, zeros=plan["zeros"], prior=prior,
                project=project, strata=plan["strata"])  # fmt: skip
        else:
            (table,) = noisy.values()
            codes, details = ipf.synthesize_dp_catall(table, rng=rng, n=rows,
                                                      zeros=plan["zeros"], prior=prior)  # fmt: skip
        frames.append(_decode(codes, variables))
    return frames, details


def _decode(codes: np.ndarray, variables: Sequence[Variable]) -> pd.DataFrame:
    """Records from level codes: each variable's level values (missing level: NULL)."""
    out = {}
    for j, v in enumerate(variables):
        levels = np.asarray(v.levels, dtype=object)
        column = pd.Series(levels[codes[:, j]] if len(codes) else [], dtype=object)
        present = [x for x in v.levels if x is not None]
        if present and all(isinstance(x, bool) for x in present):
            column = column.astype("boolean")
        elif present and all(isinstance(x, int) and not isinstance(x, bool) for x in present):
            column = column.astype("Int64")
        elif present and all(isinstance(x, int | float) for x in present):
            column = column.astype("Float64")
        else:
            column = column.astype("string")
        out[v.name] = column
    return pd.DataFrame(out, columns=[v.name for v in variables])
