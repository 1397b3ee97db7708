"""The examples in docstrings run: doctest on every module of the installed sqlsdc package.

Examples that need a database or a Spark session are marked ``# doctest: +SKIP``; every other
example must produce the output it shows.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import sqlsdc


def _modules() -> list[str]:
    names = [
        info.name
        for info in pkgutil.walk_packages(sqlsdc.__path__, prefix="sqlsdc.")
        if info.name != "sqlsdc.cli.__main__"  # running it would start the CLI
    ]
    return ["sqlsdc", *sorted(names)]


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name):
    if "spark" in name and importlib.util.find_spec("pyspark") is None:
        pytest.skip("needs the spark extra")
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name, globs={"sqlsdc": sqlsdc, **vars(module)}):
        runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, f"{failed} of {attempted} docstring examples in {name} failed (see above)"


def test_doctests_are_found():
    """The finder sees the package's examples (a broken walk would pass vacuously)."""
    import sqlsdc.mechanisms.ptable as ptable

    examples = sum(len(t.examples) for t in doctest.DocTestFinder().find(ptable))
    assert examples > 0
