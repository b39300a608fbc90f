"""Feature bags from plain text: a log line, an incident title or description (SPEC section 1 bags).

`features_from_text` lowercases the text, masks its variable parts, cuts it into words and counts them.
Near-identical incidents (the same problem on another host, at another time, with another ID) get the same
tokens, so their fingerprints land close together. The rules, applied in this order:

1. Lowercase the whole text (``str.lower``).
2. Mask variable parts, scanning left to right. These four patterns are masked only where they do not touch a
   letter or digit on either side (``_`` and punctuation are not letters):

   * a UUID (8-4-4-4-12 hex digits) becomes ``<uuid>``;
   * an IPv4 address (four dotted numbers 0..255, not part of a longer dotted run like ``1.2.3.4.5``), with an
     optional ``:port``, becomes ``<ip>`` (IPv6 is not recognised: its digit runs become ``<num>``);
   * ``0x`` followed by hex digits becomes ``<hex>``, and so does a run of 8 or more hex digits holding at
     least one digit and one letter a-f (a hash, a request ID: ``54fadb412c4e40cd``; ``deadbeef`` stays a word);
   * a date with an English month name, a day number and an optional weekday before it becomes ``<date>``:
     ``Sat Jul  9``, ``July 9th``, ``9 Jul``, ``Tuesday, March 3rd`` (so "may 3 times" reads as a date too).

   Then every remaining number becomes ``<num>``, inside words too: a run of digits, with any further digit
   runs joined to it by ``. , : - /`` (``3.14``, ``1,000``, ``2015-07-29``, ``17:41:44,747``, ``1.2.3``), and
   a leading ``-`` or ``+`` sign unless the sign follows a letter or digit. ``inc0012345`` -> ``inc<num>``,
   ``500ms`` -> ``<num>ms``, ``workers2`` -> ``workers<num>``, ``-27`` -> ``<num>``.
3. Cut into words. A word is a run of letters, digits (any script) and placeholders, and may hold the joiners
   ``. _ - / : @ =`` between two such runs. So an identifier keeps its shape (letters and joiners) and loses its
   variable digits, and a path, URL or host name stays one token: ``job-4711`` -> ``job-<num>``,
   ``blk_-6952295868487656571`` -> ``blk_<num>``, ``/var/log/app-3/out.log`` -> ``var/log/app-<num>/out.log``,
   ``uid=0`` -> ``uid=<num>``, ``req-38101a0b-2096-447d-96ea-a692162415ae`` -> ``req-<uuid>``,
   ``web-03.prod:8080`` -> ``web-<num>.prod:<num>``. A placeholder already in the text (``<num>``) reads as one.
   Joiners at the ends of a word and every other character (spaces, brackets, quotes, commas,
   ``; ! ? # % * ( )``...) only separate words: punctuation is never a token.
4. The weight of a token is the number of times it occurs. With ``bigrams=True`` each pair of consecutive words
   is a token too (``"disk full"``: the two words joined by one space), counted the same way.

Why these choices, measured with ``benchmarks/text_quality.py`` on the Loghub samples (lines of one template
should land within distance 7 of each other, lines of different templates should not): masking takes the share of
same-template pairs within 7 from 10-65% (whitespace split) to 83-100% on seven of the eight systems (Linux, whose
templates hold user and host names, reaches 58%), with at most 3% of different-template pairs within 7.
Keeping paths and identifiers whole separates templates better than cutting them at every joiner (0.3% of
different-template pairs within 7 on average, against 1.3%) with the same share of same-template pairs (91%).
Bigrams are off by default: they cost same-template pairs where words alone do well (OpenStack 98% -> 80%,
Spark 99.5% -> 97%), gain a little only on Linux (58% -> 62%), and keep different-template pairs apart no better.

Text that yields no word (empty, blank, punctuation only) raises `ValueError`: it has no fingerprint. So does text
holding a lone surrogate, which has no UTF-8 form and so no token hash.
Speed: about 10 microseconds for a log line of 70 characters, most of it in the masking pass (Python's regex engine
tries the patterns at every word boundary); about 5 for a title without digits, which skips masking.
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import pairwise

__all__ = ["PLACEHOLDERS", "features_from_text", "words"]

PLACEHOLDERS = ("<num>", "<hex>", "<uuid>", "<ip>", "<date>")
"""The tokens (or parts of tokens) that stand for masked variable parts."""

_NOT_ALNUM_BEFORE = r"(?<![^\W_])"  # not preceded by a letter or digit: `_` and punctuation are boundaries
_NOT_ALNUM_AFTER = r"(?![^\W_])"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_WEEKDAY = r"(?:mon(?:day)?|tue(?:s|sday)?|wed(?:nesday)?|thu(?:rs?|rsday)?|fri(?:day)?|sat(?:urday)?|sun(?:day)?)"
_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sept?(?:ember)?|oct(?:ober)?"
    r"|nov(?:ember)?|dec(?:ember)?)"
)
_DAY = r"(?:[12][0-9]|3[01]|0?[1-9])(?:st|nd|rd|th)?"

# One pass for the patterns that must win over plain numbers: each alternative is tried at a position before
# the scanner moves on, so an IP address is never half-read as a decimal number.
_MASK_RE = re.compile(
    _NOT_ALNUM_BEFORE
    + r"(?:"
    + r"(?P<uuid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
    + rf"|(?<![0-9]\.)(?P<ip>{_OCTET}(?:\.{_OCTET}){{3}}(?::[0-9]{{1,5}})?)(?!\.[0-9])"  # not in 1.2.3.4.5
    + r"|(?P<hex>0x[0-9a-f]+|(?=[0-9]*[a-f])(?=[a-f]*[0-9])[0-9a-f]{8,})"
    + rf"|(?P<date>(?:{_WEEKDAY},?\s+)?{_MONTH}\.?\s+{_DAY}|{_DAY}\s+{_MONTH})"
    + r")"
    + _NOT_ALNUM_AFTER
)

# Digits (\d: any script) with the runs joined to them, and a sign unless it is a hyphen inside a word. Written as two
# branches rather than an optional sign group: a third faster on log lines.
_NUMBER_RE = re.compile(r"[-+](?<![^\W_][-+])\d+(?:[.,:/-]\d+)*|\d+(?:[.,:/-]\d+)*")

_ATOM = r"(?:[^\W_]+|<(?:num|hex|uuid|ip|date)>)+"
_WORD_RE = re.compile(rf"{_ATOM}(?:[-._/:@=]+{_ATOM})*")

_HAS_DIGIT_RE = re.compile(r"\d")


def _mask_match(match: re.Match[str]) -> str:
    return f"<{match.lastgroup}>"  # the group names are the placeholder names


def words(text: str) -> list[str]:
    """The words of `text` after lowercasing and masking, in order (rules 1 to 3 of the module docstring)."""
    text = text.lower()
    if _HAS_DIGIT_RE.search(text) is not None:  # every masked pattern holds a digit: skip both passes without one
        text = _MASK_RE.sub(_mask_match, text)
        text = _NUMBER_RE.sub("<num>", text)
    return _WORD_RE.findall(text)


def features_from_text(text: str, *, bigrams: bool = False) -> dict[str, int]:
    """The feature bag of `text`: each masked word counted (and each pair of consecutive words, with `bigrams`).

    Raises `ValueError` when the text yields no word, since an empty bag has no fingerprint, or holds a lone surrogate.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"text holds a lone surrogate at index {error.start} and is not valid Unicode; decode it with "
            "errors='replace' first"
        ) from None
    tokens = words(text)
    if not tokens:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise ValueError(
            f"text {shown!r} yields no token (it is empty or holds only punctuation and spaces); "
            "give it at least one word or number"
        )
    bag = Counter(tokens)
    if bigrams:
        bag.update(f"{first} {second}" for first, second in pairwise(tokens))
    return dict(bag)
