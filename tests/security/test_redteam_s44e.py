"""Red team s44e: the server and many users at once (issue 18), and session 43's leftovers.

The attacker is an analyst with a guarded connection or a server login; a finding is
something one analyst takes from the others (the audit log's room, budget, turns) or learns
beyond the protection. Demo database, 20,000 persons.

Worked, fixed here (W) and held (H), one line each:

- W  refused statements of 16,000 random characters in a loop (session 43's leftover): 400
     added 6.4 MB of text and 11.0 MB of file; now 255 KB and 1.3 MB (1,200 over two
     minutes: 1.8 MB). Through the server (3 sessions, 300 refusals of three kinds: guard,
     catalog, DECLARE SCROLL): 257,135 characters kept, the rest counted in one entry.
- W  the same from 8 threads of one process at once: 691,702 characters kept (2.6 x the
     rate) and 358 of 480 counted (lost updates, 55 summaries); now 480 of 480, one summary.
- W  accepted statements padded with a 990,000-character comment: 10 grew the file by
     11.0 MB in 2.9 s of CPU; now 4 a minute per user and process (4 MiB), then refused.
- W  (leftover) a noisy verification stopped after its charge: see
     tests/synth/test_verify_server.py (recorded, counted, the retry pays again visibly).
- H  COPY (TO STDOUT, FROM STDIN, to a file, of a query), EXPLAIN [ANALYZE], PREPARE /
     EXECUTE, VACUUM, ANALYZE, CHECKPOINT, LOAD, DO, two statements in one Query or one
     Parse: refused (42501). pg_class.reltuples -1, pg_relation_size 0, pg_stats and
     pg_stat_user_tables refused, duckdb_settings(), pg_read_file, lo_import refused.
- H  SET statement_timeout = 0 / memory_limit / threads / search_path = sqlsdc /
     sqlsdc.user = 'admin': echoed settings only (the guard's timeout, user and names
     unchanged); SET ROLE and session_authorization refused; qualified names
     (sqlsdc.audit, "sqlsdc"."secrets", db.main.persons) refused.
- H  extended protocol: a refused statement and a DP one in one pipeline (one Sync): the DP
     one skipped, nothing charged; Describe of a DP statement runs and charges it once
     (0.1), its two portals answer from it free; Execute of a closed portal 34000; an
     untyped text[] {R01,R01,R02} under = ANY($1) the same cells as IN.
- H  CancelRequest: 192 a second from one client, a 32-bit key: 260 days for the key space.
- H  policy apply removing the analyst while a session is open: its next statements and new
     logins refused; a WITH HOLD cursor declared before still fetches (released before).
- H  kill -9 of `policy apply` (lowering the analyst's epsilon 10 -> 5) at 17 times over
     its run: the file holds version 1 with 10 or version 2 with 5, never a mix; queries
     answered after each. kill -9 of `budget reset` and `budget set` at 12 times each over
     their runs: the budget before or after, never between.
- H  3 analyst processes spending DP on benefits while the admin lowers their limit to 3,
     six grants killed (SIGKILL) mid-run and one worker killed: spent 3.1 = limit 3.1 (3 +
     the one completed grant); no killed grant took effect; every charge audited.
- H  3 server sessions (743 DP queries in 30 s) while the admin ran grant, audit and budget
     9 times: all succeeded (at most 7.0 s, median 3.4 s for a turn); spent 10 <= 10.3.
"""

from __future__ import annotations

import random
import threading

import pytest

import sqlsdc
from sqlsdc.catalog import refusal_rate, store
from sqlsdc.engines.duckdb import open_database
from sqlsdc.guard import statement_rate


def _rows(db, sql, params=()):
    con = open_database(db, writes_data=False)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def _refused_statement(rnd: random.Random) -> str:
    """A refused statement of 16,000 random characters (the most the log keeps whole)."""
    text = "".join(rnd.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=15_950))
    return f"SELECT * FROM persons WHERE name = '{text}'"


def test_a_flood_of_refused_statements_is_counted_not_logged_whole(fresh_demo_db):
    """Before: each refused statement up to 16 KB was logged whole, so a loop of them grew
    the audit log by 2.6 MB a second (400 random ones: +6.4 MB of text, +11.0 MB of file);
    here 120 kept 1.9 MB of text in 120 entries. Now a user's refusals beyond 256 KiB (or
    600 entries) a minute are counted in one summary entry per minute (400: 255 KB of text,
    +1.3 MB of file, 1,200 over two minutes +1.8 MB); every refusal is still counted, and the
    accepted query after the flood, another user's refusal and the flood's own count are all
    in the log."""
    rnd, sent = random.Random(44), 120
    (first,) = _rows(fresh_demo_db, "SELECT coalesce(max(query_id), 0) FROM sqlsdc.audit")[0]
    start = store.now()
    with sqlsdc.connect(fresh_demo_db, user="analyst") as one, \
            sqlsdc.connect(fresh_demo_db, user="analyst") as other:  # fmt: skip
        for i in range(sent):  # two connections (a server's two sessions): one user's rate
            with pytest.raises(sqlsdc.Error):
                (one, other)[i % 2].execute(_refused_statement(rnd))
        one.execute("SELECT region, COUNT(*) FROM persons GROUP BY region").fetchall()
    with sqlsdc.connect(fresh_demo_db, user="admin") as con:
        with pytest.raises(sqlsdc.Error):
            con.execute(_refused_statement(rnd) + " -- the admin's")
    minutes = (store.now() - start.replace(second=0, microsecond=0)).seconds // 60 + 1
    logged = _rows(fresh_demo_db, "SELECT user_name, decision, sql_text, rows_returned "
                   "FROM sqlsdc.audit WHERE query_id > ? ORDER BY query_id", [first])  # fmt: skip
    flood = [r for r in logged if r[0] == "analyst" and r[1] == "refused"]
    whole = [r for r in flood if r[2] != refusal_rate.SUMMARY_TEXT]
    summaries = [r for r in flood if r[2] == refusal_rate.SUMMARY_TEXT]
    assert sum(len(r[2]) for r in whole) <= minutes * refusal_rate.KEPT_CHARACTERS_PER_MINUTE
    assert len(whole) + sum(r[3] for r in summaries) == sent, "every refusal is counted"
    assert 1 <= len(summaries) <= minutes
    assert logged[-2][:2] == ("analyst", "accepted") and logged[-2][3] == 8
    assert logged[-1][:2] == ("admin", "refused") and logged[-1][2].endswith("-- the admin's")


def test_a_refused_statement_spelled_as_the_summary_is_an_entry_like_any_other(fresh_demo_db):
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        for _ in range(3):
            with pytest.raises(sqlsdc.Error):
                con.execute(refusal_rate.SUMMARY_TEXT)
    logged = _rows(fresh_demo_db, "SELECT decision, rows_returned FROM sqlsdc.audit "
                   "WHERE sql_text = ?", [refusal_rate.SUMMARY_TEXT])  # fmt: skip
    assert logged == [("refused", None)] * 3


def test_refusals_from_threads_at_once_are_each_counted_once_within_the_rate(fresh_demo_db):
    """8 connections of one process (a server's sessions) refusing at once: before the rate's
    turn, each counted the others' uncommitted entries as absent (480 refusals kept 691,702
    characters, 2.6 times the rate), and the summary's count lost updates (358 of 480
    counted, in 55 summaries)."""
    threads, each = 8, 30
    failures: list[BaseException] = []

    def flood(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
                for _ in range(each):
                    with pytest.raises(sqlsdc.PolicyViolation):
                        con.execute(_refused_statement(rnd))
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    (first,) = _rows(fresh_demo_db, "SELECT coalesce(max(query_id), 0) FROM sqlsdc.audit")[0]
    start = store.now()
    running = [threading.Thread(target=flood, args=(i,)) for i in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    assert not failures, failures[0]
    minutes = (store.now() - start.replace(second=0, microsecond=0)).seconds // 60 + 1
    logged = _rows(fresh_demo_db, "SELECT sql_text, rows_returned FROM sqlsdc.audit "
                   "WHERE query_id > ? AND decision = 'refused'", [first])  # fmt: skip
    whole = [t for t, n in logged if n is None]
    summaries = [n for t, n in logged if n is not None]
    assert len(whole) + sum(summaries) == threads * each
    assert sum(map(len, whole)) <= minutes * refusal_rate.KEPT_CHARACTERS_PER_MINUTE
    assert len(summaries) <= minutes


def test_accepted_statements_long_with_comments_cannot_fill_the_disk(fresh_demo_db, monkeypatch):
    """Before: an accepted statement is logged whole, and a comment costs the engine nothing:
    ``SELECT COUNT(*) FROM persons /* 990,000 random characters */`` in a loop grew the file
    by 11.0 MB in 2.9 s of CPU (10 accepted: 3.8 MB a CPU second, beyond the refusals' 2.6
    MB/s). Now a user's statements may add 4 MiB a minute (longer than 4,096 characters
    until s46g, every one since): the 5th is refused before it runs, and audited."""
    monkeypatch.setattr(statement_rate, "CHARACTERS_PER_MINUTE", 4 * 2**20)  # conftest lifts it
    rnd = random.Random(45)
    accepted, refused = 0, None
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        for _ in range(10):  # two minutes at most take 8
            filler = "".join(rnd.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=990_000))
            try:
                con.execute(f"SELECT COUNT(*) FROM persons /* {filler} */").fetchall()
                accepted += 1
            except sqlsdc.PolicyViolation as e:
                refused = e
                break
        assert con.execute("SELECT COUNT(*) FROM persons").fetchall()  # short: within the minute
    assert refused is not None, f"{accepted} statements of 990,000 characters accepted"
    assert 4 <= accepted <= 8 and "the most the audit log takes from one user" in str(refused)
    (kept,) = _rows(fresh_demo_db, "SELECT sum(length(sql_text)) FROM sqlsdc.audit "
                    "WHERE user_name = 'analyst' AND decision = 'accepted'")[0]  # fmt: skip
    assert kept <= 2 * 4 * 2**20
