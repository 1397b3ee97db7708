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


def test_a_link_is_followed_and_stays_a_link(tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old")
    (tmp_path / "link.txt").symlink_to(target)
    write_atomically(tmp_path / "link.txt", "new")
    assert (tmp_path / "link.txt").is_symlink() and target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "real.txt"]


def test_what_is_no_regular_file_is_written_into_not_replaced(tmp_path):
    """A named pipe (as /dev/stdout or a terminal): the rename replaced /dev/full itself with
    a regular file when root wrote there with --force."""
    import os
    import stat
    import threading

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    read = []
    reader = threading.Thread(target=lambda: read.append(pipe.read_bytes()))
    reader.start()
    write_atomically(pipe, "through the pipe")
    reader.join(10)
    assert read == [b"through the pipe"] and stat.S_ISFIFO(os.lstat(pipe).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_database_is_never_renamed_over_what_is_no_regular_file(tmp_path):
    """demo --db and publish OUT build a file aside and rename it into place: with --force,
    root's `demo --db /dev/null` would have replaced the device."""
    import os

    from sqlsdc.demo.build import build_demo_database
    from sqlsdc.errors import Error
    from sqlsdc.files import check_replaceable

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(Error, match="pipe is no regular file"):
        build_demo_database(pipe, persons=100)
    check_replaceable(tmp_path / "new.duckdb")  # absent, or a file: replaced as asked
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_new_file_has_the_umasks_mode_and_a_replaced_one_keeps_its_own(tmp_path):
    """mkstemp's 0600 was every written file's mode: `ptable -o` for colleagues was
    -rw------- and --force took a shared file's group permission away (new user s44g)."""
    import os
    import stat

    def mode(path):
        return stat.S_IMODE(os.stat(path).st_mode)

    before = os.umask(0o027)
    try:
        write_atomically(tmp_path / "new.csv", "a")
    finally:
        os.umask(before)
    assert mode(tmp_path / "new.csv") == 0o640
    shared = tmp_path / "shared.csv"
    shared.write_text("old")
    shared.chmod(0o664)
    write_atomically(shared, "new")
    assert mode(shared) == 0o664 and shared.read_text() == "new"
    link = tmp_path / "link.csv"
    link.symlink_to(shared)
    shared.chmod(0o604)
    write_atomically(link, "again")  # the file it names keeps its mode
    assert mode(shared) == 0o604 and link.is_symlink()
