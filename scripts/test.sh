#!/usr/bin/env bash
# The one definition of "run all the tests": README's second command and .ci/run both call it.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e ".[test,spark]"
python3 -m ruff check .
python3 -m pytest -q -n auto --dist loadfile "$@"  # one worker per core, a file per worker
