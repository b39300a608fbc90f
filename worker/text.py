"""Feature bags from plain text: a log line, an incident title or description (docs/contract.md#the-fingerprint).

`features_from_text` lowercases the text, masks its variable parts, cuts it into words and weighs them. Lines of
one kind (the same message on another host, at another time, with another ID or user) get nearly the same bag, so
their fingerprints land close together. The rules, applied in this order:

1. Lowercase the whole text (``str.lower``).
2. Mask variable parts: each becomes the placeholder ``<*>``. First, scanning left to right, these patterns,
   masked only where they do not touch a letter or digit on either side (``_`` and punctuation are not letters):

   * a UUID (8-4-4-4-12 hex digits);
   * an IPv4 address (four dotted numbers 0..255, not part of a longer dotted run like ``1.2.3.4.5``), with an
     optional ``:port``;
   * an IPv6 address (eight groups of hex digits, or fewer with one ``::``, holding a digit), optionally in
     brackets with a ``:port`` after them;
   * ``0x`` followed by hex digits, and a run of 8 or more hex digits holding at least one digit and one letter
     a-f (a hash, a request ID: ``54fadb412c4e40cd``; ``deadbeef`` stays a word);
   * a date with an English month name, a day number and an optional weekday before it: ``Sat Jul  9``,
     ``July 9th``, ``9 Jul``, ``Tuesday, March 3rd`` (so "may 3 times" reads as a date too);
   * a host name, with an optional ``:port``: dotted labels of letters, digits and hyphens ending in a top-level
     domain (``com net org edu gov mil int biz info local localdomain lan internal arpa``, or any two letters
     except common file extensions such as ``gz sh py js`` and ``id``, the usual end of a dotted setting name):
     ``ns1.example.com``, ``web-3.corp.example.de:8080``. ``out.log``, ``workers2.properties``,
     ``org.apache.hadoop``, ``java.io.IOException`` and ``mapred.task.id`` are not host names.

   Then every remaining number becomes ``<*>``, inside words too: a run of digits, with any further digit runs
   joined to it by ``. , : - /`` (``3.14``, ``1,000``, ``2015-07-29``, ``17:41:44,747``, ``7.1.7601.164``), and a
   leading ``-`` or ``+`` sign unless the sign follows a letter or digit. ``inc0012345`` -> ``inc<*>``,
   ``500ms`` -> ``<*>ms``, ``-27`` -> ``<*>``.
3. Cut into words. A word is a run of letters, digits (any script) and placeholders, and may hold the joiners
   ``. _ - / : @`` between two such runs. So an identifier keeps its shape (letters and joiners) and loses its
   variable digits, and a path or URL stays one token: ``job-4711`` -> ``job-<*>``, ``blk_-6952295868487656571``
   -> ``blk_<*>``, ``/var/log/app-3/out.log`` -> ``var/log/app-<*>/out.log``. A ``=`` ends a word and stays on
   it, so ``uid=0`` gives the words ``uid=`` and ``<*>``: the key is a word, its value another. A placeholder
   already in the text (``<*>``) reads as one. Joiners at the ends of a word and every other character (spaces,
   brackets, quotes, commas, ``; ! ? # % * ( )``...) only separate words: punctuation is never a token.
4. Weights: each distinct word counts once, whatever its number of occurrences, and a word of letters only
   (``failed``, ``password``: the stuff templates are made of) weighs 2; any other word (a placeholder, an
   identifier with a placeholder or a joiner in it, a path) weighs 1.

Why these choices: `benchmarks/text_quality.py` measures them on the Loghub samples (lines of one template should
land within the alert distance of each other, lines of different templates should not) and chooses among the
levers by leave-one-system-out: every split keeps the weighting, host names, ``key=`` words and word weight below.
Every split also prefers five named placeholders by a margin smaller than respelling the placeholder moves the
figures; one placeholder is kept for the failures seen on systems outside the samples (BENCHMARKS.md has the
tables and the reasoning). What each rule fixes:

* counting each word once: a line that is mostly numbers was mostly the number placeholder, whose hash then set
  most bits, so lines of unrelated templates met at distance 0 to 4;
* letters-only words weighing twice the rest: a template's constant words are mostly plain words, its variable
  parts mostly are not (host names, paths, identifiers), so one variable token moves a short line less;
* one placeholder for every masked kind: a value that is sometimes an IPv4 address and sometimes a host name, or
  a hex ID without a letter a-f (read as a number), or a version that happens to look like an address, no longer
  gives lines of one template different tokens;
* host names and ``key=`` words: the variable part of ``rhost=host.example.com`` is masked like an address would be.

Speed: about 1.1 times version 1's, some 11 microseconds for a log line of 70 characters on a quiet core.

Text that yields no word (empty, blank, punctuation only) raises `ValueError`: it has no fingerprint. So does text
holding a lone surrogate, which has no UTF-8 form and so no token hash.

The rules have a version, `TOKENIZER_VERSION`: any change to what a text turns into bumps it, and an index records
the version its text incidents were made with (fingerprints of one index must come from one tokenizer).
`TextRules` holds the levers the benchmark chooses among; the product uses `DEFAULT_RULES` only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

__all__ = [
    "DEFAULT_RULES",
    "PLACEHOLDER",
    "TOKENIZER_VERSION",
    "TextRules",
    "features_from_text",
    "tokenizer",
    "words",
]

TOKENIZER_VERSION = 2
"""Bumped by every change to what a text turns into. 1: counts, five placeholders; 2: the rules above."""

PLACEHOLDER = "<*>"
"""The token (or part of a token) that stands for a masked variable part."""


@dataclass(frozen=True)
class TextRules:
    """The levers of the tokenizer. The product uses `DEFAULT_RULES`; the others exist to be measured.

    * `weights`: ``count`` (occurrences), ``binary`` (each distinct word once), ``capped`` (occurrences, but a
      placeholder token at most once);
    * `head`, `head_weight`: the first `head` words weigh `head_weight` times more (Drain's premise: a line's first
      words are its constants);
    * `hosts`: mask host names; `one_placeholder`: every masked kind is ``<*>`` (else ``<num> <hex> <uuid> <ip>
      <date>``, host names as ``<ip>``); `split_key_value`: ``=`` ends a word;
    * `word_weight`: the weight multiplier of a word made of letters only.
    """

    weights: Literal["count", "binary", "capped"] = "binary"
    head: int = 0
    head_weight: int = 1
    hosts: bool = True
    one_placeholder: bool = True
    split_key_value: bool = True
    word_weight: int = 2


DEFAULT_RULES = TextRules()

_NOT_ALNUM_BEFORE = r"(?<![^\W_])"  # not preceded by a letter or digit: `_` and punctuation are boundaries
_NOT_ALNUM_AFTER = r"(?![^\W_])"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_HEX4 = r"[0-9a-f]{1,4}"
_IPV6 = (
    rf"(?:{_HEX4}:){{7}}{_HEX4}"
    rf"|(?=[0-9a-f:]*[0-9])(?:{_HEX4}:){{0,6}}{_HEX4}?::(?:{_HEX4}:){{0,6}}{_HEX4}"  # one "::" and a digit
)
_WEEKDAY = r"(?:mon(?:day)?|tue(?:s|sday)?|wed(?:nesday)?|thu(?:rs?|rsday)?|fri(?:day)?|sat(?:urday)?|sun(?:day)?)"
_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sept?(?:ember)?|oct(?:ober)?"
    r"|nov(?:ember)?|dec(?:ember)?)"
)
_DAY = r"(?:[12][0-9]|3[01]|0?[1-9])(?:st|nd|rd|th)?"
# Generic top-level domains seen in logs, or two letters (a country) unless a common file extension or `id`, the
# usual last part of a dotted setting name (`mapred.task.id`).
_NOT_COUNTRIES = "gz|sh|py|js|so|md|db|rb|pl|cc|hh|el|ps|rs|go|ts|xz|bz|id"
_GENERIC_TLDS = "com|net|org|edu|gov|mil|int|biz|info|local|localdomain|lan|internal|arpa"
_TLD = rf"(?:{_GENERIC_TLDS}|(?!(?:{_NOT_COUNTRIES})\b)[a-z]{{2}})"
_LABEL = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
_PORT = r"(?::[0-9]{1,5})?"


def _mask_pattern(hosts: bool) -> re.Pattern[str]:
    # One pass for the patterns that must win over plain numbers: each alternative is tried at a position before the
    # scanner moves on, so an address is never half-read as a decimal number. Group names say what was masked.
    alternatives = [
        r"(?P<uuid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})",
        rf"(?<![0-9]\.)(?P<ip>{_OCTET}(?:\.{_OCTET}){{3}}{_PORT})(?!\.[0-9])",  # not inside 1.2.3.4.5
        rf"\[?(?P<ipv6>{_IPV6})(?:\]{_PORT})?",
        r"(?P<hex>0x[0-9a-f]+|(?=[0-9]*[a-f])(?=[a-f]*[0-9])[0-9a-f]{8,})",
        rf"(?P<date>(?:{_WEEKDAY},?\s+)?{_MONTH}\.?\s+{_DAY}|{_DAY}\s+{_MONTH})",
    ]
    if hosts:
        # the whole dotted run or nothing: `java.io` in `java.io.ioexception` is no host
        # the whole dotted run or nothing (`java.io` in `java.io.ioexception` is no host), and never glued to a
        # placeholder, so that masking the words again changes nothing
        alternatives.append(rf"(?<!>)(?<!>[.-])(?P<host>(?:{_LABEL}\.)+{_TLD}{_PORT})(?![.-]?(?:[^\W_]|<[*a-z]+>))")
    return re.compile(_NOT_ALNUM_BEFORE + "(?:" + "|".join(alternatives) + ")" + _NOT_ALNUM_AFTER)


# Digits (\d: any script) with the runs joined to them, and a sign unless it is a hyphen inside a word. Written as two
# branches rather than an optional sign group: a third faster on log lines.
_NUMBER_RE = re.compile(r"[-+](?<![^\W_][-+])\d+(?:[.,:/-]\d+)*|\d+(?:[.,:/-]\d+)*")
_HAS_DIGIT_OR_DOT_RE = re.compile(r"[\d.]")  # every masked pattern holds one: text without either skips masking
_NAMED = {"uuid": "<uuid>", "ip": "<ip>", "ipv6": "<ip>", "hex": "<hex>", "date": "<date>", "host": "<ip>"}


def _word_pattern(split_key_value: bool) -> re.Pattern[str]:
    atom = r"(?:[^\W_]+|<(?:\*|num|hex|uuid|ip|date)>)+"
    if split_key_value:
        return re.compile(rf"{atom}(?:[-._/:@]+{atom})*=?")
    return re.compile(rf"{atom}(?:[-._/:@=]+{atom})*")


Tokenizer = Callable[[str], dict[str, int]]


@lru_cache(maxsize=64)
def _words_function(rules: TextRules) -> Callable[[str], list[str]]:
    mask_re = _mask_pattern(rules.hosts)
    word_re = _word_pattern(rules.split_key_value)
    number = PLACEHOLDER if rules.one_placeholder else "<num>"
    if rules.one_placeholder:
        mask_sub = mask_re.sub
        number_sub = _NUMBER_RE.sub
        precheck = _HAS_DIGIT_OR_DOT_RE.search

        def masked_words(text: str) -> list[str]:
            text = text.lower()
            if precheck(text) is not None:
                text = number_sub(PLACEHOLDER, mask_sub(PLACEHOLDER, text))
            return word_re.findall(text)

        return masked_words

    def named(match: re.Match[str]) -> str:
        return _NAMED[match.lastgroup or ""]

    def named_words(text: str) -> list[str]:
        text = text.lower()
        if _HAS_DIGIT_OR_DOT_RE.search(text) is not None:
            text = _NUMBER_RE.sub(number, mask_re.sub(named, text))
        return word_re.findall(text)

    return named_words


def words(text: str, rules: TextRules = DEFAULT_RULES) -> list[str]:
    """The words of `text` after lowercasing and masking, in order (rules 1 to 3 of the module docstring)."""
    return _words_function(rules)(text)


def _check_text(text: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"text holds a lone surrogate at index {error.start} and is not valid Unicode; decode it with "
            "errors='replace' first"
        ) from None


def _no_token(text: str) -> ValueError:
    shown = text if len(text) <= 60 else text[:57] + "..."
    return ValueError(
        f"text {shown!r} yields no token (it is empty or holds only punctuation and spaces); "
        "give it at least one word or number"
    )


def _is_placeholder_only(token: str) -> bool:
    return token.startswith("<") and token.endswith(">") and token.count("<") == 1


@lru_cache(maxsize=64)
def tokenizer(rules: TextRules = DEFAULT_RULES) -> Tokenizer:
    """A function text -> feature bag that applies `rules` (the product's own is `features_from_text`)."""
    split = _words_function(rules)
    head, head_weight, word_weight = rules.head, rules.head_weight, rules.word_weight
    mode = rules.weights

    def bag_of(text: str) -> dict[str, int]:
        _check_text(text)
        tokens = split(text)
        if not tokens:
            raise _no_token(text)
        bag: dict[str, int] = {}
        for position, token in enumerate(tokens):
            weight = head_weight if position < head else 1
            if word_weight != 1 and token.isalpha():
                weight *= word_weight
            if mode == "binary":
                if bag.get(token, 0) < weight:
                    bag[token] = weight
            elif mode == "capped" and _is_placeholder_only(token) and token in bag:
                bag[token] = max(bag[token], weight)
            else:
                bag[token] = bag.get(token, 0) + weight
        return bag

    return bag_of


def features_from_text(text: str) -> dict[str, int]:
    """The feature bag of `text` under the product's rules (version `TOKENIZER_VERSION`).

    Raises `ValueError` when the text yields no word, since an empty bag has no fingerprint, or holds a lone surrogate.
    """
    _check_text(text)
    tokens = _default_words(text)
    if not tokens:
        raise _no_token(text)
    # each distinct word once; letters-only words weigh 2 (rule 4)
    return {token: 2 if token.isalpha() else 1 for token in tokens}


_default_words = _words_function(DEFAULT_RULES)
