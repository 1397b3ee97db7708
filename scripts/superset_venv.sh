#!/usr/bin/env bash
# A virtualenv with Apache Superset, for scripts/bi_superset.sh (Superset pins SQLAlchemy 1.4 and
# Flask, so it never goes into sqlsdc's own environment). Idempotent; prints the venv's python.
# The cache folder: $SQLSDC_CACHE, else ~/.cache/sqlsdc. Superset 6.1.0 also needs rich (its
# `superset test-db`) and cachetools, and fails to start with Flask-Caching 2.5
# (SupersetMetastoreCache), hence the pins below.
set -euo pipefail
version="${1:-6.1.0}"
venv="${SQLSDC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sqlsdc}/superset-$version"
if ! "$venv/bin/python" -c "import superset, psycopg2, rich, cachetools" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "apache-superset==$version" "psycopg2-binary>=2.9" "rich>=13" "cachetools>=5" \
        "flask-caching>=2.1,<2.4"
fi
echo "$venv/bin/python"
