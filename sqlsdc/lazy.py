"""A package's public names imported on first use (PEP 562), so that importing one of its
modules does not import all of them: the guard needs :mod:`sqlsdc.jobs.patterns` and
:mod:`sqlsdc.tabular.universe`, not the jobs' and tables' solvers and their libraries (scipy,
numba, OR-Tools), whose import was most of a CLI query's CPU (new users s40h, s40j)."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_names(package: str, names: dict[str, str]) -> Callable[[str], object]:
    """The module ``__getattr__`` of ``package`` that imports ``names[name]`` (a submodule)
    when ``name`` is first asked for and returns its attribute of that name."""

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{names[name]}"), name)

    return __getattr__
