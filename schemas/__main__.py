"""``python -m sqlsdc.schemas``: the paths of the policy's JSON Schema and of the example
policies installed with the package, to copy and edit (a pip install has no checkout's
``schemas/`` folder; new user s38)."""

from pathlib import Path

here = Path(__file__).resolve().parent
print(here / "policy.schema.json")
for example in sorted((here / "examples").glob("*.yaml")):
    print(example)
