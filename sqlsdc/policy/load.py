"""Load a policy from YAML, JSON or a dict: read it, validate it, build the typed model.

The one entry point, :func:`load_policy`, runs the three steps, each in its own module: reading
the text, bounded in size, aliases, depth and expansion (:mod:`sqlsdc.policy.read`); validation
in one pass that reports every problem at once (:mod:`sqlsdc.policy.validate`, with the
cross-field rules of :mod:`sqlsdc.policy.semantics`), as
``<file>: line L, column C: <path.inside.document>: <problem>`` (line and column when the source
is YAML or JSON text); and building the model (:mod:`sqlsdc.policy.build`). A document that
validated once is not validated again in the same process (:func:`load_policy` caches by the
document's text).
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlsdc.errors import PolicyError
from sqlsdc.policy.build import build_policy
from sqlsdc.policy.model import Policy
from sqlsdc.policy.read import (
    MAX_POLICY_BYTES,
    Marks,
    located,
    parse_document,
    position_of,
    read_text,
)
from sqlsdc.policy.validate import ptable_problems, validate_document


def load_policy(source: str | Path | dict, *, name: str | None = None) -> Policy:
    """Read, validate and build a policy.

    Args:
        source: a path to a YAML/JSON file, a YAML/JSON string, or an already parsed dict.
        name: how to call the source in error messages (defaults to the file name).

    Raises:
        PolicyError: naming the file, the line and column, the path inside it and each problem.

    Example:
        >>> doc = {"tables": {"t": {"kind": "public"}}, "users": {"a": {"role": "admin"}}}
        >>> p = load_policy(doc)
        >>> p.table("t").is_public
        True
    """
    if isinstance(source, dict):
        try:
            text = json.dumps(source, allow_nan=True)  # order kept: it is the tables' order
        except (TypeError, ValueError, RecursionError):
            text = None  # not JSON-like: validation names the problem
        if text is None or len(text) > MAX_POLICY_BYTES:
            return _load_dict(copy.deepcopy(source), name or "<policy>")
        return _loaded(text, name or "<policy>", True)
    text, label = read_text(source, name)
    return _loaded(text, label, False)


@lru_cache(maxsize=64)
def _loaded(text: str, label: str, is_json_dict: bool) -> Policy:
    """Validate and build a policy from its text, once per process and document (the guarded
    connection loads the stored policy each time it opens)."""
    if is_json_dict:
        return _load_dict(json.loads(text), label)
    document, marks = parse_document(text, label)
    return _validated(document, label, marks)


def _load_dict(document: Any, label: str) -> Policy:
    return _validated(document, label, {})


def _validated(document: Any, label: str, marks: Marks) -> Policy:
    """The policy of a valid ``document``; PolicyError listing every problem otherwise."""
    problems = validate_document(document)
    problems += ptable_problems(document, problems)
    if problems:
        raise PolicyError([located(label, p, marks) for p in _by_position(problems, marks)])
    return build_policy(document, label, marks)


def _by_position(problems: list[str], marks: Marks) -> list[str]:
    """Problems in the order of the text they point at (as found, for a dict)."""
    if not marks:
        return problems
    return sorted(problems, key=lambda p: position_of(p, marks) or (0, 0))
