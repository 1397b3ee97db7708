#!/usr/bin/env bash
# The one definition of "run all the tests": README's second command and .ci/run both call it.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e ".[test,spark]"
python3 -m ruff check .
# The suite starts ~100 Python processes that import sqlsdc: let them share compiled modules
# (__pycache__, ignored by git) instead of each compiling sqlsdc again, 0.2 s apiece, and let
# pytest keep its rewritten test modules
unset PYTHONDONTWRITEBYTECODE
python3 -m pytest -q -n auto --dist loadfile "$@"  # one worker per core, a file per worker
