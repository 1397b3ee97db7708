"""``python -m sqlsdc.schemas``: the paths of the policy's JSON Schema and of the example
policies installed with the package, to copy and edit (a pip install has no checkout's
``schemas/`` folder; new user s38). ``--help`` says so and any other argument is a usage error
(exit code 2): both printed the paths (new user s44g)."""

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m sqlsdc.schemas",
        description="Print the paths of the policy's JSON Schema (policy.schema.json) and of "
        "the example policies installed with sqlsdc, one a line, to copy and edit; "
        "`sqlsdc policy validate FILE` checks a policy against it.",
    )
    parser.parse_args(argv)
    here = Path(__file__).resolve().parent
    paths = [here / "policy.schema.json", *sorted((here / "examples").glob("*.yaml"))]
    try:
        print("\n".join(map(str, paths)), flush=True)
    except BrokenPipeError:  # `... | head -1`: the reader has what it wanted; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


if __name__ == "__main__":
    main()
