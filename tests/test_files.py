"""Atomic writes (sqlsdc.files): the whole new file or the old one, never a temporary left."""

from __future__ import annotations

import pytest

from sqlsdc.errors import OperationalError
from sqlsdc.files import check_writable, write_atomically


def test_a_write_replaces_the_file_whole_and_leaves_nothing_beside_it(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    write_atomically(target, "new ✓")
    write_atomically(tmp_path / "plot.png", b"\x89PNG")
    check_writable(target)
    assert target.read_text("utf-8") == "new ✓"
    assert (tmp_path / "plot.png").read_bytes() == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "plot.png"]


def test_a_folder_that_takes_no_file_names_the_target_not_a_temporary_file(tmp_path):
    missing = tmp_path / "no" / "out.txt"
    for call in (lambda: write_atomically(missing, "x"), lambda: check_writable(missing)):
        with pytest.raises(OperationalError, match=f"cannot write {missing}: folder .* takes no"):
            call()
