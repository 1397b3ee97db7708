"""A synthetic output made the way the synthesis job stores one (CONTRACTS19), for the
verification tests: a ``protected.<name>`` table (``synthetic_copy`` first when m ≥ 2) and its
``sqlsdc.outputs`` row with method ``synthesize`` and the report JSON. The records are a
bootstrap of the source with multiplicative noise on the numeric columns, so analyses of them
are close to, but not equal to, the confidential ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from sqlsdc.admin import apply
from sqlsdc.catalog import store
from sqlsdc.engines.duckdb import open_database
from sqlsdc.policy import load_policy

SOURCE_SQL = "SELECT region, sex, age, education, income FROM persons"


def make_synthetic_output(
    path: Path,
    name: str = "syn_persons",
    *,
    copies: int = 1,
    noise: float = 0.05,
    scale: float = 1.0,
    seed: int = 1,
    report: dict | None = None,
    release: bool = True,
) -> str:
    """Store the synthetic output ``protected.<name>`` in the database at ``path``, listed
    under the policy's ``releases:`` unless ``release`` is false."""
    con = open_database(path)
    try:
        data = con.execute(SOURCE_SQL).df()
        rng = np.random.default_rng(seed)
        parts = []
        for copy in range(1, copies + 1):
            part = data.sample(len(data), replace=True, random_state=rng).reset_index(drop=True)
            factor = scale * np.exp(rng.normal(0, noise, len(part)))
            part["income"] = (part["income"] * factor).round()
            if copies > 1:
                part.insert(0, "synthetic_copy", copy)
            parts.append(part)
        synthetic = pd.concat(parts)
        con.register("__synthetic", synthetic)
        con.execute("CREATE SCHEMA IF NOT EXISTS protected")
        con.execute(f"CREATE OR REPLACE TABLE protected.{name} AS SELECT * FROM __synthetic")
        con.unregister("__synthetic")
        version = store.current_policy(con)[0]
        details = {
            "synthetic": True,
            "method": "parametric",
            "source": "persons",
            "source_sql": SOURCE_SQL,
            "columns": list(data.columns),
            "seed": seed,
            "epsilon": None,
            "copies": copies,
            "parameters": {"noise": noise, "scale": scale},
            **(report or {}),
        }
        store.record_output(con, f"protected.{name}", "synthesize", SOURCE_SQL, "admin", version,
                            json.dumps(details))  # fmt: skip
        document = store.current_policy(con)[1]
    finally:
        con.close()
    if release:
        releases = [*(document.get("releases") or []), name]
        apply(path, load_policy({**document, "releases": releases}, name="releases"), "admin")
    return f"protected.{name}"


def synthetic_db(pristine: Path, folder: Path, **options) -> Path:
    """A copy of the demo database with one synthetic output (``make_synthetic_output``)."""
    path = folder / "synthetic.duckdb"
    shutil.copy(pristine, path)
    make_synthetic_output(path, **options)
    return path
