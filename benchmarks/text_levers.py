"""The tokenizer with its levers: `worker.text`'s rules, each a switch, for `text_quality.py` to measure.

`worker.text` ships one set of rules (version `worker.text.TOKENIZER_VERSION`) and only those. The alternatives that
were measured beside them, and any new one worth measuring, live here: `TextRules` names every lever, and
`tokenizer(rules)` applies them. At `DEFAULT_RULES` this tokenizer gives what the shipped one gives, token for token
and weight for weight (tests/test_text_levers.py holds them equal on the Loghub samples and on generated text), so a
lever's figures are the shipped rules' figures with that one thing changed.

This is the plain reading of the rules, without the shipped tokenizer's shortcuts (a number chunk matched at once, a
host name looked up only after a top-level domain...): slower, and the reference the shortcuts are held to.

To try a new rule: add a lever here (default: off, so that `DEFAULT_RULES` stays the shipped rules), measure it with
``text_quality.py --levers`` (each lever alone, and by leave-one-system-out), and, if it wins, write it into
`worker.text` with a new tokenizer version.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal
from unicodedata import normalize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere, without installing

from worker.text import (
    _EDGES,
    _HEX_RUN_RE,
    _HOST_RE,
    _IPV6_RE,
    _MONTHS,
    _PLAIN_RAW_WORD_RE,
    _RAW_WORD_RE,
    _UNITS,
    _WEEKDAYS,
    _WORD_RE,
    ACCOUNT_NAMES,
    PLACEHOLDER,
    _check_text,
    _chunk_matches,
    _no_token,
)

__all__ = ["DEFAULT_LOGINS", "DEFAULT_RULES", "TextRules", "Tokenizer", "tokenizer", "words"]


@dataclass(frozen=True)
class TextRules:
    """The levers of the tokenizer; the defaults are the shipped rules (`worker.text`, version 6).

    * `weights`: ``binary`` (each distinct word once) or ``count`` (occurrences);
    * `word_weight`: the weight of a word made of letters only (every other token weighs 1);
    * `head`: the first `head` words weigh twice as much (Drain's premise: a line's first words are its constants);
    * `one_placeholder`: every masked kind is ``<*>`` (else ``<num> <hex> <uuid> <ip> <date> <path>``, host names
      as ``<ip>``);
    * `hosts`: mask host names; `paths`: a path (from a ``/`` that starts a word to the next space) is one variable;
    * `variable_tail`: a word is variable from its first variable part on (``attempt_<*>``), else only its digit
      runs are masked (``attempt_<*>_<*>_m_<*>_<*>``);
    * `user_value`: the word after ``user`` is a variable (a user name is a value, as after ``user=``);
    * `key_value`: the word after a ``key=`` word is a variable;
    * `key_words`: a ``key=`` word of letters weighs as a word of letters (else 1);
    * `units`: a unit of size or time after a number (``8.8 kb``) goes with the number;
    * `user_key`: the value after the key ``user=`` is a value too, and the key reads as the word ``user`` (a user
      name is a value however it is introduced; the key weighs as a word, so a line with it stays apart from the
      same line without it);
    * `accounts`: the names of well-known accounts (``root``, ``nobody``, ``ftp``, ``mysql``: `ACCOUNT_NAMES`) are
      values wherever they stand;
    * `account_after_for`: the name of a system account right after ``for`` is a value (``failed password for
      root``): the way sshd, PAM, su and sudo name an account;
    * `account_after_user_key`: the name of a system account as the value of the key ``user=`` is a value, and the
      key then reads as the word ``user`` (``user=ftp`` -> ``user <*>``; ``user=guest`` keeps both words);
    * `default_logins`: ``admin``, ``administrator``, ``guest`` and ``test`` (`DEFAULT_LOGINS`) are accounts too,
      wherever the rules above look for one (versions 4 and 5);
    * `dotted_names`: a name of three or more dotted parts without a digit (a Java class, a setting's key:
      ``org.apache.hadoop.mapreduce.jobhistory.eventtype``, ``mapred.task.id``) is a value.
    """

    weights: Literal["binary", "count"] = "binary"
    word_weight: int = 3
    head: int = 0
    one_placeholder: bool = True
    hosts: bool = True
    paths: bool = True
    variable_tail: bool = True
    user_value: bool = True
    key_value: bool = False
    key_words: bool = False
    units: bool = True
    user_key: bool = False
    accounts: bool = False
    account_after_for: bool = True
    account_after_user_key: bool = True
    default_logins: bool = False
    dotted_names: bool = False


DEFAULT_RULES = TextRules()
"""The shipped rules."""

DEFAULT_LOGINS = frozenset({"admin", "administrator", "guest", "test"})
"""Names that people choose or installers offer as logins: user names like any other, accounts only under the lever
`default_logins`."""

# Named placeholders (`one_placeholder=False`): what kind of value a variable part is.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4_RE = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}(?::[0-9]{{1,5}})?(?![.0-9])")
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(?![^\W_])")
# The first variable part of a word: a hex string (0x..., or 8 or more hex digits holding a digit) that makes a whole
# run of letters and digits, else the first digit.
_FIRST_VARIABLE_RE = re.compile(r"(?<![^\W_])(?:0x[0-9a-f]+|(?=[a-f]*[0-9])[0-9a-f]{8,})(?![^\W_])|\d")
_DIGITS_RE = re.compile(r"\d+")

VALUE, NUMBER, ACCOUNT = 1, 2, 3
"""What a word asks of the next one: to be a value; (a unit) to go with it; to be a value if it is an account's."""

Tokenizer = Callable[[str], dict[str, int]]


def _kind(part: str) -> str:
    """The named placeholder of a variable part (the rest of a word from its first variable part)."""
    if _UUID_RE.match(part):
        return "<uuid>"
    if _IPV4_RE.match(part):
        return "<ip>"
    if _HEX_RUN_RE.match(part):
        return "<hex>"
    return "<num>"


@lru_cache(maxsize=64)
def _words_function(rules: TextRules) -> Callable[[str], list[str]]:
    """The function text -> words under `rules`."""
    one = rules.one_placeholder
    paths, hosts, tail = rules.paths, rules.hosts, rules.variable_tail
    value_keys = frozenset(["user"]) if rules.user_value else frozenset()
    user_key = rules.user_key
    if user_key:
        value_keys = value_keys | {"user="}
    key_value = rules.key_value
    keys_are_not_values = key_value or user_key  # a key= word is never the value of the word before it
    account_names = ACCOUNT_NAMES | DEFAULT_LOGINS if rules.default_logins else ACCOUNT_NAMES
    accounts = account_names if rules.accounts else frozenset()
    account_keys = frozenset(["for"]) if rules.account_after_for else frozenset()
    if rules.account_after_user_key:
        account_keys = account_keys | {"user="}
    path_token = PLACEHOLDER if one else "<path>"
    ip_token = PLACEHOLDER if one else "<ip>"
    date_token = PLACEHOLDER if one else "<date>"
    value_token = PLACEHOLDER if one else "<num>"
    units = _UNITS if rules.units else frozenset()
    dotted_names = rules.dotted_names
    special = _MONTHS | value_keys | accounts | account_keys  # plain words that need a look at their neighbours

    def variable(word: str) -> str:
        """A word that is not letters only, with its variable part masked (rules 3 and 4)."""
        body, key = (word[:-1], "=") if word[-1] == "=" else (word, "")
        if hosts and "." in body and (body[-1].isalpha() or ":" in body):
            at = body.rfind("@") + 1  # user@host: the host part
            if _HOST_RE.fullmatch(body, at) is not None:
                return body[:at] + ip_token + key
        found = _FIRST_VARIABLE_RE.search(body)
        if found is None:
            if dotted_names and body.count(".") >= 2:
                return PLACEHOLDER + key
            return word
        if body.count(":") >= 2 and _IPV6_RE.fullmatch(body) is not None:
            return ip_token + key
        if not tail:  # only the variable runs: hex strings, then digit runs
            if one:
                return _DIGITS_RE.sub(PLACEHOLDER, _HEX_RUN_RE.sub(PLACEHOLDER, body)) + key
            return _DIGITS_RE.sub("<num>", _HEX_RUN_RE.sub("<hex>", body)) + key
        start = found.start()
        prefix = body[:start]
        if prefix[-1:] in ("-", "+") and not prefix[-2:-1].isalnum():  # a sign: blk_-42 is blk_42
            prefix = prefix[:-1]
        return prefix + (PLACEHOLDER if one else _kind(body[start:])) + key

    def after_word(word: str) -> int:
        """What `word` asks of the next one: VALUE (it is ``user``, or a ``key=`` under `key_value`), NUMBER, or 0."""
        if word in value_keys or (key_value and word[-1] == "="):
            return VALUE
        if word in account_keys:
            return ACCOUNT
        return NUMBER if word[:1].isdecimal() else 0

    def chunk_words(chunk: str, out: list[str], after: int) -> int:
        """Append the words of a chunk that is not letters only (rules 2 to 4); return what its last word asks."""
        if chunk.isalnum():
            found: list[str] | tuple[str] = (chunk,)
        elif "/" in chunk:
            found = _chunk_matches(chunk)
        elif "<" in chunk:
            found = _RAW_WORD_RE.findall(chunk)
        else:
            found = _PLAIN_RAW_WORD_RE.findall(chunk)
        for word in found:
            if after == VALUE and not (keys_are_not_values and word[-1] == "="):
                out.append(value_token)  # a value: nothing after it is one
                after = 0
                continue
            if word.isalpha():
                if after == NUMBER and word in units:  # "8.8 kb": the unit goes with its number
                    after = 0
                    continue
                if word in accounts or (after == ACCOUNT and word in account_names):
                    if after == ACCOUNT and out and out[-1] == "user=":
                        out[-1] = "user"
                    out.append(value_token)
                    after = 0
                    continue
                out.append(word)
                after = VALUE if word in value_keys else ACCOUNT if word in account_keys else 0
                continue
            if word[0] == "<" and word[-1] == ">" and word.count("<") == 1:
                out.append(word)
            elif paths and (word[0] == "/" or "://" in word):
                out.append(path_token)
                if word[0] != "/":  # a URL: its query string is part of it
                    return 0
            elif word[0] == "/":  # paths measured as words
                out.extend(part if part.isalpha() else variable(part) for part in _WORD_RE.findall(word))
            elif user_key and word == "user=":  # the key reads as the word
                out.append("user")
            else:
                out.append(variable(word))
            after = after_word(word)
        return after

    def words_of(text: str) -> list[str]:
        out: list[str] = []
        after = 0  # what the previous word asks of this one
        month = -2  # where in `out` the last month name stands
        if not text.isascii():  # rule 1: one form for every way of writing the same characters
            text = normalize("NFKC", text)
        for chunk in text.lower().split():
            if not chunk.isalpha():
                core = chunk.strip(_EDGES)
                if not core.isalpha():
                    if month == len(out) - 1 and core[:1].isdecimal():  # "jul 9", "sat jul 9": a date
                        out[month] = date_token
                        if month >= 1 and out[month - 1] in _WEEKDAYS:
                            out[month - 1] = date_token
                    after = chunk_words(chunk, out, after)
                    continue
                chunk = core  # a word in brackets or quotes, or before a comma or colon
            if chunk not in special:
                if not after:
                    out.append(chunk)
                    continue
                if after == ACCOUNT and chunk not in account_names:  # "for jobs"
                    out.append(chunk)
                    after = 0
                    continue
            elif not after and chunk in account_keys:  # "for"
                out.append(chunk)
                after = ACCOUNT
                continue
            if after == VALUE:
                out.append(value_token)
                after = 0
                continue
            if after == ACCOUNT:  # "for root": an account's name
                after = 0
                if chunk in account_names:
                    if out and out[-1] == "user=":
                        out[-1] = "user"
                    out.append(value_token)
                    continue
            if after == NUMBER:
                after = 0
                if chunk in units:  # "8.8 kb": the unit goes with its number
                    continue
                if chunk in _MONTHS:  # "9 jul": a date
                    out.append(date_token)
                    continue
            elif chunk in _MONTHS:  # a date if a number follows
                month = len(out)
            if chunk in accounts:
                out.append(value_token)
                continue
            out.append(chunk)
            if chunk in value_keys:
                after = VALUE
            elif chunk in account_keys:
                after = ACCOUNT
        return out

    return words_of


def words(text: str, rules: TextRules = DEFAULT_RULES) -> list[str]:
    """The words of `text` under `rules`, in order."""
    return _words_function(rules)(text)


@lru_cache(maxsize=64)
def tokenizer(rules: TextRules = DEFAULT_RULES) -> Tokenizer:
    """A function text -> feature bag that applies `rules` (at `DEFAULT_RULES`: `worker.text.features_from_text`)."""
    split = _words_function(rules)
    head, word_weight, binary = rules.head, rules.word_weight, rules.weights == "binary"
    key_words = rules.key_words

    def bag_of(text: str) -> dict[str, int]:
        _check_text(text)
        tokens = split(text)
        if not tokens:
            raise _no_token(text)
        bag: dict[str, int] = {}
        for position, token in enumerate(tokens):
            plain = token.isalpha() or (key_words and token[-1] == "=" and token[:-1].isalpha())
            weight = word_weight if plain else 1
            if position < head:
                weight *= 2
            if binary:
                if bag.get(token, 0) < weight:
                    bag[token] = weight
            else:
                bag[token] = bag.get(token, 0) + weight
        return bag

    return bag_of
