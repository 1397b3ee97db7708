"""Release databases open in the oldest DuckDB they are written for (1.0.0, a subprocess in its
own virtualenv made by scripts/old_reader_venv.sh) with the same tables, types and values as in
this DuckDB; and the Parquet export with its manifest."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import cli_fork
import duckdb
import pyarrow.parquet as pq
import pytest

import sqlsdc
from sqlsdc.engines.release_storage import NEWER_TYPES, OLDEST_READER, ReleaseFile
from sqlsdc.release import publish

ROOT = Path(__file__).resolve().parents[1]

# Every table, its column types and its values, as a reader sees them: Python's repr, with times
# with a time zone as UTC times without one (DuckDB 2.0 needs pytz to build zoned datetimes).
READER = r"""
import json, sys
import duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
con.execute("SET TimeZone = 'UTC'")
out = {"version": duckdb.__version__, "tables": {}}
for (table,) in con.sql("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall():
    columns = con.sql(
        f"SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = '{table}' "
        "ORDER BY column_index").fetchall()
    select = ", ".join(
        f'"{c}"::{t.replace("TIMESTAMP WITH TIME ZONE", "TIMESTAMP")}' if "TIME ZONE" in t
        else f'"{c}"' for c, t in columns)
    rows = sorted(repr(row) for row in con.sql(f'SELECT {select} FROM "{table}"').fetchall())
    out["tables"][table] = {"columns": columns, "rows": rows}
print(json.dumps(out))
"""

# One column of every type a release can hold: what protection jobs and guarded queries give
# (integers, HUGEINT sums, DOUBLE, DECIMAL, text, dates and times, lists, enums, structs) and
# DuckDB 2.0's own types that 1.x cannot read (NEWER_TYPES).
EVERY_TYPE = {
    "i": "42::INTEGER",
    "big": "-9007199254740993::BIGINT",
    "huge": "170141183460469231731687303715884105727::HUGEINT",
    "ubig": "18446744073709551615::UBIGINT",
    "dbl": "0.1::DOUBLE",
    "flt": "1.5::FLOAT",
    "dec": "123456789012345.678::DECIMAL(18,3)",
    "dec38": "-1.0000000001::DECIMAL(38,10)",
    "flag": "true",
    "txt": "'Zürich, \"quoted\"'",
    "blob": "'\\xAA\\x00'::BLOB",
    "day": "DATE '2024-02-29'",
    "at": "TIME '23:59:59.999999'",
    "ts": "TIMESTAMP '2024-01-02 03:04:05.123456'",
    "ts_ms": "'2024-01-02 03:04:05.123'::TIMESTAMP_MS",
    "ts_s": "'2024-01-02 03:04:05'::TIMESTAMP_S",
    "ts_ns": "'2024-01-02 03:04:05.123456'::TIMESTAMP_NS",
    "tstz": "TIMESTAMPTZ '2024-01-02 03:04:05.123456+00'",
    "span": "INTERVAL '1 month 2 days 3 seconds'",
    "id": "'00000000-0000-0000-0000-000000000001'::UUID",
    "ints": "[1, NULL, 3]",
    "words": "['a', 'b']",
    "pair": "{'k': 1, 'v': 'x'}",
    "kind": "'b'::ENUM('a', 'b')",
    "tstz_ns": "'2024-01-02 03:04:05.123456789+00'::TIMESTAMPTZ_NS",
    "at_ns": "'01:02:03.123456789'::TIME_NS",
    "bignum": "'123456789012345678901234567890123456789012345'::BIGNUM",
    "tstz_ns_list": "['2024-01-02 03:04:05.123456789+00'::TIMESTAMPTZ_NS]",
}


def old_reader() -> str | None:
    """The python of the old reader's virtualenv, or None (the test then skips; in CI, where
    .ci/run makes it, it fails)."""
    cache = os.environ.get("SQLSDC_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sqlsdc"
    )
    python = Path(cache) / f"duckdb-{OLDEST_READER.removeprefix('v')}" / "bin" / "python"
    if python.exists():
        return str(python)
    if os.environ.get("CI"):
        pytest.fail("no DuckDB 1.0.0 virtualenv: .ci/run makes it with scripts/old_reader_venv.sh")
    pytest.skip("no DuckDB 1.0.0 virtualenv: run bash scripts/old_reader_venv.sh")


def read(python: str, path: Path) -> dict:
    result = subprocess.run(
        [python, "-c", READER, str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_every_type_reads_back_identically_in_duckdb_1_0(tmp_path):
    python = old_reader()
    select = ", ".join(f"{value} AS {name}" for name, value in EVERY_TYPE.items())
    nulls = ", ".join(f"NULL AS {name}" for name in EVERY_TYPE)
    data = duckdb.connect().sql(f"SELECT {select} UNION ALL SELECT {nulls}").to_arrow_table()
    path = tmp_path / "types.duckdb"
    with ReleaseFile(path, OLDEST_READER) as release:
        release.write("every_type", data)
    old, new = read(python, path), read(sys.executable, path)
    assert old["version"] == "1.0.0" and new["version"] == duckdb.__version__
    assert old["tables"] == new["tables"]
    types = dict(new["tables"]["every_type"]["columns"])
    assert not any(kind in t for t in types.values() for kind in NEWER_TYPES)
    assert types["tstz_ns"] == "TIMESTAMP WITH TIME ZONE" and types["at_ns"] == "TIME"
    assert types["bignum"] == "VARCHAR" and types["tstz_ns_list"] == "TIMESTAMP WITH TIME ZONE[]"
    assert types["huge"] == "DECIMAL(38,0)" and types["dec"] == "DECIMAL(18,3)"
    assert types["ints"] == "INTEGER[]" and types["pair"] == "STRUCT(k INTEGER, v VARCHAR)"
    row = next(r for r in new["tables"]["every_type"]["rows"] if "Zürich" in r)
    assert "'123456789012345678901234567890123456789012345'" in row  # BIGNUM: exact digits
    assert "[datetime.datetime(2024, 1, 2, 3, 4, 5, 123457)]" in row  # TIMESTAMPTZ_NS: µs


def test_latest_storage_keeps_new_types_and_is_refused_by_duckdb_1_0(tmp_path):
    python = old_reader()
    path = tmp_path / "latest.duckdb"
    data = duckdb.connect().sql("SELECT '01:02:03.123456789'::TIME_NS AS t").to_arrow_table()
    with ReleaseFile(path, "latest") as release:
        release.write("t", data)
    assert read(sys.executable, path)["tables"]["t"]["columns"] == [["t", "TIME_NS"]]
    refused = subprocess.run(
        [python, "-c", READER, str(path)], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode != 0 and "version number" in refused.stderr


def test_published_release_opens_in_duckdb_1_0_as_in_this_duckdb(released):
    python = old_reader()
    _db, out, report = released
    assert report.storage_version == OLDEST_READER
    old, new = read(python, out), read(sys.executable, out)
    assert old["tables"] == new["tables"]
    assert set(old["tables"]) == {
        "old_people", "persons_by_region", "release_contents", "suppressed_enterprises",
        "suppressed_persons",
    }  # fmt: skip


def test_parquet_export_matches_the_release_and_its_manifest(released):
    _db, out, report = released
    parquet = Path(report.parquet)
    manifest = json.loads((parquet / "manifest.json").read_text())
    assert manifest["policy_version"] == report.policy_version
    assert manifest["release_id"] == report.release_id is not None
    assert manifest["created_at"].endswith("+00:00")
    assert sorted(p.name for p in parquet.iterdir()) == sorted(
        ["manifest.json", *(t["file"] for t in manifest["tables"])]
    )
    assert not list(parquet.parent.glob("*.partial"))
    release = duckdb.connect(str(out), read_only=True)
    try:
        for table in manifest["tables"]:
            file = parquet / table["file"]
            assert hashlib.sha256(file.read_bytes()).hexdigest() == table["sha256"]
            data = pq.read_table(file)
            assert data.num_rows == table["rows"]
            assert [[f.name, str(f.type)] for f in data.schema] == [
                [c["name"], c["type"]] for c in table["columns"]
            ]
            stored = release.sql(f'SELECT * FROM "{table["name"]}"').to_arrow_table()
            assert sorted(map(repr, stored.to_pylist())) == sorted(map(repr, data.to_pylist()))
    finally:
        release.close()
    methods = {t["name"]: (t["source"], t["method"]) for t in manifest["tables"]}
    assert methods == {
        "old_people": ("job", "suppress"),
        "persons_by_region": ("query", "suppress"),
        "suppressed_enterprises": ("suppression", "suppress"),
        "suppressed_persons": ("suppression", "suppress"),
    }
    assert "persons" not in methods and "release_contents" not in methods


def test_publish_storage_and_parquet_refusals(released, tmp_path):
    db, _out, report = released
    parquet = Path(report.parquet)
    with pytest.raises(sqlsdc.Error, match=r"unknown storage version 'v0.10.0'.*v1.0.0"):
        publish(db, tmp_path / "r.duckdb", "admin", storage="v0.10.0")
    with pytest.raises(sqlsdc.Error, match=r"parquet exists; pass --force"):
        publish(db, tmp_path / "r.duckdb", "admin", parquet=parquet)
    assert not (tmp_path / "r.duckdb").exists()

    def cli(*args):
        return cli_fork.run(["publish", db, *args], timeout=300)

    unknown = cli(str(tmp_path / "r.duckdb"), "--storage-version", "1.9.0")
    assert unknown.returncode == 1 and "unknown storage version '1.9.0'" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    again = cli(str(tmp_path / "r.duckdb"), "--parquet", str(tmp_path / "p"), "--format", "json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["storage_version"] == OLDEST_READER and report["parquet"] == str(tmp_path / "p")
    first = json.loads((tmp_path / "p" / "manifest.json").read_text())
    replaced = cli(str(tmp_path / "r.duckdb"), "--parquet", str(tmp_path / "p"), "--replace",
                   "--storage-version", "latest")  # fmt: skip
    assert replaced.returncode == 0, replaced.stderr
    second = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert second["release_id"] > first["release_id"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p", "r.duckdb"]


def test_a_synthetic_output_reads_in_duckdb_1_0_from_the_release(fresh_demo_db, tmp_path):
    """What a BI tool bundling DuckDB 1.x sees of a synthesis job's output: the same rows."""
    from sqlsdc.synth import synthesize

    python = old_reader()
    columns = ["region", "sex", "age", "income"]
    synthesize(fresh_demo_db, user="admin", source="persons", into="persons_syn", method="cart",
               columns=columns, rows=200, seed=3)  # fmt: skip
    out = tmp_path / "release.duckdb"
    report = publish(fresh_demo_db, out, "admin", include=["persons_syn"])
    assert any(t.table == "persons_syn" and t.method == "synthesize" for t in report.tables)
    old, new = read(python, out), read(sys.executable, out)
    assert old["version"] == OLDEST_READER.removeprefix("v")
    assert old["tables"]["persons_syn"] == new["tables"]["persons_syn"]
    assert len(old["tables"]["persons_syn"]["rows"]) == 200
    assert [c for c, _t in old["tables"]["persons_syn"]["columns"]] == columns
