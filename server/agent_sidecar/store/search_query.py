"""SearchMessages' query language, one for both backends: PostgreSQL's
websearch syntax. Words must all appear; ``"quoted words"`` must appear as a
phrase; ``or`` between two terms is either; ``-word`` (or ``-"phrase"``)
must not appear. Anything else (punctuation, ``AND``, ``*``, unbalanced
quotes) is text, never an error.

Why one language: PostgreSQL read the query with ``websearch_to_tsquery``
while SQLite's FTS5 had a syntax of its own (binary ``NOT``, upper-case
``OR``/``AND``, ``prefix*``), so the same query gave other results on the
two backends (``apple -banana`` found the messages *with* banana on SQLite).
Here the query is parsed once, as ``websearch_to_tsquery`` reads it, and
that one parse is written for each backend: as FTS5 for SQLite, as
``to_tsquery`` input for PostgreSQL. PostgreSQL does not read the user's text
itself: ``websearch_to_tsquery`` differs from this parse at the edges
(``12:00`` is two words there and a phrase here, ``or,`` an operator there
and a word here), and any difference in the structure found the backends
finding other messages again (``apple or, -cherry`` found every message
without cherry on PostgreSQL). A query of punctuation only finds nothing on
both, and both refuse alike one whose alternative only excludes words (FTS5
cannot search for "everything without x").
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from ..errors import invalid

# A word as the tokenizers read one: letters and digits.
WORD = re.compile(r"[^\W_]+")
# A quoted phrase (the closing quote may be missing), or a run of other text.
_CHUNK = re.compile(r'"([^"]*)"?|([^\s"]+)')


@dataclass(frozen=True)
class Term:
    """Words that must appear together, in order (one word: anywhere), or
    must not appear at all when ``negated``."""
    words: tuple[str, ...]
    negated: bool = False


def parse(query: str) -> list[list[Term]]:
    """The query as alternatives (``or``) of terms that must all hold, as
    ``websearch_to_tsquery`` groups them (AND binds tighter than ``or``); no
    alternative when it holds no word (only punctuation or symbols: nothing
    can match). Raises INVALID_ARGUMENT on ``query`` for blank text and for an
    alternative that only excludes words."""
    text = "".join(" " if ord(ch) < 32 else ch for ch in query)
    items: list[Term | None] = []  # None: an ``or`` between two terms
    negate = False
    chunks = list(_CHUNK.finditer(text))
    for i, m in enumerate(chunks):
        phrase, bare = m.group(1), m.group(2)
        if bare is not None:
            dashes = len(bare) - len(bare.lstrip("-"))
            negate ^= dashes % 2 == 1
            bare = bare[dashes:]
            if not bare:
                continue  # a lone "-" negates what follows it
            if bare.lower() == "or" and items and items[-1] is not None and not negate \
                    and i + 1 < len(chunks):
                items.append(None)
                continue
        source = phrase if phrase is not None else bare or ""
        words = tuple(w for w in source.split() if _has_token(w))
        if words:
            items.append(Term(words, negate))
        negate = False
    while items and items[-1] is None:  # "or" with nothing searchable after it
        items.pop()
    groups: list[list[Term]] = [[]]
    for item in items:
        if item is None:
            groups.append([])
        else:
            groups[-1].append(item)
    groups = [g for g in groups if g]
    if not text.split():
        raise invalid("query", "has no words to search for")
    if any(all(t.negated for t in g) for g in groups):
        raise invalid("query", "only excludes words (-word): give a word to search for")
    return groups


def to_fts5(groups: list[list[Term]]) -> str:
    """The parsed query as an FTS5 expression: each term a quoted phrase (its
    words are text, never FTS5 syntax), a group's terms ANDed with ``NOT``
    for the excluded ones, the groups ORed."""
    def phrase(t: Term) -> str:
        return '"' + " ".join(t.words) + '"'
    out = []
    for g in groups:
        expr = " AND ".join(phrase(t) for t in g if not t.negated)
        expr += "".join(f" NOT {phrase(t)}" for t in g if t.negated)
        out.append(f"({expr})")
    return " OR ".join(out)


# What PostgreSQL's full-text index reads as spaces (its schema's
# ``search_text``): ASCII punctuation, the escape mark (of NUL and of itself,
# store/postgres/codec.py) and the snippet marks. A query's words are read
# the same way, so "a.b@c.de" is the phrase of a, b, c and de on both
# backends, as SQLite reads it in the text and in the query.
_PG_READING = str.maketrans(dict.fromkeys(string.punctuation + "\ufdd0\ufdd1\uffff", " "))


def to_tsquery(groups: list[list[Term]]) -> str:
    """The parsed query as ``to_tsquery`` input, the same structure as
    ``to_fts5``: each term a phrase (``<->``) of its words, each word split
    where the index splits text (``_PG_READING``) and each part a quoted lexeme
    (never read as tsquery syntax), a group's terms ANDed with ``!`` for the
    excluded ones, the groups ORed."""
    def phrase(t: Term) -> str:
        inner = " <-> ".join("'" + p.replace("\\", "\\\\").replace("'", "''") + "'" for p in _pg_parts(t))
        return f"!({inner})" if t.negated else f"({inner})"
    return " | ".join("(" + " & ".join(phrase(t) for t in g) + ")" for g in groups)


def marked(groups: list[list[Term]]) -> list[tuple[str, ...]]:
    """What a snippet marks, as SQLite's snippet() does: every instance of
    each term searched for (of every alternative, never an excluded one), a
    phrase as one span; each term as the lower-case parts PostgreSQL's index
    reads in it (``to_tsquery``), split into WORDs."""
    return [tuple(w.lower() for p in _pg_parts(t) for w in WORD.findall(p))
            for g in groups for t in g if not t.negated]


def _pg_parts(t: Term) -> list[str]:
    """A term's words as PostgreSQL's index reads them (``_PG_READING``)."""
    return [p for w in t.words for p in w.translate(_PG_READING).split() if _has_token(p)]


def _has_token(word: str) -> bool:
    """Whether the tokenizers index anything of it: a letter or a digit
    (punctuation and symbols such as emoji separate words on both)."""
    return any(ch.isalnum() for ch in word)
