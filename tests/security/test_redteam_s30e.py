"""Red-team round of session 30 (fifth), with an analyst's Python connection only, against the
API beside ``cursor.execute(...).fetchall()``: ``Connection.verify``, ``pram_counts``,
``cursor.cell_accuracy()`` / ``cell_status()`` and their hidden columns, ``explain``,
``remaining_budget``, ``stored_schemas``, the other result forms (``df``, ``fetchdf``, ``arrow``,
``fetch_arrow_table``, ``description``), ``executemany``, ``set_dp_noise`` and a closed
connection.

What succeeded, and was closed:

* ``set_dp_noise(x)`` with ``x`` an object whose ``__bool__`` says True once and False after:
  the analysts' refusal asked ``not enabled`` (False: allowed), the setting stored
  ``bool(enabled)`` (False): an analyst's DP answers came without noise, the exact bounded
  values (``COUNT(*) FROM benefits WHERE amount > 302``: 12200, the admin's noiseless answer).
  ``set_dp_noise`` now takes True or False only.
* ``verify(sql, mode=M)`` with ``M`` a ``str`` subclass whose ``__eq__`` says yes to the first
  comparison only: ``mode in MODES`` passed, every later ``mode == "interval"`` and ``mode ==
  "noisy"`` failed, so the analysts' refusal of interval mode, the charge and the noisy branch
  were all skipped and the answer was the admins' decile interval of the fidelity, without the
  suppression of cells under the minimum frequency, for nothing: the exact oracle that read
  one person's income to the cent in 30-60 requests (``test_redteam_s25.py``), and the answer
  went into the cache under the noisy mode's key. The mode (and the statement, as ``execute``
  already did) is now read as a built-in str and matched to the modes' own strings.
* the ε of a noisy verification is the analyst's own exact number, and was charged exactly:
  ``Fraction(1, 10**2000 + 1)`` (an int or Fraction skips the 40-digit bound that text gets)
  charged three times, or ``"1/p"`` for 124 distinct 40-digit p (2.7 s, within the 200
  verifications an output allows), made the sum of the analyst's spending a fraction whose
  denominator has more than 4,300 digits: ``sqlsdc budget`` then failed for the admin with an
  internal error (Python's limit on printing integers), and so would any message that shows
  that sum. Availability, not disclosure (the checks compare fractions without printing them),
  but an analyst broke an admin's tool. A verification's ε now has at most 40 digits per part
  and is used and charged rounded down to a multiple of 10⁻⁹ (a little more noise, the same
  charge), so every charge's denominator divides 10⁹ and no choice of ε can grow the sums.
* ``Connection.stored_schemas(schema)`` (public, there for the server's catalog) listed every
  table and column of any schema to an analyst: outputs not released (their names say what
  was studied), tables outside the policy, record keys (``__rkey``) and the catalog
  (``sqlsdc.secrets``, ``sqlsdc.ckm_mix`` and their columns), while the guard refuses an
  undeclared table and a missing one with the same message. It now lists to users other than
  admins only what the guard's table check lets them read under that schema's name (today
  nothing qualified), without ``__`` columns: the catalog model of ``sqlsdc.server.visible``.
* ``connect(..., timeout=t)`` with ``t`` a float subclass that compared as 1 s and converted
  to a day passed the check against the policy's statement timeout and was stored as
  ``float(t)``: availability (one analyst's statement holds the database file that long). The
  timeout is now converted once, then checked.
* ``explain`` (and ``cursor.query``) returned the check cache's own ``ProtectedQuery``,
  shared by every connection of the process: its ``columns`` list, status dict and sqlglot
  ``tree`` are mutable, so marking the count column a key made later runs of the statement
  record no ledger row for it, and the Spark path (``sqlsdc.guard.spark``) runs that very
  ``tree``: rewritten with sqlglot's public methods, it could have run the analyst's own SQL.
  Callers outside the guard now get a copy that shares nothing mutable
  (``ProtectedQuery.detached``).

What held (one test each below): floats, zero, negatives and text beyond the bounds are
refused before anything is charged; the same ε written two ways is one answer from the cache;
``explain`` shows no byte of the PRF secret and no record key; the hidden status and accuracy
columns reach no result form (rows, pandas, Arrow, description); ``cell_accuracy`` lists no
cell-key magnitude cell (its noise scales with the largest contribution); an analyst cannot
turn DP noise off with False; ``executemany`` checks every parameter set and keeps the last
result; ``pram_counts`` reads released anonymised outputs only; ``con.policy``'s containers are
read-only; every public method of a closed connection raises ``InterfaceError`` and a closed
cursor keeps no result.

Observed, not a leak: ``explain`` shows the protected SQL with the policy's cell-key constants
(the ptable is public by design: the accuracy of a count is its variance) and the exact-cell SQL
of a DP stage, which names no value.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import duckdb
import pytest
from synth.verify_support import make_synthetic_output

import sqlsdc
from sqlsdc.catalog.store import S
from sqlsdc.errors import (
    AccessDenied,
    InterfaceError,
    PolicyViolation,
    ProgrammingError,
)

GRID = 10**9
AVG_SYN = "SELECT sex, AVG(income) FROM syn_persons GROUP BY sex"  # two cells, charged twice


@pytest.fixture(scope="module")
def synthetic_template(pristine_demo_db, tmp_path_factory, copy_database):
    """The demo database with a released synthetic output, ``syn_persons`` (made once: a
    bootstrap, its storing and a policy application; each test changes a copy)."""
    path = copy_database(pristine_demo_db, tmp_path_factory.mktemp("synthetic"))
    make_synthetic_output(path)
    return path


@pytest.fixture
def synthetic(synthetic_template, tmp_path, copy_database):
    """A private copy of :func:`synthetic_template`."""
    return copy_database(synthetic_template, tmp_path)


def _spent(con) -> Fraction:
    """The analyst's own spending (the budget of user ``analyst`` on all tables)."""
    (status,) = [s for s in con.remaining_budget() if s.key.user == con.user]
    return status.spent.epsilon


@pytest.mark.parametrize(
    "epsilon",
    [Fraction(1, 10**2000 + 1), 10**5000, Fraction(10**50, 10**50 + 1), "1e-400", "1/1" + "0" * 45],
    ids=["fraction-2000-digits", "int-5000-digits", "fraction-51-digits", "exponent", "text"],
)
def test_a_verification_epsilon_with_more_digits_than_text_allows_is_refused_uncharged(
    synthetic, epsilon
):
    """Three charges of ``Fraction(1, 10**2000 + 1)`` broke ``sqlsdc budget`` for the admin."""
    with sqlsdc.connect(synthetic, user="analyst") as con:
        before = _spent(con)
        with pytest.raises((ProgrammingError, ValueError), match="digits"):
            con.verify(AVG_SYN, mode="noisy", epsilon=epsilon)
        assert _spent(con) == before


def test_verification_charges_stay_on_a_grid_whatever_epsilon_is_asked(synthetic):
    """``"k·10**36/p"`` for distinct 40-digit p: each charge had its own 40-digit denominator,
    and 124 of them a sum no budget listing could print. Now each ε is used and charged
    rounded down to a multiple of 10⁻⁹: the sum's denominator divides 10⁹."""
    with sqlsdc.connect(synthetic, user="analyst") as con:
        before = _spent(con)
        asked = [Fraction(k * 10**36, 10**39 + k) for k in range(1, 13)]  # about k/1000
        for epsilon in asked:
            answer = con.verify(AVG_SYN, mode="noisy", epsilon=epsilon)
            charged = Fraction(answer.epsilon_spent)
            assert charged == 2 * Fraction(int(epsilon * GRID), GRID) and charged <= 2 * epsilon
        spent = _spent(con) - before
        assert GRID % spent.denominator == 0
        assert spent == 2 * sum(Fraction(int(e * GRID), GRID) for e in asked)


def test_an_epsilon_below_the_grid_is_refused_uncharged(synthetic):
    with sqlsdc.connect(synthetic, user="analyst") as con:
        before = _spent(con)
        with pytest.raises(ProgrammingError, match="at least"):
            con.verify(AVG_SYN, mode="noisy", epsilon="1/1000000001")
        assert _spent(con) == before


def test_one_epsilon_written_two_ways_is_one_cached_answer(synthetic):
    """``1/3`` is used as 0.333333333, so ``"0.333333333"`` is the same request: the same
    noisy fidelity, from the cache, free."""
    with sqlsdc.connect(synthetic, user="analyst") as con:
        first = con.verify(AVG_SYN, mode="noisy", epsilon="1/3")
        spent = _spent(con)
        again = con.verify(AVG_SYN, mode="noisy", epsilon="0.333333333")
        assert again.cells == first.cells and again.cached
        assert Fraction(first.epsilon_spent) == Fraction(2 * 333333333, GRID)
        assert _spent(con) == spent


@pytest.mark.parametrize("epsilon", [0.5, float("inf"), float("nan"), True, 0, -1, None])
def test_a_verification_epsilon_that_is_not_a_positive_exact_number_is_refused(synthetic, epsilon):
    with sqlsdc.connect(synthetic, user="analyst") as con:
        before = _spent(con)
        with pytest.raises((TypeError, ProgrammingError)):
            con.verify(AVG_SYN, mode="noisy", epsilon=epsilon)
        assert _spent(con) == before


def test_explain_shows_no_byte_of_the_secret_and_no_record_key(ckm_db):
    raw = duckdb.connect(str(ckm_db), read_only=True)
    try:
        secret = bytes(raw.execute(f"SELECT material FROM {S}.secrets").fetchall()[0][0])
        keys = [str(k) for (k,) in raw.execute("SELECT __rkey FROM persons LIMIT 50").fetchall()]
    finally:
        raw.close()
    with sqlsdc.connect(ckm_db, user="analyst") as con:
        shown = []
        for sql in ("SELECT region, COUNT(*), SUM(income) FROM persons GROUP BY region",
                    "SELECT COUNT(*) FROM benefits WHERE amount > 100"):  # fmt: skip
            query = con.explain(sql)
            shown += [str(query), repr(query.to_dict())]
    text = "\n".join(shown)
    assert secret.hex() not in text and secret.hex().upper() not in text
    assert not any(secret[i : i + 8].hex() in text for i in range(0, len(secret) - 8))
    assert not any(f" {k} " in text or f"({k})" in text for k in keys if len(k) > 4)


def test_hidden_status_and_accuracy_columns_reach_no_result_form(ckm_db):
    with sqlsdc.connect(ckm_db, user="analyst") as con:
        cur = con.execute("SELECT region, COUNT(*) AS n, SUM(income) AS s FROM persons "
                          "GROUP BY region ORDER BY region")  # fmt: skip
        names = ["region", "n", "s"]
        assert [d[0] for d in cur.description] == names
        assert list(cur.df().columns) == names and list(cur.fetchdf().columns) == names
        assert cur.arrow().column_names == names
        assert cur.fetch_arrow_table().column_names == names
        assert all(len(row) == 3 for row in cur.fetchall())
        dp = con.execute("SELECT COUNT(*) AS n FROM benefits WHERE amount > 100")
        assert dp.arrow().column_names == ["n"] and list(dp.df().columns) == ["n"]
        assert set(dp.cell_status().columns) == {"n"}


def test_cell_accuracy_lists_no_cell_key_magnitude_cell(ckm_db):
    with sqlsdc.connect(ckm_db, user="analyst") as con:
        cur = con.execute("SELECT region, COUNT(*) AS n, SUM(income) AS s FROM persons "
                          "GROUP BY region")  # fmt: skip
        accuracy = cur.cell_accuracy()
    assert set(accuracy["column"]) == {"n"}  # s's noise scales with its largest value
    assert accuracy["variance"].nunique() == 1  # from the ptable, not from the true count


def test_an_analyst_cannot_turn_dp_noise_off(ckm_db):
    with sqlsdc.connect(ckm_db, user="analyst") as con:
        with pytest.raises(AccessDenied, match="only admins"):
            con.set_dp_noise(False)
        assert con.dp_noise


def test_executemany_checks_every_parameter_set_and_keeps_the_last_result(ckm_db):
    sql = "SELECT COUNT(*) FROM persons WHERE region = ?"
    with sqlsdc.connect(ckm_db, user="analyst") as con:
        last = con.execute(sql, ["R02"]).fetchall()
        assert con.cursor().executemany(sql, [["R01"], ["R02"]]).fetchall() == last
        with pytest.raises(PolicyViolation):
            con.cursor().executemany("SELECT income FROM persons WHERE region = ?", [["R01"]])


def test_pram_counts_read_released_anonymised_outputs_only(synthetic):
    with sqlsdc.connect(synthetic, user="analyst") as con:
        with pytest.raises(PolicyViolation, match="not a released output"):
            con.pram_counts("SELECT region, COUNT(*) FROM persons GROUP BY region")
        with pytest.raises(PolicyViolation, match="no PRAMmed column"):
            con.pram_counts("SELECT sex, COUNT(*) FROM syn_persons GROUP BY sex")


def test_a_closed_connection_answers_nothing_and_a_closed_cursor_keeps_nothing(synthetic):
    con = sqlsdc.connect(synthetic, user="analyst")
    cur = con.execute("SELECT region, COUNT(*) FROM persons GROUP BY region")
    cur.close()
    with pytest.raises(InterfaceError, match="closed"):  # as a closed connection's calls
        cur.fetchall()
    with pytest.raises(InterfaceError, match="closed"):
        cur.cell_accuracy()
    cur = con.cursor()
    con.close()
    calls = [
        lambda: cur.execute("SELECT COUNT(*) FROM persons"),
        lambda: con.explain("SELECT COUNT(*) FROM persons"),
        lambda: con.verify(AVG_SYN, mode="noisy", epsilon="1/4"),
        lambda: con.pram_counts("SELECT sex, COUNT(*) FROM syn_persons GROUP BY sex"),
        lambda: con.remaining_budget(),
        lambda: con.stored_schemas("protected"),
        lambda: con.set_dp_noise(True),
        lambda: con.cursor(),
    ]
    for call in calls:
        with pytest.raises(InterfaceError, match="closed"):
            call()


def test_stored_schemas_name_no_table_an_analyst_may_not_read(synthetic):
    """``stored_schemas`` listed every table and column of any schema to an analyst: outputs
    not released (``protected.r02_income_study``), tables outside the policy, record keys and
    the catalog (``sqlsdc.secrets``, ``sqlsdc.ckm_mix``), while a query names none of them
    (an undeclared table and a missing one are refused alike). Now an analyst gets what the
    guard lets them read under that schema's name (today: nothing qualified); admins all."""
    make_synthetic_output(synthetic, "r02_income_study", release=False)
    raw = duckdb.connect(str(synthetic))
    raw.execute("CREATE TABLE main.layoffs_plan (person_id INTEGER, salary_cut DOUBLE)")
    raw.close()
    with sqlsdc.connect(synthetic, user="analyst") as con:
        for schema in ("protected", "synthetic", "main", "sqlsdc", "information_schema"):
            assert con.stored_schemas(schema) == {}
        refusals = []
        for name in ("layoffs_plan", "no_such_plan"):
            with pytest.raises(PolicyViolation) as refused:
                con.execute(f"SELECT COUNT(*) FROM {name}")
            refusals.append(str(refused.value).replace(name, "T"))
        assert refusals[0] == refusals[1]
    with sqlsdc.connect(synthetic, user="admin") as admin:
        assert {"r02_income_study", "syn_persons"} <= set(admin.stored_schemas("protected"))
        assert "__rkey" in admin.stored_schemas("main")["persons"]


class _LyingMode(str):
    """ "noisy" to the first comparison (the membership test of the modes), no to all later."""

    def __init__(self, text):
        self.compared = 0

    def __eq__(self, other):
        self.compared += 1
        return self.compared == 1

    __hash__ = str.__hash__


def test_a_mode_given_as_a_str_subclass_is_the_mode_it_spells(synthetic):
    """A ``str`` subclass whose ``__eq__`` said yes to ``mode in MODES`` and no to every
    ``mode == ...`` passed the analysts' check, was charged nothing (``mode == "noisy"``) and
    answered the admins' decile intervals without the suppression of small cells: the oracle
    that read one income to the cent (``test_redteam_s25.py``). The mode is now read as a
    built-in str."""
    mode = _LyingMode("noisy")
    with sqlsdc.connect(synthetic, user="analyst") as con:
        before = _spent(con)
        answer = con.verify(AVG_SYN, mode=mode, epsilon="1/8")
        assert all("fm_noisy" in c and "fm_interval" not in c for c in answer.cells)
        assert _spent(con) - before == Fraction(2, 8) == Fraction(answer.epsilon_spent)
        with pytest.raises(PolicyViolation, match="interval mode is for admins"):
            con.verify(AVG_SYN, mode=_LyingMode("interval"))
        with pytest.raises(ProgrammingError, match="mode must be one of"):
            con.verify(AVG_SYN, mode=_LyingMode("neither"), epsilon="1/8")
    assert mode.compared == 0


class _Flip:
    """True to the first question, False to every later one."""

    def __init__(self):
        self.asked = 0

    def __bool__(self):
        self.asked += 1
        return self.asked == 1


def test_an_analyst_cannot_turn_dp_noise_off_with_an_object_that_changes_its_truth(ckm_db):
    """``set_dp_noise`` asked ``not enabled`` (True: no refusal) and then stored
    ``bool(enabled)`` (False): DP answers without noise, the exact bounded values an admin's
    semantics mode shows. It now takes True or False only."""
    with sqlsdc.connect(ckm_db, user="analyst") as con:
        flip = _Flip()
        with pytest.raises(ProgrammingError, match="True or False"):
            con.set_dp_noise(flip)
        assert con.dp_noise and flip.asked == 0
        with pytest.raises(ProgrammingError):
            con.set_dp_noise(0)
        assert con.dp_noise


class _ShortTimeout(float):
    """Compares as one second, converts to a day."""

    def __gt__(self, other):
        return 1.0 > other

    def __le__(self, other):
        return 1.0 <= other

    def __float__(self):
        return 86400.0


def test_a_timeout_is_read_once_as_the_number_it_converts_to(ckm_db):
    """A float subclass that compared as 1 s passed the check against the policy's statement
    timeout and was stored as ``float(asked)``, a day: one analyst's statements held the
    database file that long. It is now converted once, then checked."""
    with pytest.raises(AccessDenied, match="above the policy's statement timeout"):
        sqlsdc.connect(ckm_db, user="analyst", timeout=_ShortTimeout(1.0))
    with sqlsdc.connect(ckm_db, user="analyst", timeout=2) as con:
        assert con.timeout == 2.0


def _ledger_rows(path, query_id: int) -> int:
    raw = duckdb.connect(str(path), read_only=True)
    try:
        return raw.execute(
            f"SELECT count(*) FROM {S}.ledger WHERE query_id = ?", [query_id]
        ).fetchall()[0][0]
    finally:
        raw.close()


def test_changing_what_explain_returned_changes_no_later_statement(fresh_demo_db):
    """``explain`` returned the check cache's own object, shared by every connection of the
    process: marking its count column a key (``columns`` is a list) made the next run of the
    statement record no ledger row for it, and Spark runs that object's ``tree``, which an
    analyst could rewrite with sqlglot. ``explain`` and ``cursor.query`` now give copies."""
    sql = "SELECT region, COUNT(*) AS n FROM persons WHERE age > 80 GROUP BY region"
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        shown = con.explain(sql)
        text = shown.tree.sql()
        shown.columns[1] = replace(shown.columns[1], mechanism="key")
        shown.status_columns.clear()
        shown.tree.set("expressions", shown.tree.expressions[:1])
        cur = con.execute(sql)
        assert cur.query.columns[1].mechanism != "key"
        cur.query.columns.clear()
        runs = [(cur.query_id, len(cur.fetchall()))]
        again = con.execute(sql)
        runs.append((again.query_id, len(again.fetchall())))
        with sqlsdc.connect(fresh_demo_db, user="analyst") as other:
            fresh = other.explain(sql)
        assert fresh.columns[1].mechanism != "key" and fresh.tree.sql() == text
    for query_id, released in runs:
        assert _ledger_rows(fresh_demo_db, query_id) == released > 0


def test_the_policy_an_analyst_is_shown_cannot_be_changed(synthetic):
    """``con.policy`` is the guard's own policy: listing an output under ``releases`` or
    making a table public through it would change what the guard allows. Its containers are
    read-only."""
    with sqlsdc.connect(synthetic, user="analyst") as con:
        policy = con.policy
        with pytest.raises((TypeError, AttributeError)):
            policy.releases.append("persons")  # a tuple
        with pytest.raises(TypeError):
            policy.tables["persons2"] = policy.table("persons")
        with pytest.raises(TypeError):
            policy.table("persons").columns["sex"] = None
        with pytest.raises((TypeError, AttributeError)):
            policy.users["analyst"] = policy.users["admin"]
