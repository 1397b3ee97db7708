"""Ctrl-C in ``sqlsdc anonymize``'s risk step (session 47's new-user test: on 1,000,000
persons it ran 69 s and did not stop): a real process, SIGINT once its progress says the
risk step runs; it stops with ``Aborted!`` and exit code 1, no traceback, nothing stored (no
protected table, no output entry), its audit entry ``failed``."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time

import duckdb
from db_reads import protected_tables

# the risk step's record linkage made long (a loop that returns to Python, as the chunked
# nearest-neighbour queries do); the rest is the real command
SCRIPT = """
import sys, time
import sqlsdc.jobs.anonymize as job

def linkage(original, result):
    for _ in range(600):
        time.sleep(0.1)
    raise AssertionError("not interrupted")

job._linkage = linkage
from sqlsdc.cli.main import main
sys.argv = ["sqlsdc", *sys.argv[1:]]
main()
"""


def test_ctrl_c_in_the_risk_step_stops_cleanly(fresh_demo_db):
    args = ["anonymize", str(fresh_demo_db), "--from", "persons", "--into", "big_file",
            "--step", "microaggregate:income:k=5", "--keys", "municipality,sex,age"]  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", SCRIPT, *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    seen, deadline = "", time.monotonic() + 120
    with selectors.DefaultSelector() as chosen:
        chosen.register(child.stderr, selectors.EVENT_READ)
        while "record linkage" not in seen and time.monotonic() < deadline:
            if chosen.select(timeout=1):
                line = child.stderr.readline()
                if not line:
                    break
                seen += line
    assert "[5/6] measuring information loss and record linkage" in seen, seen
    os.kill(child.pid, signal.SIGINT)
    out, err = child.communicate(timeout=60)
    err = seen + err
    assert child.returncode == 1, err
    assert "Aborted!" in err and "Traceback" not in err, err
    assert "[4/6] measuring the risk of the anonymised records" in err
    assert "stored" not in out
    left = sorted(p.name for p in fresh_demo_db.parent.iterdir())
    # no temporary file, no WAL left behind (the lock file stays, as after any command)
    assert set(left) <= {"demo.duckdb", "demo.duckdb.lock"}, left
    assert protected_tables(fresh_demo_db) == []
    con = duckdb.connect(str(fresh_demo_db), read_only=True)
    try:
        outputs = con.execute("SELECT count(*) FROM sqlsdc.outputs WHERE name LIKE '%big_file'")
        assert outputs.fetchall() == [(0,)]
        decision, reason = con.execute("SELECT decision, reason FROM sqlsdc.audit "
                                       "ORDER BY query_id DESC LIMIT 1").fetchall()[0]  # fmt: skip
    finally:
        con.close()
    assert decision == "failed" and "interrupted" in reason
