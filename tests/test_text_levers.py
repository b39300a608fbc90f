"""benchmarks/text_levers.py: the tokenizer with its levers, equal to the shipped one at the shipped settings.

`worker.text` ships its rules and only those, with shortcuts for speed; the benchmark measures alternatives with
`text_levers.tokenizer(rules)`, the plain reading of the rules with each one a switch. A lever's figures mean
something only if the levers at their defaults are the shipped tokenizer, token for token and weight for weight.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.test_text import ALERT_DISTANCE, LOGHUB, any_text, log_like_text
from worker.fingerprint import MAX_WEIGHT, distance, fingerprint
from worker.text import ACCOUNT_NAMES, features_from_text, words

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from text_levers import DEFAULT_LOGINS, DEFAULT_RULES, TextRules, tokenizer
from text_levers import words as lever_words

V = "<*>"


def _bag_or_refusal(function: object, text: str) -> dict[str, int] | str:
    try:
        return function(text)  # type: ignore[operator,no-any-return]
    except ValueError as error:
        return f"ValueError: {error}"


def _assert_shipped_equals_levers(text: str) -> None:
    assert words(text) == lever_words(text)
    assert _bag_or_refusal(features_from_text, text) == _bag_or_refusal(tokenizer(DEFAULT_RULES), text)


# --- the shipped tokenizer is the levers' at their defaults ---


@pytest.mark.skipif(not LOGHUB.is_dir(), reason="the Loghub samples are not on this machine")
def test_the_shipped_tokenizer_is_the_levers_at_their_defaults_on_every_loghub_line() -> None:
    import csv

    paths = sorted(LOGHUB.glob("*_structured.csv"))
    assert len(paths) >= 8
    compared = 0
    for path in paths:
        with path.open(newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                _assert_shipped_equals_levers(row["Content"])
                compared += 1
    assert compared >= 16000


number_like_text = st.lists(
    st.tuples(
        st.sampled_from(["", "(", "[", "-", '"', "'", "/", "<", "=", "user ", "jul ", "for ", "x"]),
        st.from_regex(r"[0-9٣]{1,4}([.:]{1,2}[0-9]{1,3}){0,4}", fullmatch=True),
        st.sampled_from(["", ")", "],", ".", ":", "=", ";", ">", "kb", " kb", " root", "x"]),
    ),
    max_size=6,
).map(lambda parts: " ".join(before + number + after for before, number, after in parts))
"""Numbers, keys and punctuation-only chunks: where the shipped tokenizer takes its shortcuts."""


@settings(max_examples=500, deadline=None)
@given(st.one_of(log_like_text, number_like_text, any_text, st.text(max_size=60)))
@example("")
@example("\ud800")
@example("x user=root, for ftp")
def test_the_shipped_tokenizer_is_the_levers_at_their_defaults_on_any_text(text: str) -> None:
    _assert_shipped_equals_levers(text)


@pytest.mark.parametrize(
    "text",
    [
        "1.2.3.4:80 5= -5 [1.2] (3:4), 1..2 1::2 ::1 12:30:45.123 1.2.",
        "uid=0 euid=0 tty=ssh = , user 1.2.3.4 5 kb",
        "rhost=1.2.3.4  user=mysql",
        "ruser= rhost=1.2.3.4 user=root",
        "user=root, tty=ssh",
        "user= root",
        "USER=SSHD",
        "user=guest user=rooted ruser=root user=root=x",
        "for (mysql): ok; for root, then root; for mysqld; for 5 root; for jul 9 2005",
        "session opened for user root by (uid=0)",
        "Sat Jul  9 12:59:44 2005 8.8 KB 5 ms https://x.example.com/a?b=1 /var/log/x-1 fe80::1ff:fe23:4567:890a",
    ],
)
def test_the_shipped_tokenizer_is_the_levers_at_their_defaults_on_pinned_lines(text: str) -> None:
    _assert_shipped_equals_levers(text)


# --- the levers measured and not taken ---


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rhost=1.2.3.4  user=mysql", ["rhost=", V, "user", V]),
        ("rhost=1.2.3.4 user= x=1", ["rhost=", V, "user", "x=", V]),  # an empty value: the next key is no value
        ("invalid user user=root", ["invalid", "user", "user", V]),
        ("ruser= rhost=a.example.com", ["ruser=", "rhost=", V]),  # another key: unchanged
    ],
)
def test_the_user_key_lever_masks_the_value_after_user_equals(text: str, expected: list[str]) -> None:
    assert lever_words(text, TextRules(user_key=True)) == expected


def test_the_user_key_lever_keeps_a_line_with_the_key_apart_from_the_line_without() -> None:
    bag = tokenizer(TextRules(user_key=True))
    assert bag("tty=ssh rhost=1.2.3.4 user=ftp") == bag("tty=ssh rhost=5.6.7.8 user=root")
    assert bag("tty=ssh rhost=1.2.3.4 user=ftp")["user"] == 3  # the key weighs as a word


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Failed password for root from 1.2.3.4", ["failed", "password", "for", V, "from", V]),
        ("for (mysql): ok", ["for", V, "ok"]),
        ("rooted tree", ["rooted", "tree"]),
    ],
)
def test_the_accounts_lever_masks_well_known_account_names(text: str, expected: list[str]) -> None:
    assert lever_words(text, TextRules(accounts=True)) == expected
    assert {"root", "nobody", "ftp"} <= ACCOUNT_NAMES
    assert not ACCOUNT_NAMES & DEFAULT_LOGINS


def test_without_the_lever_user_equals_keeps_the_account() -> None:
    assert lever_words("user=root", TextRules(account_after_user_key=False)) == ["user=", "root"]


@pytest.mark.parametrize(
    ("text", "product", "with_logins"),
    [
        ("failures for admin [preauth]", ["failures", "for", "admin", "preauth"], ["failures", "for", V, "preauth"]),
        ("x user=guest", ["x", "user=", "guest"], ["x", "user", V]),
        ("for test", ["for", "test"], ["for", V]),
    ],
)
def test_default_logins_are_user_names_unless_the_lever_asks(
    text: str, product: list[str], with_logins: list[str]
) -> None:
    assert words(text) == product
    assert lever_words(text, TextRules(default_logins=True)) == with_logins


def test_without_the_lever_an_account_after_for_stays_a_word() -> None:
    assert lever_words("Failed password for root from 1.2.3.4", TextRules(account_after_for=False)) == [
        "failed",
        "password",
        "for",
        "root",
        "from",
        V,
    ]


def test_the_dotted_names_lever_masks_class_and_setting_names() -> None:
    rules = TextRules(dotted_names=True)
    assert lever_words("Registering class org.apache.hadoop.EventType for mapred.task.id", rules) == [
        "registering",
        "class",
        V,
        "for",
        V,
    ]
    assert lever_words("out.log job.properties", rules) == ["out.log", "job.properties"]  # two parts: kept
    assert words("for mapred.task.id") == ["for", "mapred.task.id"]  # not shipped


def test_other_rules_name_the_masked_kinds() -> None:
    rules = TextRules(one_placeholder=False)
    assert lever_words("1 0xff 38101a0b-2096-447d-96ea-a692162415ae 10.0.0.1 Jul 9 db.example.com /x", rules) == [
        "<num>",
        "<hex>",
        "<uuid>",
        "<ip>",
        "<date>",
        "<num>",
        "<ip>",
        "<path>",
    ]


PAM_FAILURE = "pam_unix(sshd:auth): authentication failure; logname= uid=0 euid=0 tty=ssh ruser= rhost={host}"


def _fp(text: str, rules: TextRules = DEFAULT_RULES) -> int:
    return fingerprint(tokenizer(rules)(text))


def test_version_5_s_rules_kept_pam_s_authentication_failure_apart() -> None:
    """What version 6 changed: under version 5 (no account after ``user=``, default logins as accounts) one
    template's ``user=root`` and ``user=ftp`` were farther apart than the alert distance; they are at 0 now."""
    root = PAM_FAILURE.format(host="5.36.59.76") + " user=root"
    ftp = PAM_FAILURE.format(host="183.62.140.253") + " user=ftp"
    assert distance(_fp(root), _fp(ftp)) == 0
    version_5 = TextRules(account_after_user_key=False, default_logins=True)
    assert distance(_fp(root, version_5), _fp(ftp, version_5)) > ALERT_DISTANCE


def test_version_3_s_rules_kept_sshd_s_failed_password_apart() -> None:
    """What version 4 changed: ``for root`` beside ``for ftp`` in one template, 12 bits apart under version 3."""
    root = "Failed password for root from 5.36.59.76 port 42393 ssh2"
    ftp = "Failed password for ftp from 5.188.10.180 port 54715 ssh2"
    assert distance(_fp(root), _fp(ftp)) == 0
    version_3 = TextRules(account_after_for=False)
    assert distance(_fp(root, version_3), _fp(ftp, version_3)) > ALERT_DISTANCE


@settings(max_examples=100, deadline=None)
@given(
    log_like_text,
    st.sampled_from(["count", "binary"]),
    st.integers(1, 3),
    st.integers(0, 3),
    st.lists(st.booleans(), min_size=14, max_size=14),
)
def test_every_lever_combination_gives_bags_the_fingerprint_accepts(
    text: str, weights: str, word_weight: int, head: int, switches: list[bool]
) -> None:
    one, hosts, paths, tail, user, key_value, key_words, units, user_key, accounts, account_after_for, *more = switches
    account_after_user_key, default_logins, dotted_names = more
    rules = TextRules(
        weights=weights,  # type: ignore[arg-type]
        word_weight=word_weight,
        head=head,
        one_placeholder=one,
        hosts=hosts,
        paths=paths,
        variable_tail=tail,
        user_value=user,
        key_value=key_value,
        key_words=key_words,
        units=units,
        user_key=user_key,
        accounts=accounts,
        account_after_for=account_after_for,
        account_after_user_key=account_after_user_key,
        default_logins=default_logins,
        dotted_names=dotted_names,
    )
    tokens = lever_words(text, rules)
    if not tokens:
        return
    bag = tokenizer(rules)(text)
    assert set(bag) == set(tokens)
    assert all(type(weight) is int and 1 <= weight <= MAX_WEIGHT for weight in bag.values())
    if weights == "count" and head == 0 and not key_words:
        assert sum(bag.values()) == sum(word_weight if token.isalpha() else 1 for token in tokens)
    fingerprint(bag)
