"""Red team s48g: the release database and published files (the BI path).

The attacker is an analyst who is also a BI user: they read the release database, the Parquet
folder and every file in the release folder, and query the confidential database live through
the guard. Demo databases of 20,000 persons (CKM and suppression policies).

Finding (fixed):

1. A publication killed before it was recorded left its release readable. ``sqlsdc publish``
   wrote ``OUT.<id>.partial`` and ``DIR.<id>.partial/`` beside OUT (mode 0644/0755) and
   recorded the ledger rows and audit entry only after; a kill -9 (or a power loss) between
   the two left both, with every table of the publication (here 5 tables, 790 cells: the
   suppression patterns, a job output and a guarded query), in the folder BI users read, with
   no audit entry of the publication and no ledger row under it, and a later publication
   (another audit id) never removed them. The partial copies are now written inside a folder
   of mode 0700 beside OUT: what a killed publication leaves is unreadable to other users.

2. A policy that changed a table's ptable linked the two answers of every cell. The cell key
   is a function of the record keys alone, so a cell asked before and after a policy with a
   new counts ptable is looked up at the same key in two tables: each answer places the key in
   an interval of its table's row, and only the counts whose two intervals meet remain.
   Persons by municipality x sex and by municipality x education (915 cells, seed 7) asked
   under ``{D: 5, V: 3, js: 2}`` and again under ``{D: 8, V: 6, js: 2}``: 12 counts pinned
   exactly, 8 of them counts of 2 (which ``js: 2`` never shows), 7 more left with two
   candidates (4 queries, 0 wrong). The same holds for magnitude parameters and random
   rounding, whose uniform is the cell key too. ``policy apply`` now refuses a change of a
   table's keyed rule (ckm or round: method, ptable, magnitude parameters, base, rounding)
   while the ledger holds keyed cells of that table released since its last re-keying, and
   says to rekey it first (``sqlsdc rekey``, whose independent draws its admin accepts); the
   keyed rules of every version since that re-keying count, so a threshold policy in between
   does not reset it.

Held (one line each):
- live CKM counts beside a controlled-rounding job (base 5) of the same 327 municipality x sex
  cells: every cell keeps 3 to 9 candidate counts under both (ptable support x rounding
  interval), none pinned, none of 1-2 shown (1 job, 1 query).
- the suppression job's release: status only published/suppressed, no rule, its interval
  columns are the attacker's own LP bounds given that every listed cell holds a unit.
- the released patterns: a suppressed count and its sum are NULL; a sum is published only
  where its count is (557 cells, 98 + 10 hidden).
- Parquet footers: only ARROW:schema metadata, min/max/null counts of released values; no
  dictionary column (DuckDB gives plain strings), so no unused dictionary entries.
- rekey and republish: every cell's second value is an independent draw under new keys; the
  rekey command documents it and asks for confirmation (not a new finding).
- a publication's guarded queries are the live answers (same keys, same noise): republishing
  them unchanged adds nothing; they are charged and audited as queries.
- names: DuckDB compares table names by ASCII case only and does not normalise Unicode, while
  publish refuses names equal under str.casefold, a superset: no two names collide in the file.
- an analyst cannot publish: ``sqlsdc publish --as analyst`` exits 5 before any query runs,
  nothing written or charged.
- row order: job outputs and files are stored sorted by their released values (s30f), patterns
  by level and codes, queries in the order of released values.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys

import duckdb
import pytest

import sqlsdc
from sqlsdc.admin import apply, rekey
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.errors import PolicyError
from sqlsdc.policy import load_policy
from sqlsdc.release import publish

KILLED = r"""
import os, signal, sys
import sqlsdc.release_parquet as parquet

write = parquet.write_parquet

def then_killed(*args, **kwargs):
    write(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)  # written, not yet recorded nor moved into place

parquet.write_parquet = then_killed
from sqlsdc.release import publish

db, out, folder = sys.argv[1:4]
publish(db, out, "admin", analyst="analyst", parquet=folder,
        queries={"by_sex": "SELECT region, sex, COUNT(*) AS n FROM persons GROUP BY ALL"})
"""


def _readable_by_others(path) -> list:
    """Files under ``path`` that another user can open: every folder on the way searchable
    by others and the file readable by them."""
    found = []
    if path.is_file():
        return [path] if path.stat().st_mode & stat.S_IROTH else []
    if not path.stat().st_mode & stat.S_IXOTH:
        return []
    for child in path.iterdir():
        found += _readable_by_others(child)
    return found


def test_a_publication_killed_before_it_is_recorded_leaves_nothing_others_can_read(
    suppress_template, tmp_path
):
    """Fails on main: ``release.duckdb.<id>.partial`` (5 tables) and ``parquet.<id>.partial/``
    stayed beside OUT, world-readable, with no audit entry and no ledger row of the
    publication; a later publication did not remove them."""
    db, out, folder = tmp_path / "demo.duckdb", tmp_path / "release.duckdb", tmp_path / "parquet"
    shutil.copy(suppress_template, db)
    killed = subprocess.run([sys.executable, "-c", KILLED, str(db), str(out), str(folder)],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    left = sorted(p for p in tmp_path.iterdir() if p.name not in (db.name, f"{db.name}.lock"))
    assert left and not out.exists() and not folder.exists()  # the release was not put in place
    readable = [f for p in left for f in _readable_by_others(p)]
    assert readable == [], f"other users can read {[str(f.name) for f in readable]}"
    with duckdb.connect(str(db), read_only=True) as con:  # nothing recorded of it
        ((publications,),) = con.sql(
            "SELECT count(*) FROM sqlsdc.audit WHERE sql_text LIKE '{\"publish\"%'"
        ).fetchall()
    assert publications == 0


NEW_PTABLE = {"method": "ckm", "ptable": {"D": 8, "V": 6, "js": 2}}


def _policy(counts: dict | None = None, magnitudes: dict | None = None) -> object:
    """The demo policy with another protection of counts or magnitudes (default: as shipped)."""
    document = demo_policy().document_dict()
    for kind, rule in (("counts", counts), ("magnitudes", magnitudes)):
        if rule is not None:
            document["protection"][kind] = rule
    return load_policy(document, name="changed")


def test_a_new_ptable_for_cells_released_with_the_same_keys_is_refused(tmp_path):
    """Fails on main (the policy was applied): the same question asked under the old and the
    new ptable pinned 12 of 915 counts, 8 of them counts of 2. Re-keyed first, the change is
    applied; a change that leaves the keyed rules alone is applied too, and a policy without
    keyed counts in between does not let a new ptable through."""
    db = tmp_path / "demo.duckdb"  # its own: the ledger holds this test's cells only
    build_demo_database(db, persons=20_000, seed=7)
    with sqlsdc.connect(db, user="analyst") as con:
        asked = con.execute("SELECT municipality, sex, COUNT(*) FROM persons GROUP BY ALL")
        assert len(asked.fetchall()) > 300
    with pytest.raises(PolicyError, match=r"counts.* of (households|persons).*rekey"):
        apply(db, _policy(NEW_PTABLE), "admin")
    with pytest.raises(PolicyError, match="keyed noise"):  # random rounding: the same key
        apply(db, _policy({"method": "round", "base": 5, "rounding": "unbiased"}), "admin")
    apply(db, _policy(), "admin")  # the keyed rules as they are
    unkeyed = {"method": "threshold"}
    apply(db, _policy(unkeyed, unkeyed), "admin")  # no keyed noise for a while ...
    with pytest.raises(PolicyError, match="keyed noise"):  # ... then new ones: the old answers
        apply(db, _policy(NEW_PTABLE), "admin")
    rekey(db, "admin")  # every table: each value released later is an independent draw
    report = apply(db, _policy(NEW_PTABLE), "admin")
    assert report.version == 4


def test_a_later_publication_removes_the_folders_a_killed_one_left(suppress_template, tmp_path):
    """Fails on the base: the killed publication's ``release.duckdb.<id>.partial/`` and
    ``parquet.<id>.partial/`` (its release file and Parquet files, mode 0700) stayed beside
    OUT after the next publication, and after every later one. Now the next publication
    removes them (no process holds their lock: :mod:`sqlsdc.release_private`) and leaves
    nothing but its release."""
    db, out, folder = tmp_path / "demo.duckdb", tmp_path / "release.duckdb", tmp_path / "parquet"
    shutil.copy(suppress_template, db)
    killed = subprocess.run([sys.executable, "-c", KILLED, str(db), str(out), str(folder)],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    assert len(list(tmp_path.glob("*.partial"))) == 2
    publish(db, out, "admin", parquet=folder)
    assert out.is_file() and (folder / "manifest.json").is_file()
    assert list(tmp_path.glob("*.partial")) == []
