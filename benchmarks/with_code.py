"""Run a benchmark script with sqlsdc imported from another copy of the code: A/B timings of two
commits from one virtual environment, in alternating processes (the other cores of a shared
machine are busy, so only runs close in time compare).

The copy is laid out as the package installs (``sqlsdc/`` with ``cli``, ``schemas`` and
``udfs`` inside), e.g. for the commit ``main`` points at:

  mkdir -p /tmp/base && git archive main sqlsdc cli schemas udfs | tar -x -C /tmp/base
  cd /tmp/base && mv cli schemas udfs sqlsdc/

Usage: python benchmarks/with_code.py CODE_DIR SCRIPT [ARGS...]
(``-`` as CODE_DIR: the installed sqlsdc, e.g. the editable install of this worktree). The
script's own imports from ``benchmarks/`` resolve as when it is run directly.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main() -> None:
    code, script, *args = sys.argv[1:]
    if code != "-":  # an editable install's finder would answer first: set it aside
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in str(f).lower()]
        sys.path.insert(0, str(Path(code).resolve()))
    sys.path.insert(0, str(Path(script).resolve().parent))
    sys.argv = [script, *args]
    import sqlsdc

    print(f"# sqlsdc from {Path(sqlsdc.__file__).parent}", file=sys.stderr)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
