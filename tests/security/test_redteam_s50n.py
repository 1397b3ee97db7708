"""Red team s50n: s50m's describe-time parameter mark and the refusal of ``sqlglot.meta``
comments (int50).

Found: the refusal read the comments left on the parsed tree, but sqlglot's parser sets a
comment's marks on a node when it attaches it and then drops some comments: in
``COUNT(*) FILTER (WHERE c) /* sqlglot.meta k */ FROM t`` the SELECT got the mark ``k`` and no
node kept the comment, so the statement parsed unrefused (3 spellings: ``/* */``, ``--``,
``/*+ */``; 1 shape of 41 fuzzed with the comment at every token boundary, 2,514 texts).
The mark reached a SELECT, where the unit-noise rewrite reads its own mark on a CTE's body
(``sqlsdc_noised_conditions``: a body marked done is not converted); FILTER itself is refused
later by the allowlist, so no statement ran with it: a defence that held by accident. The
parse step now reads every comment the tokenizer kept.

Held (int50, 20,000-person demo, server over the raw protocol): Describe of a statement
then Bind off the breaks (49) and Execute, untyped or int4, named or unnamed, with an IN
list, ``= ANY`` array, BETWEEN on turnover, NULL bound (each refused when executed, 42501);
Bind, Describe of the portal, Execute twice (refused once); Bind with fewer parameters
(08P01); a type for a parameter the text does not use (08P01); the unnamed statement
described then parsed again with a literal 49 (refused). ``pg_catalog.<type>`` casts:
every cast that can fail on confidential values is refused as for the plain type (int2,
int4, numeric(2,1), numeric(3,0), bool, time, date, int4[]); ``regclass``, ``_int4`` and
three-part names refused; casts of a break (CAST(49.5 AS pg_catalog.int4), '50'::int4,
float4 of 49.999999) refused as no plain break. A comment holding ``*/`` or ``/*`` reaches
the engine's SQL escaped (``* /``, ``/ *``).
"""

from __future__ import annotations

import pytest

from sqlsdc.errors import PolicyViolation
from sqlsdc.guard.parse import parse_statement

FILTERED = "SELECT COUNT(*) FILTER (WHERE age > 1) {} FROM persons"


@pytest.mark.parametrize(
    "comment",
    [
        "/* sqlglot.meta sqlsdc_noised_conditions */",
        "-- sqlglot.meta sqlsdc_noised_conditions\n",
        "/*+ sqlglot.meta sqlsdc_noised_conditions */",
    ],
)
def test_a_marking_comment_the_parser_drops_is_refused(comment):
    """Fails on int50: parsed, with the SELECT marked and the comment on no node."""
    with pytest.raises(PolicyViolation, match="sqlglot.meta"):
        parse_statement(FILTERED.format(comment))


def test_a_dropped_marking_comment_is_refused_as_such(module_analyst):
    """Fails on int50: refused for its FILTER, after the mark was set."""
    with pytest.raises(PolicyViolation, match="sqlglot.meta"):
        module_analyst.execute(FILTERED.format("/* sqlglot.meta zz */"))


def test_a_filter_with_a_plain_comment_is_refused_for_its_filter(module_analyst):
    with pytest.raises(PolicyViolation, match="FILTER"):
        module_analyst.execute(FILTERED.format("/* a plain comment */"))
