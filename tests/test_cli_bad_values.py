"""Out-of-range numbers on the command line end in a message and their class's exit code, never
in "a bug in sqlsdc" (exit 70), a hang or a server that refuses every session (ISSUE18
must-have 3): huge integers (10**20), NaN and overflowing floats. Real processes (:mod:`cli_fork`)
on a copy of the demo database."""

from __future__ import annotations

import shutil

import cli_fork
import pytest
from sqlsdc.cli import errors

HUGE = 10**20
BY_REGION = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"
SYNTH = ("synthesize", "{db}", "--from", "persons", "--into", "s", "--method", "parametric",
         "--columns", "sex,age")  # fmt: skip
ANONYMIZE = ("anonymize", "{db}", "--from", "persons", "--into", "a", "--step")


@pytest.fixture(scope="module")
def db(pristine_demo_db, tmp_path_factory):
    path = tmp_path_factory.mktemp("bad_values") / "demo.duckdb"
    shutil.copy(pristine_demo_db, path)
    return path


@pytest.mark.parametrize(
    "args, code, words",
    [
        (("audit", "{db}", "--limit", HUGE), errors.USAGE, "1<=x<=1000000"),
        (("demo", "--db", "{tmp}/d.duckdb", "--persons", HUGE), errors.USAGE, "100<=x<="),
        (
            ("demo", "--db", "{tmp}/d.duckdb", "--persons", 100, "--seed", -1),
            errors.USAGE,
            "x>=0",
        ),  # fmt: skip
        (
            (
                "protect",
                "{db}",
                "--sql",
                BY_REGION,
                "--into",
                "r",
                "--method",
                "round",
                "--base",
                HUGE,
            ),
            errors.USAGE,
            "2<=x<=1000000",
        ),  # fmt: skip
        (
            (
                "protect",
                "{db}",
                "--sql",
                BY_REGION,
                "--into",
                "r",
                "--method",
                "round",
                "--base",
                5,
                "--time-limit",
                "nan",
            ),
            errors.USAGE,
            "not a finite number of seconds",
        ),  # fmt: skip
        (
            ("serve", "{db}", "--insecure", "--port", 0, "--statement-timeout", "nan"),
            errors.USAGE,
            "not a finite number of seconds",
        ),  # fmt: skip
        (
            ("serve", "{db}", "--insecure", "--port", 0, "--idle-timeout", "nan"),
            errors.USAGE,
            "not a finite number of seconds",
        ),  # fmt: skip
        ((*ANONYMIZE, "noise:income:c=nan"), errors.ERROR, "c='nan' is not a finite number"),
        ((*ANONYMIZE, "noise:income:c=1e308"), errors.ERROR, "noise with c=1e+308 cannot be drawn"),
        (
            (*ANONYMIZE, "recode:age:breaks=0/nan/100"),
            errors.ERROR,
            "breaks is a /-separated list of finite numbers",
        ),  # fmt: skip
        (
            (*ANONYMIZE, "noise:income:c=0.1", "--keys", "region,sexx"),
            errors.ERROR,
            "key column(s) ['sexx'] are not in the data",
        ),  # a typo made the risk look lower  # fmt: skip
        ((*SYNTH, "--copies", HUGE), errors.ERROR, "--copies must be from 1 to 1000"),
        ((*SYNTH, "--rows", HUGE), errors.ERROR, "--rows from 0 to 100,000,000"),
        ((*SYNTH, "--max-cells", -5), errors.USAGE, "x>=1"),
        ((*SYNTH, "--option", "bogus=1"), errors.ERROR, "unknown: bogus"),
        (
            (*SYNTH[:7], "cart", "--columns", "sex,age", "--option", "min_leaf=nan"),
            errors.ERROR,
            "min_leaf must be a whole number, got 'nan'",
        ),  # fmt: skip
        (
            (*SYNTH[:7], "cart", "--columns", "sex,age", "--option", f"min_leaf={HUGE}"),
            errors.ERROR,
            "min_leaf must be from 1 to 1,000,000,000",
        ),  # fmt: skip
        (
            (
                *SYNTH[:7],
                "dp-ipf",
                "--columns",
                "sex,age",
                "--bins",
                "age=0,50,111",
                "--epsilon",
                "nan",
            ),
            errors.ERROR,
            "epsilon: must be a number",
        ),  # fmt: skip
        (
            (
                *SYNTH[:7],
                "dp-ipf",
                "--columns",
                "sex,age",
                "--bins",
                "age=0,nan,111",
                "--epsilon",
                "1",
            ),
            errors.ERROR,
            "--bins age: must be a number",
        ),  # fmt: skip
        (
            (
                *SYNTH[:7],
                "dp-ipf",
                "--columns",
                "sex,age",
                "--bins",
                "age=0,50,111",
                "--epsilon",
                "1",
                "--option",
                "min_leaf=3",
            ),
            errors.ERROR,
            "method dp-ipf takes no option",
        ),  # fmt: skip
        (
            ("budget", "{db}", "reset", "--for", "analyst", "--reason", " "),
            errors.USAGE,
            "say why",
        ),  # fmt: skip
    ],
)
def test_out_of_range_numbers_are_clear_errors(args, code, words, db, tmp_path):
    argv = [str(a).format(db=db, tmp=tmp_path) for a in args]
    result = cli_fork.run(argv, timeout=60)  # a hang (a server, a loop over 10**20) fails
    assert result.returncode == code, (result.returncode, result.stderr[-600:])
    assert words in result.stderr and "Traceback" not in result.stderr, result.stderr[-600:]
    assert "RuntimeWarning" not in result.stderr  # numpy's overflow warnings stay inside
