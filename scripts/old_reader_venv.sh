#!/usr/bin/env bash
# A virtualenv with the oldest DuckDB that release databases are written for (DuckDB 1.0.0), so
# that tests/test_release_readers.py can open a release with it in a subprocess. Idempotent;
# prints the venv's python. The cache folder: $SQLSDC_CACHE, else ~/.cache/sqlsdc.
set -euo pipefail
version="${1:-1.0.0}"
venv="${SQLSDC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sqlsdc}/duckdb-$version"
if ! "$venv/bin/python" -c "import duckdb, sys; sys.exit(duckdb.__version__ != '$version')" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "duckdb==$version"
fi
echo "$venv/bin/python"
