"""A table the policy does not declare, named to an admin command, is "not found" (exit code 8)
in every command, as a stored output that does not exist is; a public table where a
confidential one is needed is exit code 1 in every command. rekey, synthesize, anonymize and
protect said 1 for an undeclared table and budget 2 (new user s44g, issue 18). Real processes
(:mod:`cli_fork`) on one copy of the demo database; nothing here changes it."""

from __future__ import annotations

import shlex

import cli_fork
import pytest
from sqlsdc.cli import errors

NOT_DECLARED = "the policy declares no table 'nosuch' (its confidential tables: benefits, "
PUBLIC = "regions"

CASES = [  # (command, exit code, words of the message)
    ("rekey {db} --table nosuch --yes", errors.NOT_FOUND, NOT_DECLARED),  # 1
    ("synthesize {db} --from nosuch --into s --method parametric", errors.NOT_FOUND, NOT_DECLARED),
    (
        "synthesize {db} --from nosuch --into s --method dp-ipf --columns sex --epsilon 1",
        errors.NOT_FOUND,
        NOT_DECLARED,
    ),  # fmt: skip
    (
        "synthesize {db} --sql 'SELECT sex FROM nosuch' --into s --method parametric",
        errors.NOT_FOUND,
        NOT_DECLARED,
    ),  # "--sql may read the policy's tables only", 1  # fmt: skip
    ("anonymize {db} --from nosuch --into a --step pram:sex:p=0.9", errors.NOT_FOUND, NOT_DECLARED),
    (
        "protect {db} --sql 'SELECT region, COUNT(*) FROM nosuch GROUP BY region' --into p",
        errors.NOT_FOUND,
        NOT_DECLARED,
    ),  # fmt: skip
    (
        "budget {db} grant --for analyst --table nosuch --epsilon 1 --reason x",
        errors.NOT_FOUND,
        NOT_DECLARED,
    ),  # a usage error, 2  # fmt: skip
    ("publish {db} {tmp}/r.duckdb --include nosuch", errors.NOT_FOUND, "--include nosuch"),
    ("microdata-report {db} nosuch", errors.NOT_FOUND, "protected.nosuch does not exist"),
    ("synth-report {db} --table nosuch", errors.NOT_FOUND, "protected.nosuch does not exist"),
    # a public table: declared, but not what the command works on
    (f"rekey {{db}} --table {PUBLIC} --yes", errors.ERROR, "public tables have no record keys"),
    (
        f"synthesize {{db}} --from {PUBLIC} --into s --method parametric",
        errors.ERROR,
        "regions is not a confidential table of the policy",
    ),  # fmt: skip
    (
        f"anonymize {{db}} --from {PUBLIC} --into a --step pram:name:p=0.9",
        errors.ERROR,
        "regions is not a confidential table of the policy",
    ),  # fmt: skip
    (
        f"budget {{db}} grant --for analyst --table {PUBLIC} --epsilon 1 --reason x",
        errors.ERROR,
        "'regions' is a public table: no budget applies to it",
    ),  # a usage error, 2  # fmt: skip
]


@pytest.fixture(scope="module")
def db(pristine_demo_db, tmp_path_factory, copy_database):
    return copy_database(pristine_demo_db, tmp_path_factory.mktemp("table_names"))


@pytest.mark.parametrize("command, code, words", CASES, ids=[c[0][:60] for c in CASES])
def test_a_table_the_policy_does_not_declare_is_not_found(command, code, words, db, tmp_path):
    argv = shlex.split(command.format(db=db, tmp=tmp_path))
    result = cli_fork.run(argv, timeout=120)
    assert result.returncode == code, (result.returncode, result.stderr[-600:])
    assert words in result.stderr and "Traceback" not in result.stderr, result.stderr[-600:]
