"""Feature bags from plain text: a log line, an incident title or description (docs/contract.md#the-fingerprint).

`features_from_text` lowercases the text, cuts it into words, masks the variable ones and weighs them. Lines of one
kind (the same message on another host, at another time, with another ID, path or user) get nearly the same bag, so
their fingerprints land close together. The rules (version 6):

1. Bring the text to Unicode's compatibility composed form (NFKC), lowercase it (``str.lower``) and cut it at white
   space into chunks. NFKC gives one form to every way of writing the same characters: ``e`` and a combining accent
   is ``é``, as it would have been composed; a full-width ``ＥＲＲＯＲ`` is ``ERROR``, a ligature ``ﬁ`` is ``fi``. A
   combining mark with no composed form (the vowel signs of Devanagari or Thai) stays a mark, and a mark separates
   words, as punctuation does: such words are cut at each sign, the same way in every form of the text.
2. Cut each chunk into words. A path (from a ``/`` that no word leads up to: ``/var/log/x``, ``/v2/...?a=1``) or a
   URL (a word holding ``://``) is one variable up to the next space, its query string included. Otherwise a word is
   a run of letters, digits (any script) and placeholders, and may hold the joiners ``. _ - / : @`` between two such
   runs, so ``pam_unix``, ``sshd:auth``, ``read/write`` and ``10.0.0.1:80`` are one word each. A ``=`` ends a word
   and stays on it: ``uid=0`` gives ``uid=`` and ``<*>``. Every other character (brackets, quotes, commas,
   ``; ! ? # % * ( )``...) only separates words: punctuation is never a token. A placeholder already in the text
   (``<*>``) reads as one.
3. A word is variable from its first variable part to its end, where it becomes the placeholder ``<*>``; what comes
   before stays (an identifier's constant prefix): ``attempt_1445144423722_0020_m_000000_0`` -> ``attempt_<*>``,
   ``ssh2`` -> ``ssh<*>``, ``blk_-6952295868487656571`` -> ``blk_<*>`` (a sign after a joiner goes with the number),
   ``2017-05-16t00:00:00`` -> ``<*>``. The first variable part is the first digit, unless the word is
   * an IPv6 address (``fe80::1ff:fe23:4567:890a``): all of it;
   * a host name, with an optional ``:port``, alone or after ``user@``: dotted labels of letters, digits and hyphens
     ending in a top-level domain (``com net org edu gov mil int biz info local localdomain lan internal arpa``, any
     two letters after ``com net org edu gov ac co`` as in ``wsi.edu.pl``, or any other two letters except common
     file extensions such as ``gz sh py js pl`` and ``id``, the usual end of a dotted setting name). ``out.log``,
     ``hadoop-env.sh``, ``java.io.ioexception`` and ``mapred.task.id`` are not host names;
   * a hex string that makes a whole run of letters and digits: ``0x`` and hex digits, or 8 or more hex digits
     holding a digit (a hash, a request ID, the first part of a UUID): it starts there. ``deadbeef`` stays a word.
4. Four rules read a word's neighbour:
   * the word after ``user`` is a value: ``invalid user admin`` -> ``invalid user <*>`` (a user name is a parameter;
     only the next word, and a value never makes the word after it one);
   * the name of a system account (``root``, ``nobody``, ``ftp``, ``sshd``, ``mysql``...: `ACCOUNT_NAMES`, the
     accounts Unix systems and their common services create) right after ``for``, or as the value of the key
     ``user=``, is a value: ``Failed password for root`` -> ``failed password for <*>``, as sshd, PAM, su and sudo
     name an account, and ``user=ftp`` -> ``user <*>`` (the key then reads as the word ``user``, which weighs as a
     word, so the line stays apart from the same line without the key). ``waiting for jobs`` and ``mysql started``
     keep their words, and so do the names people choose or installers offer (``user=guest``, ``for admin``: not
     system accounts);
   * a month name (``jan`` ... ``december``) beside a number is part of a date, and so is a weekday just before such
     a month: ``Sat Jul  9 12:59:44 2005`` -> five ``<*>``; ``in jul`` keeps its words;
   * a unit of size or time right after a number goes with it: ``8.8 KB`` and ``384.0 B`` -> ``<*>``, ``5 ms`` ->
     ``<*>`` (``b kb mb gb tb pb kib mib gib tib ns us ms s sec secs min h``).
5. Weights: each distinct word counts once, whatever its number of occurrences, and a word of letters only
   (``failed``, ``password``: the stuff templates are made of) weighs 3; any other word (a placeholder, an
   identifier, a ``key=`` word) weighs 1.

Why these choices: `benchmarks/text_quality.py` measures them on the Loghub samples (lines of one template should
land within the alert distance of each other, lines of different templates should not), beside Drain3, lever by
lever, and chooses among the levers by leave-one-system-out (benchmarks/journal/text-quality.md has the tables;
BENCHMARKS.md the summary). The levers (each rule as a switch, and the alternatives measured and not taken) live with
it, in `benchmarks/text_levers.py`: this module holds the shipped rules only. What each rule fixes, in pairs of one
template that version 2 left farther apart than 7:

* variable to the end of the word: IDs whose letters vary too (``attempt_..._m_...`` and ``..._r_...``), a reverse
  DNS name read as ``<*>.<*>`` beside a host name read as ``<*>``, timestamps and hex IDs cut into several pieces;
* paths up to the next space: files at different depths, request paths and query strings of one HTTP endpoint;
* the word after ``user``: user names, the largest loss of all in authentication logs;
* an account after ``for``: ``for root`` beside ``for ftp`` in sshd's most common line (version 4);
* an account as the value of ``user=``: ``user=root`` beside ``user=ftp`` in PAM's authentication failure (version 6);
* units, second-level country domains: sizes printed as ``B`` or ``KB``, a host name that was left whole.

Counting each word once keeps a line that is mostly numbers from being mostly the placeholder (whose hash then set
most bits, so unrelated lines met at distance 0 to 4). Letters-only words weighing three times the rest keeps one
variable token from pushing a short line past 7 (3 rather than version 2's 2: fewer variable parts are words now,
and lines of different templates that differ by one word move farther apart). One placeholder for every masked kind
keeps a value that is sometimes an address and sometimes a host name, or a hex ID without a letter a-f, from giving
lines of one template different tokens.

Measured and not taken (levers of `benchmarks/text_levers.py`): every value after the key ``user=`` read as a
value (``user_key``), the names of system accounts masked wherever they stand (``accounts``), and ``admin``,
``administrator``, ``guest`` and ``test`` read as accounts (``default_logins``, version 4 and 5's list). Two samples
label PAM's authentication failure: one puts ``user=root`` and ``user=ftp`` (``uucp``, ``git``, ``sshd``,
``mysql``) in one template, the other makes ``user=root``, ``user=guest`` and ``user=test`` three. Every name read as
a value (the first and third levers) merges the second sample's three and costs most of its pure alerts; system
accounts only is the rule both samples' labels agree with (and the labels of ``for admin`` beside ``for root``, two
templates, agree too). The second lever would also mask a service's name (``mysql``, ``nginx``, ``git``) in any
text, where an incident's title needs it; after ``for`` and ``user=`` only, it costs nothing measured.

Speed: the text is cut at white space first, and most chunks need no pattern: a chunk of letters only (most of a
log line), or one in brackets or before a comma, is a word; a chunk that is one number (digits joined by single dots
or colons: an address, a time, a version) is one placeholder after one precompiled match; a chunk of punctuation is
nothing. In a chunk cut by the pattern, a word of letters, a number and a ``key=`` of letters skip the masking
function. A line whose chunks all took those shortcuts gets its bag without looking at each word again, and ASCII
text (no surrogate possible) is not encoded to be checked. The shortcuts give exactly the words of the plain
reading of the rules (`benchmarks/text_levers.py` at its defaults; the tests compare the two); a number or a word
with a dot looks for a digit, or a top-level domain, before it tries the longer patterns. No cache: a line seen
before costs what a new one does. Measured in one process, interleaved (`benchmarks/text_speed.py`): about 0.55 of
the time of version 3 as first released for a 70-character line (a fifth of version 2's), 0.75 to 0.85 of it over
the Loghub sample lines (benchmarks/journal/text-quality.md).

Text that yields no word (empty, blank, punctuation only) raises `ValueError`: it has no fingerprint. So does text
holding a lone surrogate, which has no UTF-8 form and so no token hash.

The rules have a version, `TOKENIZER_VERSION`: any change to what a text turns into bumps it, and an index records
the version its text incidents were made with (fingerprints of one index must come from one tokenizer).
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from functools import cache
from unicodedata import combining, decomposition, normalize

from .errors import TextTooLargeError

__all__ = [
    "ACCOUNT_NAMES",
    "NFKC_GROWTH",
    "PLACEHOLDER",
    "TOKENIZER_VERSION",
    "WORD_WEIGHT",
    "features_from_text",
    "words",
]

TOKENIZER_VERSION = 6
"""Bumped by every change to what a text turns into. 1: counts, five placeholders; 2: each word once, plain words
weigh 2, one placeholder; 3: a word is variable from its first variable part on, paths and the word after ``user``
are variables; 4: a well-known account's name after ``for`` is a value; 5: the text in NFKC first, so that a
decomposed or full-width text gives the bag of its composed form; 6: the rules above (a system account's name after
``user=`` is a value too, and ``admin``, ``administrator``, ``guest`` and ``test`` are no longer accounts)."""

PLACEHOLDER = "<*>"
"""The token (or the end of a token) that stands for a masked variable part."""
WORD_WEIGHT = 3
"""The weight of a word of letters only (rule 5); every other token weighs 1."""


# --- rule 1, bounded: NFKC a slice at a time ---

NFKC_GROWTH = 4
"""A text may grow at most this many times over (plus `_NFKC_SLACK` characters) in NFKC form: every script's text
stays well within it (a ligature gives 2 or 3 characters, a squared CJK unit up to 5, but never many in a row),
while one character can give 18 (U+FDFA), and 1 MiB of it would cost the tokenizer half a second and 125 MiB."""

_NFKC_SLACK = 4096
_NFKC_SLICE = 4096
_NFKC_RUN = 4096
"""The most characters a slice grows by past `_NFKC_SLICE` looking for a place to cut; a longer run is `bad_text`."""


def _nfkc(text: str) -> str:
    """`normalize("NFKC", text)`, a slice at a time, stopping with `TextTooLargeError` as soon as the result passes
    `NFKC_GROWTH` times the text: the work is bounded by the text's size, whatever it holds.

    A slice ends before a character whose decomposition starts with a starter (combining class 0) that leaves the
    character before it as it is (the pair normalizes as its two halves do): nothing after that point reorders or
    composes with what is before, so the slices' forms joined are the text's form.
    """
    bound = NFKC_GROWTH * len(text) + _NFKC_SLACK
    if len(text) <= _NFKC_SLICE:
        whole = normalize("NFKC", text)
        if len(whole) > bound:
            raise _too_large(text)
        return whole
    parts: list[str] = []
    size = start = 0
    while start < len(text):
        end = min(start + _NFKC_SLICE, len(text))
        while end < len(text) and not _nfkc_boundary(text, end):
            end += 1
            if end - start > _NFKC_SLICE + _NFKC_RUN:
                # NFKC orders a run of combining marks by insertion: its time grows with the run's square (minutes
                # for 1 MiB of marks), so a slice may grow by _NFKC_RUN at most looking for a place to cut
                raise _no_cut(text, start + _NFKC_SLICE)
        part = normalize("NFKC", text[start:end])
        size += len(part)
        if size > bound:
            raise _too_large(text)
        parts.append(part)
        start = end
    return "".join(parts)


def _nfkc_boundary(text: str, at: int) -> bool:
    """Whether NFKC of `text` cut before `at` is the NFKC of its two parts joined (see `_nfkc`)."""
    char = text[at]
    if char < "\x80":
        return True  # an ASCII character is its own form and composes with nothing before it
    first = normalize("NFKD", char)[0]
    if combining(char) or combining(first) or char in _composes_backward() or first in _composes_backward():
        return False
    pair = text[at - 1 : at + 1]
    return normalize("NFKC", pair) == normalize("NFKC", pair[0]) + normalize("NFKC", char)


@cache
def _composes_backward() -> frozenset[str]:
    """The starters that canonical composition can join to what comes before them, however far back that began
    (a Hangul trailing consonant joins the syllable that a leading consonant and a vowel made): the second halves of
    two-character canonical decompositions, and the Hangul vowel and trailing jamo. Read from Unicode's tables once,
    the first time a long text needs a cut (about 50 ms)."""
    seconds = {chr(code) for code in range(0x1161, 0x1176)} | {chr(code) for code in range(0x11A8, 0x11C3)}
    for code in range(0x30000):  # no canonical decomposition lies above plane 2
        parts = decomposition(chr(code)).split()
        if len(parts) == 2 and not parts[0].startswith("<"):
            second = chr(int(parts[1], 16))
            if not combining(second):
                seconds.add(second)
    return frozenset(seconds)


def _too_large(text: str) -> TextTooLargeError:
    return TextTooLargeError(
        f"the text of {len(text):,} characters grows more than {NFKC_GROWTH} times over in Unicode's NFKC form (a "
        "run of characters that each stand for several, such as U+FDFA): it is not tokenized"
    )


def _no_cut(text: str, at: int) -> TextTooLargeError:
    return TextTooLargeError(
        f"the text of {len(text):,} characters holds, from character {at:,}, a run of more than {_NFKC_RUN:,} "
        "characters none of which NFKC can be cut before (combining marks, mostly): it is not tokenized"
    )


# --- what a word is ---

_ATOM = r"(?:[^\W_]+|<(?:\*|num|hex|uuid|ip|date|path)>)+"
_WORD = rf"{_ATOM}(?:[-._/:@]+{_ATOM})*=?"
"""A word: runs of letters, digits and placeholders joined by ``. _ - / : @``; a trailing ``=`` stays on it."""
_PATH = r"/(?=\S*[^\W_])\S*"
"""A path: from a "/" that no word or joiner leads up to, to the next space (its query string included)."""
_RAW_WORD_RE = re.compile(rf"{_PATH}|{_WORD}")
_PLAIN_RAW_WORD_RE = re.compile(rf"{_PATH}|[^\W_]+(?:[-._/:@]+[^\W_]+)*=?")
"""The same for a chunk without ``<`` (so without a placeholder): a third faster."""
_WORD_RE = re.compile(_WORD)
_PLAIN_WORD_RE = re.compile(r"[^\W_]+(?:[-._/:@]+[^\W_]+)*=?")
_LAST_ALNUM_RE = re.compile(r"[^\W_][\W_]*\Z")
"""The last letter or digit of a chunk (each run after a letter or digit is scanned from it only: linear)."""
_ALNUM_RE = re.compile(r"[^\W_]")


def _chunk_matches(chunk: str) -> list[str]:
    """What `_RAW_WORD_RE` (or, without ``<``, `_PLAIN_RAW_WORD_RE`) finds in a chunk (no white space), in linear time.

    A path's lookahead scans the rest of the chunk for a letter or digit. Before the chunk's last letter or digit it
    finds one, and the path then takes the rest of the chunk; after it, it fails, and each slash there would scan to
    the end again (a chunk of a million slashes took hours). So the patterns run up to that last letter or digit,
    and the rest, where no path can start, is cut by the word pattern alone.
    """
    plain = "<" not in chunk
    pattern = _PLAIN_RAW_WORD_RE if plain else _RAW_WORD_RE
    slash = chunk.rfind("/")
    if slash < 0 or _ALNUM_RE.search(chunk, slash) is not None:
        return pattern.findall(chunk)  # a letter or digit after every slash: no path attempt fails
    found: list[str] = []
    end = 0
    last = _LAST_ALNUM_RE.search(chunk)
    if last is not None:
        for match in pattern.finditer(chunk):  # each search starts at or before the last letter or digit
            found.append(match.group())
            end = match.end()
            if end > last.start():
                break
    found += (_PLAIN_WORD_RE if plain else _WORD_RE).findall(chunk, end)
    return found


# --- what is variable in a word ---

_HEX4 = r"[0-9a-f]{1,4}"
_IPV6_RE = re.compile(
    rf"(?:{_HEX4}:){{7}}{_HEX4}"
    rf"|(?=[0-9a-f:]*[0-9])(?:{_HEX4}:){{0,6}}{_HEX4}?::(?:{_HEX4}:){{0,6}}{_HEX4}"  # one "::" and a digit
)
_DIGIT_RE = re.compile(r"\d")
_HEX_RUN_RE = re.compile(r"(?<![^\W_])(?:0x[0-9a-f]+|(?=[a-f]*[0-9])[0-9a-f]{8,})(?![^\W_])")
"""A hex string that makes a whole run of letters and digits: ``0x`` and hex digits, or 8 or more holding a digit."""

# Host names: dotted labels ending in a top-level domain, with an optional :port. Generic domains seen in logs, or
# two letters (a country) unless a common file extension or `id` (the usual end of a dotted setting name), or
# two letters after a generic second level (`edu.pl`, `co.uk`).
_NOT_COUNTRIES = "gz|sh|py|js|so|md|db|rb|pl|cc|hh|el|ps|rs|go|ts|xz|bz|id"
_GENERIC_TLDS = "com|net|org|edu|gov|mil|int|biz|info|local|localdomain|lan|internal|arpa"
_TLD = (
    rf"(?:{_GENERIC_TLDS}|(?:(?<=\.(?:com|net|org|edu|gov)\.)|(?<=\.(?:ac|co)\.))[a-z]{{2}}"
    rf"|(?!(?:{_NOT_COUNTRIES})\b)[a-z]{{2}})"
)
_GENERIC_TLD_SET = frozenset(_GENERIC_TLDS.split("|"))
_LABEL = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
_HOST_RE = re.compile(rf"(?:{_LABEL}\.)+{_TLD}(?::[0-9]{{1,5}})?")

_MONTHS = frozenset(
    {"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec"}
    | {"january", "february", "march", "april", "june", "july", "august", "september", "october", "november"}
    | {"december"}
)
_WEEKDAYS = frozenset(
    {"mon", "tue", "tues", "wed", "thu", "thur", "thurs", "fri", "sat", "sun"}
    | {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}
)
_UNITS = frozenset(
    {"b", "kb", "mb", "gb", "tb", "pb", "kib", "mib", "gib", "tib"} | {"ns", "us", "ms", "s", "sec", "secs", "min", "h"}
)
"""Units after a number that scale with it (``384.0 B``, ``8.8 KB``): part of the value."""
ACCOUNT_NAMES = frozenset(
    {"root", "daemon", "bin", "sys", "nobody", "uucp", "ftp", "sshd", "mysql", "postgres", "oracle", "git"}
    | {"www-data", "apache", "nginx"}
)
"""Accounts that most Unix systems or their common services create: values after ``for`` and ``user=``."""
_NEIGHBOURLY = _MONTHS | {"user", "for"}
"""Words of letters that need a look at their neighbours: a month (a date?), ``user`` (its value), ``for`` (an
account?)."""
_EDGES = "".join(c for c in string.punctuation if c not in "/=<>")
"""Characters that end no word at either end of a chunk: stripped, they leave the chunk's one word, if any."""
_NUMBER_RE = re.compile(r"\d+(?:[.:]\d+)*")
"""A chunk's core that is one number: digits joined by single dots or colons (an address, a time, a version)."""
VALUE, NUMBER, ACCOUNT = 1, 2, 3
"""What a word asks of the next one: to be a value (after ``user``); (a unit) to go with it (after a number); to be
a value if it is an account's (after ``for`` and ``user=``)."""


def _may_be_host(body: str) -> bool:
    """False when what follows the last dot is no top-level domain, so `_HOST_RE` cannot match (sooner)."""
    last = body[body.rfind(".") + 1 :]
    colon = last.find(":")  # host:port
    if colon >= 0:
        last = last[:colon]
    return len(last) == 2 or last in _GENERIC_TLD_SET


def _first_variable_start(body: str) -> int:
    """Where the first variable part of `body` starts, -1 when it has none: a hex string (`_HEX_RUN_RE`) that the
    letters before the first digit may begin, else the first digit (every variable part holds a digit)."""
    digit = _DIGIT_RE.search(body)
    if digit is None:
        return -1
    start = begin = digit.start()
    while begin and body[begin - 1] in "abcdef":
        begin -= 1
    if begin < start and _HEX_RUN_RE.match(body, begin) is not None:
        return begin
    return start


def _variable(word: str) -> str:
    """A word that is not letters only, with its variable part masked (rule 3)."""
    body, key = (word[:-1], "=") if word[-1] == "=" else (word, "")
    if "." in body and (body[-1].isalpha() or ":" in body) and _may_be_host(body):
        at = body.rfind("@") + 1  # user@host: the host part
        if _HOST_RE.fullmatch(body, at) is not None:
            return body[:at] + PLACEHOLDER + key
    start = _first_variable_start(body)
    if start < 0:
        return word
    if body.count(":") >= 2 and _IPV6_RE.fullmatch(body) is not None:
        return PLACEHOLDER + key
    prefix = body[:start]
    if prefix[-1:] in ("-", "+") and not prefix[-2:-1].isalnum():  # a sign: blk_-42 is blk_42
        prefix = prefix[:-1]
    return prefix + PLACEHOLDER + key


def _chunk_words(chunk: str, out: list[str], after: int) -> int:
    """Append the words of a chunk that is not letters only (rules 2 to 4); return what its last word asks."""
    if chunk.isalnum():  # one word (the same as the pattern would find, sooner)
        found: list[str] | tuple[str] = (chunk,)
    elif "/" in chunk:
        found = _chunk_matches(chunk)  # linear in the slashes a path may start at
    elif "<" in chunk:
        found = _RAW_WORD_RE.findall(chunk)
    else:
        found = _PLAIN_RAW_WORD_RE.findall(chunk)
    for word in found:
        if after == VALUE:
            out.append(PLACEHOLDER)  # a value: nothing after it is one
            after = 0
            continue
        if word.isalpha():
            if after == NUMBER and word in _UNITS:  # "8.8 kb": the unit goes with its number
                after = 0
                continue
            if after == ACCOUNT and word in ACCOUNT_NAMES:
                if out and out[-1] == "user=":
                    out[-1] = "user"
                out.append(PLACEHOLDER)
                after = 0
                continue
            out.append(word)
            after = VALUE if word == "user" else ACCOUNT if word == "for" else 0
            continue
        if _NUMBER_RE.fullmatch(word) is not None:
            out.append(PLACEHOLDER)  # what `_variable` gives a number, sooner
            after = NUMBER
            continue
        if word[-1] == "=" and word[:-1].isalpha():  # a key of letters: `_variable` keeps it
            out.append(word)
            after = ACCOUNT if word == "user=" else 0
            continue
        if word[0] == "<" and word[-1] == ">" and word.count("<") == 1:
            out.append(word)
        elif word[0] == "/" or "://" in word:
            out.append(PLACEHOLDER)
            if word[0] != "/":  # a URL: its query string is part of it
                return 0
        else:
            out.append(_variable(word))
        after = NUMBER if word[:1].isdecimal() else 0
    return after


def _scanner() -> Callable[[str], tuple[list[str], bool]]:
    """The function text -> (words, plain) (see `scan`), its constants bound once: a closure's reads of them cost
    less than a module's, and this function is most of the tokenizer's time."""
    number_match, edges, neighbourly, placeholder = _NUMBER_RE.fullmatch, _EDGES, _NEIGHBOURLY, PLACEHOLDER
    account_names, units, months, weekdays, chunk_words = ACCOUNT_NAMES, _UNITS, _MONTHS, _WEEKDAYS, _chunk_words

    def scan(text: str) -> tuple[list[str], bool]:
        """The words of `text`, and whether each is a word of letters or `PLACEHOLDER` (no chunk took the general
        path), which lets `features_from_text` weigh them without looking at each."""
        out: list[str] = []
        append = out.append
        after = 0  # what the previous word asks of this one
        month = -2  # where in `out` the last month name stands
        plain = True
        if not text.isascii():  # rule 1: one form for every way of writing the same characters (ASCII is in it)
            text = _nfkc(text)
        for chunk in text.lower().split():
            if not chunk.isalpha():
                core = chunk.strip(edges)
                if not core.isalpha():
                    if month == len(out) - 1 and core[:1].isdecimal():  # "jul 9", "sat jul 9": a date
                        out[month] = placeholder
                        if month >= 1 and out[month - 1] in weekdays:
                            out[month - 1] = placeholder
                    if core.isdecimal() or number_match(core) is not None:  # one number: what `_chunk_words` gives
                        append(placeholder)
                        after = 0 if after == VALUE else NUMBER
                    elif not core or core == "=":  # punctuation only: no word, nothing changes
                        continue
                    else:
                        after = chunk_words(chunk, out, after)
                        plain = False
                    continue
                chunk = core  # a word in brackets or quotes, or before a comma or colon
            if chunk not in neighbourly:
                if not after:  # most words of a log line
                    append(chunk)
                    continue
                if after == ACCOUNT and chunk not in account_names:  # "for jobs"
                    append(chunk)
                    after = 0
                    continue
            elif not after and chunk == "for":
                append(chunk)
                after = ACCOUNT
                continue
            if after == VALUE:
                append(placeholder)
                after = 0
                continue
            if after == ACCOUNT:  # "for root": an account's name
                after = 0
                if chunk in account_names:
                    if out and out[-1] == "user=":
                        out[-1] = "user"
                    append(placeholder)
                    continue
            if after == NUMBER:
                after = 0
                if chunk in units:  # "8.8 kb": the unit goes with its number
                    continue
                if chunk in months:  # "9 jul": a date
                    append(placeholder)
                    continue
            elif chunk in months:  # a date if a number follows
                month = len(out)
            append(chunk)
            if chunk == "user":
                after = VALUE
            elif chunk == "for":
                after = ACCOUNT
        return out, plain

    return scan


_scan = _scanner()


def words(text: str) -> list[str]:
    """The words of `text` after lowercasing and masking, in order (rules 1 to 4 of the module docstring)."""
    return _scan(text)[0]


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


def features_from_text(text: str) -> dict[str, int]:
    """The feature bag of `text` under the product's rules (version `TOKENIZER_VERSION`).

    Raises `ValueError` when the text yields no word, since an empty bag has no fingerprint, or holds a lone surrogate.
    """
    if type(text) is not str or not text.isascii():  # ASCII text holds no surrogate: nothing to check
        _check_text(text)
    tokens, plain = _scan(text)
    if not tokens:
        raise _no_token(text)
    # each distinct word once; letters-only words weigh WORD_WEIGHT (rule 5)
    if plain:  # words of letters and placeholders only
        bag = dict.fromkeys(tokens, WORD_WEIGHT)
        if PLACEHOLDER in bag:
            bag[PLACEHOLDER] = 1
        return bag
    return {token: WORD_WEIGHT if token.isalpha() else 1 for token in tokens}
