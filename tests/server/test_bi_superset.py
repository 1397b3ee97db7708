"""Apache Superset's connection test, dataset sync and charts against ``sqlsdc serve``
(scripts/bi_superset.sh). Superset lives in its own virtualenv: the test runs when
``SUPERSET_PYTHON`` names its Python or scripts/superset_venv.sh has made one, and is skipped
otherwise (CI does not install Superset)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _superset_python() -> str | None:
    home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sqlsdc"
    cache = Path(os.environ.get("SQLSDC_CACHE") or home)
    for python in (os.environ.get("SUPERSET_PYTHON"), cache / "superset-6.1.0" / "bin" / "python"):
        if python and Path(python).is_file():
            found = subprocess.run([str(python), "-c", "import superset, psycopg2, rich"],
                                   capture_output=True)  # fmt: skip
            if found.returncode == 0:
                return str(python)
    return None


@pytest.mark.slow
def test_superset_connects_syncs_and_charts_through_the_guard():
    python = _superset_python()
    if python is None:
        pytest.skip("Apache Superset is not installed: bash scripts/superset_venv.sh")
    done = subprocess.run(
        ["bash", "scripts/bi_superset.sh"], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "SUPERSET_PYTHON": python, "PYTHON": sys.executable},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "ok   superset test-db" in out and "all Superset checks hold" in out
    assert "FROM public.persons GROUP BY region" in out  # as Superset writes it
    assert "refused: row-level query (SQL Lab): row-level output" in out
