"""The verification server of McClure and Reiter [MR]: how well does an analysis of a synthetic
output reproduce the same analysis of the confidential data?

An analyst sends an aggregate or OLS query on a synthetic output (:mod:`sqlsdc.synth.request`);
the server computes the same estimand on the synthetic copies (combined by Reiter's rules when
m ≥ 2, :mod:`sqlsdc.synth.fidelity`) and on the confidential records the output was made from
(its ``source_sql``, read through the same rewritten query), and releases only a fidelity
measure of the two confidence intervals ([MR] eq. 1), never a confidential value:

- ``interval`` ([MR] §5 "must-have"; admins only, their default): the decile interval of FM
  over the true data and every neighbour in the safety-zone scan (:mod:`sqlsdc.synth.scan`).
  Deterministic, so free — and therefore not offered to analysts: the interval covers the
  neighbours of *one* answer, but an analyst who sends two requests that differ in one person
  (``cell`` and ``cell AND NOT person``, with the synthetic side moved so that a decile
  boundary falls between them) tells them apart, and its suppression of cells under the
  minimum frequency is an exact threshold on a confidential count; the red-team tests of
  ``tests/security/test_redteam_s25.py`` read an income to the cent both ways.
- ``noisy`` ([MR] §4; analysts' only mode): FM on a grid of 1/1000 plus discrete Laplace noise of
  scale 1000/ε grid units (FM is in [0, 1]: sensitivity 1 with the synthetic data fixed), clipped to
  [0, 1] (post-processing). Each released cell costs ε (sequential composition), charged to the
  analyst's budgets through :func:`sqlsdc.catalog.budget.charge` *before* any confidential record is
  read; the noise is drawn from the database's keyed PRF, so a repeat is identical.

Limits against an intruder with an analyst's connection (digest B.5): answers are cached by
canonical query per user (repeats are identical and free); analysts verify released outputs only
(the policy's ``releases:``) and never learn the names of others; every new query counts against a
per-user, per-output limit (``report.verification.max_queries``, default
:data:`DEFAULT_MAX_QUERIES`); cells with fewer records than the policy's minimum frequency are
suppressed (interval mode: on either side; noisy mode: on the synthetic side only, so the DP
guarantee is not broken by a data-dependent decision); OLS refuses regressors that single out
records (a leverage above 1/min_frequency) and cells with fewer residual degrees of freedom than the
minimum frequency. Residual risk [MR] §5: what the synthetic data themselves say is not accounted
for.
"""

from __future__ import annotations

import hashlib
import json
import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from fractions import Fraction

import numpy as np
import pandas as pd
import sqlglot
from sqlglot import exp

from sqlsdc.catalog import store
from sqlsdc.catalog.budget import charge, has_charge, policy_limits
from sqlsdc.catalog.schema import CATALOG_SCHEMA
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import duckdb_schema
from sqlsdc.errors import Error, PolicyViolation, ProgrammingError
from sqlsdc.jobs.class_views import classes_of_noised_values
from sqlsdc.mechanisms.accountant import MAX_DIGITS, PrivacyCost, fraction
from sqlsdc.mechanisms.prf import KeyedStream
from sqlsdc.policy.model import DEFAULT_MIN_FREQUENCY, UserRole
from sqlsdc.policy.validate import AMOUNT_RANGES
from sqlsdc.synth.request import Request, parse_request, record_query
from sqlsdc.synth.request_totality import check_total, column_types
from sqlsdc.synth.verify_cells import Output, measure_cells, plan_cells
from sqlsdc.synth.verify_limit import reserved

__all__ = ["DEFAULT_MAX_QUERIES", "MODES", "Verification", "verify"]

MODES = ("interval", "noisy")
DEFAULT_MAX_QUERIES = 200
"""New (uncached) verification queries a user may send per synthetic output."""
S = CATALOG_SCHEMA
VERIFICATIONS_DDL = f"""CREATE TABLE IF NOT EXISTS {S}.verifications (
    entry VARCHAR PRIMARY KEY,
    user_name VARCHAR NOT NULL,
    output VARCHAR NOT NULL,
    output_version VARCHAR NOT NULL,
    canonical VARCHAR NOT NULL,
    mode VARCHAR NOT NULL,
    epsilon VARCHAR,
    answer VARCHAR NOT NULL,
    query_id BIGINT NOT NULL,
    created_at TIMESTAMP NOT NULL)"""
# an answer, or what a charge paid for (PAID_PENDING), replacing what the entry held
_STORE = f"INSERT OR REPLACE INTO {S}.verifications VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


@dataclass(frozen=True)
class Verification:
    """A verification answer: one entry per cell (group × estimand × term) with its ``status``
    (``released`` or ``suppressed``) and ``fm_interval`` ([lo, hi]) or ``fm_noisy``."""

    output: str
    mode: str
    copies: int
    combining: str  # "naive" (one copy), "partial" or "full" (Reiter's rules)
    cells: list[dict]
    epsilon_spent: str = "0"
    cached: bool = False
    query_id: int | None = None
    canonical: str = field(default="", repr=False)

    def to_dict(self) -> dict:
        return asdict(self)

    def frame(self) -> pd.DataFrame:
        """The cells as a table: group columns, estimand, term, status, fidelity."""
        rows = [
            {**c.get("group", {}), **{k: v for k, v in c.items() if k != "group"}}
            for c in self.cells
        ]
        return pd.DataFrame(rows)


def verify(
    con,
    sql: str,
    *,
    user: str,
    policy,
    policy_version: int,
    secret: bytes,
    mode: str | None = None,
    epsilon=None,
    lock=None,
    timeout: float | None = None,
) -> Verification:
    """Answer one verification query (see the module docstring); audited like any query.

    Args:
        con: the guarded connection's (writable) engine connection.
        sql: the analyst's query on a synthetic output.
        mode: ``interval`` (admins only; their default) or ``noisy`` (analysts' default).
        epsilon: noisy mode only: ε per released cell (exact: int, Fraction or "0.5"), used
            and charged rounded down to a multiple of 1/EPSILON_GRID.
        lock: serialises budget charges of this process (the guard's database lock).

    Raises:
        PolicyViolation: the query cannot be verified, or the user's limit is reached.
        BudgetExhausted: noisy mode, the analyst's budget does not allow the charge.
    """
    query_id = store.next_query_id(con)
    try:
        answer = _answer(
            con, sql, user, policy, policy_version, secret, mode, epsilon, lock, timeout, query_id
        )
    except Error as refusal:
        store.record_query(
            con, query_id, user, policy_version, "refused", sql, reason=store.audit_reason(refusal)
        )
        if _paid(con, query_id) and len(refusal.args) == 1:
            refusal.args = (f"{refusal.args[0]}; {_STOPPED_PAID.format(query_id)}",)
        raise
    except BaseException as stopped:  # Ctrl-C: the charge's entry stands for it
        if _paid(con, query_id):
            stopped.add_note(_STOPPED_PAID.format(query_id))
        raise
    return answer


_STOPPED_PAID = (
    "verification query {} was charged and stopped before its answer: asking the same again "
    "is charged again (it counts against the output's max_queries once)"
)


def _paid(con, query_id: int) -> bool:
    """Best effort (the engine may be what stopped): whether ``query_id``'s charge committed."""
    try:
        return has_charge(con, query_id)
    except engine.EngineError:
        return False


def _answer(con, sql, user, policy, version, secret, mode, epsilon, lock, timeout, query_id):
    admin = _is_admin(policy, user)
    mode = _mode(mode, admin)
    if mode == "interval" and not admin:
        raise PolicyViolation(
            "interval mode is for admins: its answers are exact functions of the confidential "
            "data, and two requests that differ in one person can be told apart",
            "use mode='noisy' with epsilon=... (sqlsdc verify --mode noisy --epsilon 0.5): "
            "differentially private, charged per released cell to your budget",
            sql=sql,
        )
    request = parse_request(sql)
    output = _output(con, request, sql, policy, admin)
    eps = _epsilon(mode, epsilon)
    source = sqlglot.parse_one(output.source_sql, read="duckdb")
    synthetic_types = _types(con, exp.to_table(output.name))
    source_types = _types(con, source)
    check_total(request, [synthetic_types, source_types], timeout)  # before any row is read
    con.execute(VERIFICATIONS_DDL)
    tables = duckdb_schema.tables_read_by(con, output.source_sql)
    data = _data_versions(con, tables)
    entry = hashlib.sha256(
        "\x00".join(
            [user, output.name, output.version, data, request.digest, mode, str(eps)]
        ).encode()
    ).hexdigest()
    row = engine.one(
        con, f"SELECT answer, query_id FROM {S}.verifications WHERE entry = ?", [entry]
    )
    paid = _paid_earlier(row)
    if row is not None and paid is None:
        answer = Verification(
            **{**json.loads(row[0]), "cached": True, "query_id": query_id, "epsilon_spent": "0"}
        )
        store.record_query(
            con,
            query_id,
            user,
            version,
            "accepted",
            sql,
            reason=f"verification ({mode}, cached)",
            fingerprint=request.digest,
            rows=len(answer.cells),
        )
        return answer

    def stored() -> int:
        (asked,) = engine.one(
            con,
            f"SELECT count(*) FROM {S}.verifications WHERE user_name = ? AND output = ? "
            "AND output_version = ?",
            [user, output.name, output.version],
        )
        return asked

    def refuse(asked: int) -> PolicyViolation:
        return PolicyViolation(
            f"user {user!r} has sent {asked} verification queries on {output.name}, its limit",
            "repeat an earlier query (answered from the cache), or ask an admin to raise "
            "`verification.max_queries` in the output's report",
        )

    place = (_database(con), user, output.name, output.version)
    limited = (
        nullcontext() if paid is not None else reserved(place, output.max_queries, stored, refuse)
    )
    with limited:  # counted with those running; a paid, stopped one counts already
        k_min = _min_frequency(policy, tables)
        synthetic = _records(con, request, exp.to_table(output.name), output.copies > 1, timeout,
                             synthetic_types)  # fmt: skip
        # refusals from the synthetic side: here
        plan = plan_cells(request, synthetic, output, k_min)
        released = [c for c in plan if c["status"] == "released"]
        spent, reason = Fraction(0), f"verification ({mode})"
        if paid is not None:
            reason = f"verification ({mode}; charged again: query {paid} paid for it and stopped)"
        if mode == "noisy" and released:
            spent = eps * len(released)
            cost = PrivacyCost(epsilon=spent)
            pending = [entry, user, output.name, output.version, request.canonical, mode,
                       str(eps), json.dumps({PAID_PENDING: True})]  # fmt: skip

            def note_paid(charged: int) -> None:  # in the charge's transaction (see PAID_PENDING)
                con.execute(_STORE, [*pending, charged, store.now()])

            with lock or nullcontext():
                charge(
                    con,
                    user=user,
                    tables=tables,
                    cost=cost,
                    query_id=query_id,
                    limits=policy_limits(policy),
                    policy_version=version,
                    sql=sql,
                    fingerprint=request.digest,
                    drawn=note_paid,
                )
        # as the output's job read them: a class of a unit-noised measure is the class of x·m
        with classes_of_noised_values(con, policy):
            confidential = _records(con, request, source, False, timeout, source_types)
        key = KeyedStream(secret, "sqlsdc.verify", output.name, output.version, data)
        with np.errstate(all="ignore"):  # see measure_cells
            cells = measure_cells(
                request, plan, synthetic, confidential, output, key, k_min, mode, eps
            )
        answer = Verification(
            output.name,
            mode,
            output.copies,
            "naive" if output.copies == 1 else output.combining,
            cells,
            str(spent),
            False,
            query_id,
            request.canonical,
        )
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(
                _STORE,
                [
                    entry,
                    user,
                    output.name,
                    output.version,
                    request.canonical,
                    mode,
                    None if eps is None else str(eps),
                    json.dumps(answer.to_dict()),
                    query_id,
                    store.now(),
                ],
            )
            store.record_query(
                con,
                query_id,
                user,
                version,
                "accepted",
                sql,
                reason=reason,
                fingerprint=request.digest,
                rows=len(cells),
            )
            con.execute("COMMIT")
        except BaseException:
            engine.rollback(con)
            raise
        return answer


PAID_PENDING = "paid, not answered"
"""The key of the answer a noisy verification's charge stores for it, in the charge's own
transaction (:func:`sqlsdc.catalog.budget.charge`'s ``drawn``), until its answer replaces it.

A verification stopped after its charge (the statement timeout, an error, Ctrl-C, kill -9)
keeps this answer, so the stopped query counts against the output's ``max_queries`` like an
answer, its error says that it was charged and that asking again is charged again, and the
retry's audit entry names the query that paid and stopped. Storing nothing, asking again paid
again unseen and escaped the limit (red team s43b's open item, s44e).

The retry pays again rather than being answered free, as a DP query stopped after its charge
does (red team s41b): a free retry computes the confidential side again at every asking, and
one stopped by a short statement timeout each time (free once the first was paid) timed the
confidential records' read as often as asked. Its noise is the same (keyed by request, ε and
cell: :func:`~sqlsdc.synth.verify_cells.noisy_fm`), so paying again buys no new draw."""


def _paid_earlier(row) -> int | None:
    """The query id of a stored verification row that a stopped query paid for and never
    answered, else None (no row, or an answer)."""
    if row is None or not row[0].startswith("{") or PAID_PENDING not in row[0]:
        return None
    found = json.loads(row[0])
    return row[1] if set(found) == {PAID_PENDING} else None


def _mode(mode, admin: bool) -> str:
    """``mode`` as one of :data:`MODES` itself, compared as a built-in str: a str subclass
    whose ``__eq__`` says "noisy" to the membership test and no to every later ``mode ==``
    test got an analyst the admins' interval answers (no suppression of small cells), free."""
    if mode is None:
        return "interval" if admin else "noisy"
    text = str.__str__(mode) if isinstance(mode, str) else None
    for known in MODES:
        if text == known:
            return known
    raise ProgrammingError(f"mode must be one of {', '.join(MODES)}, got {text or type(mode)!r}")


EPSILON_GRID = 10**9
"""An analyst's ε is used and charged rounded down to a multiple of 1/EPSILON_GRID (a little
more noise, the same charge): every charge then has a denominator dividing 10⁹, so no choice
of ε (``1/p`` for a hundred 40-digit primes p) makes the sums of a budget too long to print."""


def _epsilon(mode: str, epsilon) -> Fraction | None:
    """The ε of a noisy verification, exact, on :data:`EPSILON_GRID`, and in the range of any ε
    a policy states (``AMOUNT_RANGES``): down to 10⁻⁹ a request was a nearly free computation
    on the confidential records, so a budget bounded nothing of how many an analyst could make
    (red team s42b)."""
    if mode == "interval":
        if epsilon is not None:
            raise ProgrammingError("epsilon applies to noisy mode only; interval mode is free")
        return None
    if epsilon is None:
        raise ProgrammingError(
            "noisy mode needs epsilon, e.g. epsilon='0.5' (--epsilon 0.5), charged per released "
            "cell to your budget"
        )
    try:
        value = fraction(epsilon, "epsilon")
    except (TypeError, ValueError) as error:  # "nan", "1e-999": the user's, not a bug
        raise ProgrammingError(str(error)) from None
    if max(abs(value.numerator), value.denominator) >= 10**MAX_DIGITS:
        raise ProgrammingError(
            f"epsilon must have at most {MAX_DIGITS} digits in its numerator and denominator, "
            "e.g. epsilon='0.5' or '1/3'"
        )
    used = Fraction(math.floor(value * EPSILON_GRID), EPSILON_GRID)
    lowest, highest, _ = AMOUNT_RANGES["epsilon"]
    if not lowest <= used <= highest:  # as any epsilon a policy states (red team s42b)
        raise ProgrammingError(
            f"epsilon must be at least {float(lowest):.6f} and at most {highest} per cell, as "
            f"a policy's epsilon, got {value}: e.g. epsilon='0.5'"
        )
    return used


def _is_admin(policy, user: str) -> bool:
    found = policy.user(user)
    return found is not None and found.role == UserRole.ADMIN


def _database(con) -> str:
    """The file (or in-memory name) of the database ``con`` reads: the per-output limit's
    places are counted per database (:mod:`sqlsdc.synth.verify_limit`)."""
    row = engine.one(con, "SELECT path FROM duckdb_databases() WHERE database_name = "
                          "current_database()")  # fmt: skip
    return str(row[0]) if row is not None and row[0] else f"memory:{id(con)}"


def _data_versions(con, tables) -> str:
    """The data versions (:func:`sqlsdc.engines.duckdb_schema.data_version`) of the tables the
    output's source reads: the noise of a noisy answer, and its cache entry, are named by them.
    Red team s32b: keyed by the output and the query alone, the same noise came back over
    changed confidential data (one income corrected), and two analysts' answers, one before
    and one after, differed by the exact change of the fidelity measure."""
    return ";".join(f"{t}={duckdb_schema.data_version(con, t)}" for t in sorted(tables))


def _output(con, request: Request, sql: str, policy, admin: bool) -> Output:
    """The synthetic output the query reads (``protected.name`` or just ``name``): for an
    analyst, one the policy releases (``releases:``); an admin may verify any."""
    visible = "" if admin else " AND split_part(lower(name), '.', 2) IN (SELECT unnest(?))"
    released = [] if admin else [list(policy.releases)]
    row = engine.one(
        con,
        f"SELECT name, sql_text, report, CAST(created_at AS VARCHAR) FROM {S}.outputs "
        f"WHERE method = 'synthesize' AND lower(name) = ?{visible}",
        [request.table, *released],
    )
    if row is None:
        names = [
            r[0]
            for r in con.execute(
                f"SELECT name FROM {S}.outputs WHERE method = 'synthesize'{visible} ORDER BY name",
                released,
            ).fetchall()
        ]
        raise PolicyViolation(
            f"{request.table} is not a released synthetic output; verification compares "
            "analyses of released synthetic outputs with the confidential data",
            f"released synthetic outputs: {', '.join(names) or 'none'}",
            sql=sql,
        )
    report = json.loads(row[2])
    schema, table = row[0].split(".", 1)
    columns = {c.lower() for c in duckdb_schema.table_columns(con, schema, table)}
    inputs = [i for e in request.estimands for i in e.inputs]
    used = {c.name.lower() for i in inputs for c in i.find_all(exp.Column)}
    used |= set(request.groups)
    if request.where is not None:
        used |= {c.name.lower() for c in request.where.find_all(exp.Column)}
    missing = sorted(used - columns)
    if missing:
        raise PolicyViolation(
            f"{row[0]} has no column {', '.join(missing)}",
            f"its columns: {', '.join(sorted(columns - {'synthetic_copy'}))}",
            sql=sql,
        )
    limits = report.get("verification") or {}
    return Output(
        name=row[0],
        source_sql=row[1],
        version=row[3],
        copies=int(report.get("copies") or 1),
        combining="full" if report.get("combining") == "full" else "partial",
        max_queries=int(limits.get("max_queries", DEFAULT_MAX_QUERIES)),
    )


def _min_frequency(policy, tables) -> int:
    """The largest minimum frequency the policy sets on the confidential tables read."""
    found = [DEFAULT_MIN_FREQUENCY]
    for name in tables:
        table = policy.table(name)
        if table is None:
            continue
        found += [rule.min_frequency for rule in table.protection.values()]
        if table.dp is not None and table.dp.min_frequency:
            found.append(table.dp.min_frequency)
    return max(found)


def _records(con, request: Request, source: exp.Expr, copies: bool, timeout, types) -> pd.DataFrame:
    sql = record_query(request, source, copies=copies, types=types)
    return engine.without_marks(engine.run(con, sql, timeout=timeout)).to_pandas()


def _types(con, source: exp.Expr) -> dict[str, exp.DataType]:
    """The column types of ``source`` (a table, or the output's source SELECT), read with
    ``LIMIT 0``: DuckDB plans it as an empty result, no row is read."""
    relation = source.subquery("__source") if isinstance(source, exp.Select) else source
    text = exp.select("*").from_(relation).limit(0).sql(dialect="duckdb")
    return column_types(con.execute(text).description)
