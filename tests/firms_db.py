"""A small database of firms by nace x region, built from given turnovers per cell, with a
policy whose only admin is ``chief``: for jobs whose cells hold zeros and NULLs."""

from __future__ import annotations

from pathlib import Path

import duckdb
import yaml

import sqlsdc


def firms_db(folder: Path, cells: list[tuple[str, str, list[float | None]]]) -> Path:
    """``folder/firms.duckdb`` with one firm per value of each ``(nace, region, values)`` cell
    (turnover bounded to [0, 1000]), initialised with its policy."""
    db = folder / "firms.duckdb"
    rows = [(f"F{i}-{nace}{region}", nace, region, value)
            for nace, region, values in cells for i, value in enumerate(values)]  # fmt: skip
    with duckdb.connect(db) as raw:
        raw.execute("CREATE TABLE firms (firm VARCHAR, nace VARCHAR, region VARCHAR, "
                    "turnover DOUBLE)")  # fmt: skip
        raw.executemany("INSERT INTO firms VALUES (?, ?, ?, ?)", rows)
    dim = {"role": "dimension"}
    policy = {"tables": {"firms": {"privacy_unit": "firm", "columns": {
        "firm": {"role": "identifier"}, "nace": dim, "region": dim,
        "turnover": {"role": "measure", "bounds": [0, 1000]}}}},
        "users": {"chief": {"role": "admin"}}}  # fmt: skip
    (folder / "firms.yaml").write_text(yaml.safe_dump(policy))
    sqlsdc.init(db, folder / "firms.yaml", applied_by="chief")
    return db
