"""worker.text: the tokenizer's masking rules, its bags as the contract wants them, and the demo's sample file."""

from __future__ import annotations

import csv
import itertools
import json
import os
import random
from collections import defaultdict
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from worker.fingerprint import distance, fingerprint, fingerprint_reference, format_fingerprint
from worker.text import PLACEHOLDER, TOKENIZER_VERSION, WORD_WEIGHT, features_from_text, words

_LOGHUB_PLACES = [
    Path(os.environ.get("LOGHUB_DIR", "/nonexistent")),
    Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "loghub",  # beside the repository
    Path("/work/shared/data/loghub"),  # where the shared data lives on the project's machines
]
LOGHUB = next((place for place in _LOGHUB_PLACES if place.is_dir()), _LOGHUB_PLACES[1])
ALERT_DISTANCE = 7


# --- masking rules, one pinned example (or a few) each ---

V = PLACEHOLDER


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Disk FULL", ["disk", "full"]),
        ("ÜNÏCODE Straße", ["ünïcode", "straße"]),
    ],
)
def test_text_is_lowercased(text: str, expected: list[str]) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", [V]),
        ("took 3.14 s", ["took", V]),  # a unit after a number goes with it
        ("1,000 rows", [V, V, "rows"]),  # a comma separates words: two placeholders, one token in the bag
        ("on 2015-07-29 at 17:41:44,747", ["on", V, "at", V, V]),
        ("version 1.2.3", ["version", V]),
        ("version 7.1.7601.164", ["version", V]),
        ("3/4 done", [V, "done"]),
        ("boot = -103", ["boot", V]),
        ("delta +5", ["delta", V]),
        ("arabic ٣٤", ["arabic", V]),
    ],
)
def test_numbers_are_masked(text: str, expected: list[str]) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("INC0012345", ["inc<*>"]),
        ("timeout after 500ms", ["timeout", "after", V]),
        ("workers2.properties", ["workers<*>"]),
        ("ssh2", ["ssh<*>"]),
    ],
)
def test_a_word_is_variable_from_its_first_number_on(text: str, expected: list[str]) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("job-4711", ["job-<*>"]),
        ("blk_-6952295868487656571", ["blk_<*>"]),
        ("blk_38865049064139660", ["blk_<*>"]),
        ("appattempt_1445144423722_0020_000001", ["appattempt_<*>"]),
        ("attempt_1445144423722_0020_m_000000_0", ["attempt_<*>"]),  # m or r: part of the ID
        ("web-03.prod:8080", ["web-<*>"]),
        ("org.apache.hadoop.mapreduce.v2.app.MRAppMaster", ["org.apache.hadoop.mapreduce.v<*>"]),
        ("pam_unix(sshd:auth)", ["pam_unix", "sshd:auth"]),
    ],
)
def test_identifiers_keep_their_prefix_and_lose_the_rest(text: str, expected: list[str]) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("uid=0", ["uid=", V]),
        ("rhost=csnsu.nsuok.edu user=alice", ["rhost=", V, "user=", "alice"]),
        ("logname= tty=NODEVssh", ["logname=", "tty=", "nodevssh"]),
        ("a==b", ["a=", "b"]),
    ],
)
def test_an_equals_sign_ends_a_key_word(text: str, expected: list[str]) -> None:
    assert words(text) == expected


def test_a_hyphen_inside_a_word_is_a_joiner_not_a_sign() -> None:
    assert words("job-4711") == ["job-<*>"]
    assert words("job -4711") == ["job", V]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("38101a0b-2096-447d-96ea-a692162415ae", [V]),
        ("req-38101A0B-2096-447D-96EA-A692162415AE done", ["req-<*>", "done"]),
        ("[instance: 70c1714b-c11b-4c88-b300-239afe1f5ff8]", ["instance", V]),
    ],
)
def test_uuids_are_masked(text: str, expected: list[str]) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("from 10.20.3.14", ["from", V]),
        ("to 10.251.71.240:50010 now", ["to", V, "now"]),
        ("[173.234.31.186]", [V]),
        ("request /10.10.34.11:45307", ["request", V]),
        ("from 183.62.140.253: 11: bye", ["from", V, V, "bye"]),
        ("1.2.3.4.5", [V]),  # five parts: a version, masked as a number
    ],
)
def test_ipv4_addresses_with_optional_port_are_masked(text: str, expected: list[str]) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("from fe80::1ff:fe23:4567:890a up", ["from", V, "up"]),
        ("2001:0db8:85a3:0000:0000:8a2e:0370:7334", [V]),
        ("peer [2001:db8::1]:443 closed", ["peer", V, V, "closed"]),
        ("bind ::1", ["bind", V]),
        ("at 17:41:44", ["at", V]),  # a time, not an address: still masked, as a number
        ("std::vector", ["std::vector"]),  # no digit: a word
    ],
)
def test_ipv6_addresses_are_masked_whole(text: str, expected: list[str]) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("from ns.marryaldkfaczcz.com", ["from", V]),
        ("dsl-082-083-227-067.arcor-ip.net", [V]),
        ("Resolved MSRA-SA-41.fareast.corp.example.com to rack", ["resolved", V, "to", "rack"]),
        ("proxy : web-3.corp.example.de:8080", ["proxy", V]),
        ("mail to ops@example.com", ["mail", "to", "ops@<*>"]),
        ("rhost=biblioteka.wsi.edu.pl", ["rhost=", V]),  # a country after a generic second level
        ("rhost=62.99.164.82.sh.interxion.inode.at", ["rhost=", V]),
    ],
)
def test_host_names_are_masked_like_addresses(text: str, expected: list[str]) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Deleting blk_1 file /mnt/hadoop/dfs/data/current/subdir5/blk_1", ["deleting", "blk_<*>", "file", V]),
        ('"GET /v2/e97/servers/detail?all_tenants=True&since=2017-05-16 HTTP/1.1"', ["get", V, "http/<*>"]),
        ("GET http://www.example.org/index.html?x=1 now", ["get", V, "now"]),
        ("request /10.10.34.11:45307", ["request", V]),
        ("adding path spec: /mapreduce/*", ["adding", "path", "spec", V]),
        ("read/write error", ["read/write", "error"]),  # a slash inside a word: not a path
        ("and / or", ["and", "or"]),
    ],
)
def test_a_path_or_url_is_one_variable_up_to_the_next_space(text: str, expected: list[str]) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Invalid user webmaster from 1.2.3.4", ["invalid", "user", V, "from", V]),
        ("session closed for user news", ["session", "closed", "for", "user", V]),
        ("invalid user user from x", ["invalid", "user", V, "from", "x"]),  # one value, not a chain
        ("user 42 logged in", ["user", V, "logged", "in"]),
        ("users logged in", ["users", "logged", "in"]),
    ],
)
def test_the_word_after_user_is_a_value(text: str, expected: list[str]) -> None:
    assert words(text) == expected


def test_the_product_keeps_account_names_elsewhere_and_other_values_after_user_equals() -> None:
    """The product did not take `accounts` or `user_key` (BENCHMARKS.md): it keeps an account's name away from
    ``for`` and ``user=``, and any other name after ``user=``."""
    assert words("mysql down, root fs full") == ["mysql", "down", "root", "fs", "full"]
    assert features_from_text("x user=alice") == {"x": 3, "user=": 1, "alice": 3}
    assert features_from_text("x user=guest") == {"x": 3, "user=": 1, "guest": 3}
    assert features_from_text("x user=root") == {"x": 3, "user": 3, V: 1}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rhost=1.2.3.4  user=mysql", ["rhost=", V, "user", V]),
        ("ruser= rhost=1.2.3.4 user=root", ["ruser=", "rhost=", V, "user", V]),
        ("user=root, tty=ssh", ["user", V, "tty=", "ssh"]),
        ("user= root", ["user", V]),  # the value in a chunk of its own
        ("USER=SSHD", ["user", V]),
        ("user=guest", ["user=", "guest"]),  # a login people choose: a word
        ("user=rooted", ["user=", "rooted"]),
        ("ruser=root", ["ruser=", "root"]),  # another key
        ("user=root=x", ["user=", "root=", "x"]),  # root= is a key, not a value
    ],
)
def test_a_system_account_after_user_equals_is_a_value(text: str, expected: list[str]) -> None:
    assert words(text) == expected


PAM_FAILURE = "pam_unix(sshd:auth): authentication failure; logname= uid=0 euid=0 tty=ssh ruser= rhost={host}"


def test_lines_of_pam_s_authentication_failure_land_together() -> None:
    """The loss version 6 closes: one template, ``user=root`` beside ``user=ftp``, 11 bits apart under version 5;
    the line with a login people choose, and the line without ``user=``, another template each, stay apart."""

    def fp(text: str) -> int:
        return fingerprint(features_from_text(text))

    root = PAM_FAILURE.format(host="5.36.59.76") + " user=root"
    ftp = PAM_FAILURE.format(host="183.62.140.253") + " user=ftp"
    assert distance(fp(root), fp(ftp)) == 0
    for other in (PAM_FAILURE.format(host="1.2.3.4"), PAM_FAILURE.format(host="1.2.3.4") + " user=guest"):
        assert distance(fp(root), fp(other)) > ALERT_DISTANCE


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Failed password for root from 1.2.3.4", ["failed", "password", "for", V, "from", V]),
        (
            "Too many authentication failures for root [preauth]",
            ["too", "many", "authentication", "failures", "for", V, "preauth"],
        ),
        ("for (mysql): ok", ["for", V, "ok"]),
        ("for root, then root", ["for", V, "then", "root"]),  # only right after `for`
        ("for mysqld", ["for", "mysqld"]),  # not a well-known account
        ("waiting for jobs", ["waiting", "for", "jobs"]),
        ("for 5 root", ["for", V, "root"]),  # a number between: not an account's name
        ("session opened for user root by (uid=0)", ["session", "opened", "for", "user", V, "by", "uid=", V]),
        ("for jul 9 2005", ["for", V, V, V]),  # a date still
    ],
)
def test_an_account_name_after_for_is_a_value(text: str, expected: list[str]) -> None:
    assert words(text) == expected


def test_lines_of_sshd_s_failed_password_template_land_together() -> None:
    """The loss version 4 closes: one template, ``for root`` beside ``for ftp``, 12 bits apart under version 3."""
    root = fingerprint(features_from_text("Failed password for root from 5.36.59.76 port 42393 ssh2"))
    ftp = fingerprint(features_from_text("Failed password for ftp from 5.188.10.180 port 54715 ssh2"))
    assert distance(root, ftp) == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("estimated size 8.8 KB, free 384.0 B", ["estimated", "size", V, "free", V]),
        ("took 5 ms", ["took", V]),
        ("5 s later", [V, "later"]),
        ("size kb", ["size", "kb"]),  # no number before it: a word
        ("took 5 seconds", ["took", V, "seconds"]),  # a unit that does not scale: kept
    ],
)
def test_a_unit_after_a_number_goes_with_it(text: str, expected: list[str]) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    "text",
    ["out.log", "hadoop-env.sh", "x.tar.gz", "java.io.ioexception", "mapred.task.id", "nova.osapi_compute.wsgi.server"],
)
def test_file_class_and_setting_names_are_not_host_names(text: str) -> None:
    assert words(text) == [text]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("err 0xDEADBEEF", ["err", V]),
        ("0x1f", [V]),
        ("54fadb412c4e40cdbaed9335e4c35a9e", [V]),
        ("v2/54fadb412c4e40cd/servers", ["v<*>"]),
        ("commit a3f9c2e1 reverted", ["commit", V, "reverted"]),
        ("12345678", [V]),  # no letter a-f: a number, and the same placeholder
    ],
)
def test_hex_strings_are_masked(text: str, expected: list[str]) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("deadbeef", ["deadbeef"]),  # no digit: a word
        ("a3f9c2e", ["a<*>"]),  # 7 hex digits: too short, masked as an identifier
        ("x54fadb412c4e40cd", ["x<*>"]),  # glued to a letter: not a hex string
    ],
)
def test_short_or_single_kind_hex_strings_are_not_hex(text: str, expected: list[str]) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("at Sat Jul  9 12:59:44 2005", ["at", V, V, V, V, V]),
        ("since July 9th", ["since", V, V]),
        ("since 9 Jul", ["since", V, V]),
        ("Tuesday, March 3rd", [V, V, V]),
        ("in Jul 2005", ["in", V, V]),
        ("in jul", ["in", "jul"]),  # no number beside it: a word
        ("sat down", ["sat", "down"]),
    ],
)
def test_dates_with_a_month_name_are_masked(text: str, expected: list[str]) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("disk full!!! (again) -- see #ops; ok?", ["disk", "full", "again", "see", "ops", "ok"]),
        ("__init__ --verbose a-b- ..x..", ["init", "verbose", "a-b", "x"]),
        ('"quoted", [bracketed], {braced}', ["quoted", "bracketed", "braced"]),
    ],
)
def test_punctuation_only_separates_words(text: str, expected: list[str]) -> None:
    assert words(text) == expected


def test_a_placeholder_already_in_the_text_reads_as_one() -> None:
    assert words("got <*> and <num>") == ["got", V, "and", "<num>"]


def test_every_masked_kind_is_the_one_placeholder() -> None:
    kinds = "1 0xff 38101a0b-2096-447d-96ea-a692162415ae 10.0.0.1 Jul 9 fe80::1 db-1.example.com 54fadb412c4e40cd /x"
    assert words(kinds) == [PLACEHOLDER] * 10


# --- bags ---


def test_each_word_counts_once_and_plain_words_weigh_three() -> None:
    assert features_from_text("Bye bye BYE, disk full on disk 3 and disk 7, uid=0") == {
        "bye": 3,
        "disk": 3,
        "full": 3,
        "on": 3,
        "<*>": 1,
        "and": 3,
        "uid=": 1,
    }


def test_a_line_of_numbers_is_not_dominated_by_the_placeholder() -> None:
    bag = features_from_text("dentry cache hash table entries: 16384 (order: 4, 65536 bytes)")
    assert bag["<*>"] == 1 and bag["entries"] == 3


def test_one_word_gives_a_bag_of_one_token() -> None:
    assert features_from_text("x") == {"x": 3}
    assert features_from_text("42") == {"<*>": 1}


@pytest.mark.parametrize("text", ["", "   ", "\n\t", "!!!", "-- ... ;;", "()[]{}<>", "_", "="])
def test_text_without_a_word_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="yields no token"):
        features_from_text(text)


def test_text_with_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(ValueError, match="lone surrogate"):
        features_from_text("disk \ud800 full")


def test_a_non_string_is_refused() -> None:
    with pytest.raises(TypeError, match="must be a str"):
        features_from_text(b"disk full")  # type: ignore[arg-type]


def test_near_identical_incidents_get_identical_bags() -> None:
    first = features_from_text(
        "Disk full on db-07 (10.0.3.17:5432): /var/lib/pg at 98%, request 38101a0b-2096-447d-96ea-a692162415ae, "
        "trace 0x7f3a22c1, since Mon Jan 5 03:14:00 UTC, ticket INC0012345, peer db7.example.com"
    )
    second = features_from_text(
        "disk full on DB-12 (10.0.9.201:5433): /var/lib/pg at 99%, request 9bc36dd9-91c5-4314-898a-47625eb93b09, "
        "trace 0x0000beef, since Fri Feb 13 22:40:59 UTC, ticket INC0099871, peer 10.1.1.1"
    )
    assert first == second
    assert fingerprint(first) == fingerprint(second)


def test_a_different_identifier_moves_a_line_less_than_a_different_word() -> None:
    line = fingerprint(features_from_text("Opening proxy : node-a.corp:5236 for job_0020 in queue default"))
    other_id = fingerprint(features_from_text("Opening proxy : node-b.corp:28345 for job_0020 in queue default"))
    other_word = fingerprint(features_from_text("Opening proxy : node-a.corp:5236 for job_0020 in queue batch"))
    assert distance(line, other_id) < distance(line, other_word)


def test_different_problems_get_distant_fingerprints() -> None:
    disk = fingerprint(features_from_text("Disk full on db-07: writes failing since 03:14 UTC"))
    cert = fingerprint(features_from_text("TLS certificate for api.example.com expires in 7 days"))
    assert distance(disk, cert) > ALERT_DISTANCE


def test_the_tokenizer_has_a_version() -> None:
    assert type(TOKENIZER_VERSION) is int and TOKENIZER_VERSION >= 2


# --- every bag is one the fingerprint accepts ---

log_fragments = st.one_of(
    st.text(max_size=12),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.uuids().map(str),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
    st.integers(min_value=0, max_value=2**64).map(hex),
    st.sampled_from(
        [
            *[
                "job-4711",
                "blk_-12",
                "Sat Jul  9",
                "<*>",
                "<num>",
                "a-",
                "--",
                "=",
                "/var/log/x-1",
                "ü",
                "٣",
                "a.b.com",
            ],
            *["for", "for root", "root", "(ftp)", "user"],
        ]
    ),
    st.from_regex(r"[a-z0-9-]{1,6}(\.[a-z0-9-]{1,6}){1,3}", fullmatch=True),
)
separators = st.sampled_from([" ", "", ":", ".", "-", ", ", "\n", "="])
log_like_text = st.lists(st.tuples(log_fragments, separators), max_size=12).map(
    lambda parts: "".join(fragment + separator for fragment, separator in parts)
)
any_text = st.text(alphabet=st.characters(exclude_categories=()), max_size=80)  # surrogates included


def _assert_valid_bag_or_refused(text: str) -> None:
    try:
        bag = features_from_text(text)
    except ValueError:
        assert not words(text) or any(0xD800 <= ord(char) <= 0xDFFF for char in text)
        return
    assert bag
    assert set(bag) == set(words(text))
    assert all(type(token) is str for token in bag)
    assert all(weight == (WORD_WEIGHT if token.isalpha() else 1) for token, weight in bag.items())
    assert fingerprint(bag) == fingerprint_reference(bag)


@settings(max_examples=300, deadline=None)
@given(any_text)
@example("")
@example("\ud800")
@example("x\ud800")
def test_any_text_gives_a_valid_bag_or_a_value_error(text: str) -> None:
    _assert_valid_bag_or_refused(text)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(log_like_text)
def test_log_like_text_gives_a_valid_bag_or_a_value_error(text: str) -> None:
    _assert_valid_bag_or_refused(text)


@settings(max_examples=300, deadline=None)
@given(st.one_of(log_like_text, st.text(max_size=60)))
def test_tokenizing_the_words_again_changes_nothing(text: str) -> None:
    tokens = words(text)
    assert words(" ".join(tokens)) == tokens


# --- the demo's built-in sample ---


def _sample_lines() -> list[dict[str, Any]]:
    text = resources.files("worker").joinpath("data/sample_incidents.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def test_sample_file_starts_with_the_spec_example() -> None:
    lines = _sample_lines()
    assert lines[:3] == [
        {"incident_id": "47", "features": {"dock": 3, "scanner": 2, "timeout": 1}},
        {"incident_id": "83", "features": {"weather": 4, "road": 2}},
        {"incident_id": "90", "features": {"dock": 3, "scanner": 2, "timeout": 1}},
    ]
    assert format_fingerprint(fingerprint(lines[0]["features"])) == "0b61171015620fa1"
    assert format_fingerprint(fingerprint(lines[1]["features"])) == "d82ccc6d72fe2dbe"


def test_every_sample_line_is_a_valid_incident() -> None:
    lines = _sample_lines()
    ids = [line["incident_id"] for line in lines]
    assert len(ids) == len(set(ids)), "incident IDs must be unique"
    texts = 0
    for line in lines:
        assert isinstance(line["incident_id"], str)
        assert 1 <= len(line["incident_id"]) <= 256
        assert set(line) in ({"incident_id", "features"}, {"incident_id", "text"}, {"incident_id", "text", "group"})
        if "features" in line:
            fingerprint(line["features"])
        else:
            texts += 1
            assert isinstance(line["text"], str)
            fingerprint(features_from_text(line["text"]))
            assert isinstance(line.get("group", ""), str)
    assert 40 <= texts <= 60


def _sample_groups() -> tuple[dict[str, list[int]], list[tuple[str | None, int]]]:
    texts = [line for line in _sample_lines() if "text" in line]
    fingerprints = [(line.get("group"), fingerprint(features_from_text(line["text"]))) for line in texts]
    groups: dict[str, list[int]] = defaultdict(list)
    for group, fp in fingerprints:
        if group is not None:
            groups[group].append(fp)
    return groups, fingerprints


def test_each_sample_group_has_a_pair_within_the_alert_distance() -> None:
    groups, _ = _sample_groups()
    assert len(groups) >= 5
    for group, fps in groups.items():
        assert len(fps) >= 2, f"group {group} has one incident"
        closest = min(distance(a, b) for a, b in itertools.combinations(fps, 2))
        assert closest <= ALERT_DISTANCE, f"group {group}: closest pair at distance {closest}"


def test_most_sample_group_pairs_are_within_the_alert_distance() -> None:
    groups, _ = _sample_groups()
    pairs = [distance(a, b) for fps in groups.values() for a, b in itertools.combinations(fps, 2)]
    assert sum(d <= ALERT_DISTANCE for d in pairs) >= 0.75 * len(pairs)


def test_sample_texts_of_different_groups_are_apart() -> None:
    groups, fingerprints = _sample_groups()
    for (name_a, fps_a), (name_b, fps_b) in itertools.combinations(groups.items(), 2):
        assert any(distance(a, b) > ALERT_DISTANCE for a in fps_a for b in fps_b), (name_a, name_b)
    unrelated = [
        distance(fp_a, fp_b)
        for (group_a, fp_a), (group_b, fp_b) in itertools.combinations(fingerprints, 2)
        if group_a is None or group_a != group_b
    ]
    assert sum(d <= ALERT_DISTANCE for d in unrelated) <= 0.02 * len(unrelated)
    assert sum(d > ALERT_DISTANCE for d in unrelated) > 0


# --- real log lines (Loghub), when the shared data is there ---

loghub = pytest.mark.skipif(not LOGHUB.is_dir(), reason=f"Loghub samples not found at {LOGHUB}")


def _loghub(system: str) -> list[tuple[str, str]]:
    path = LOGHUB / f"{system}_2k.log_structured.csv"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    with path.open(newline="", encoding="utf-8") as handle:
        return [(row["Content"], row["EventId"]) for row in csv.DictReader(handle)]


def _template_pair_rates(lines: list[tuple[str, str]], pairs: int = 2000) -> tuple[float, float]:
    """Fractions of same-template and of different-template pairs within the alert distance."""
    fps = [fingerprint(features_from_text(content)) for content, _ in lines]
    by_template: dict[str, list[int]] = defaultdict(list)
    for index, (_, template) in enumerate(lines):
        by_template[template].append(index)
    rng = random.Random(7)
    paired = [index for index, (_, template) in enumerate(lines) if len(by_template[template]) > 1]
    same = diff = 0
    for _ in range(pairs):
        first = rng.choice(paired)
        second = rng.choice([i for i in by_template[lines[first][1]] if i != first])
        same += distance(fps[first], fps[second]) <= ALERT_DISTANCE
        first, second = rng.randrange(len(lines)), rng.randrange(len(lines))
        while lines[first][1] == lines[second][1]:
            second = rng.randrange(len(lines))
        diff += distance(fps[first], fps[second]) <= ALERT_DISTANCE
    return same / pairs, diff / pairs


@loghub
@pytest.mark.parametrize("system", ["Apache", "HDFS", "Hadoop", "Linux", "OpenSSH", "OpenStack", "Spark", "Zookeeper"])
def test_loghub_lines_of_one_template_land_together(system: str) -> None:
    same, diff = _template_pair_rates(_loghub(system))
    assert same >= 0.95, f"{system}: only {same:.1%} of same-template pairs within {ALERT_DISTANCE}"
    assert diff <= 0.01, f"{system}: {diff:.1%} of different-template pairs within {ALERT_DISTANCE}"


@loghub
def test_every_loghub_line_gives_a_bag() -> None:
    for path in sorted(LOGHUB.glob("*_structured.csv")):
        with path.open(newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                assert features_from_text(row["Content"]), row["Content"]


# --- cost: linear in the text, whatever it holds ---

slashy_chunk = st.lists(
    st.sampled_from(["/", "a", "1", "_", "-", ".", ":", "=", "<*>", "<num>", "<", ">", "*", "://"]), max_size=30
).map("".join)


@settings(max_examples=500, deadline=None)
@given(slashy_chunk)
@example("a" + "/" * 20)
@example("/a//<*>//=/")
@example("<num>//")
def test_a_chunk_is_cut_into_the_words_the_patterns_find(chunk: str) -> None:
    """The words of a chunk are what the word pattern finds in it (the brute force, quadratic in slashes)."""
    from worker.text import _PLAIN_RAW_WORD_RE, _RAW_WORD_RE, _chunk_matches

    pattern = _RAW_WORD_RE if "<" in chunk else _PLAIN_RAW_WORD_RE
    assert _chunk_matches(chunk) == pattern.findall(chunk)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("tail", ["/", "/-", "//<*>", "/="])
def test_a_megabyte_of_slashes_is_tokenized_in_linear_time(tail: str) -> None:
    """A path starts at a slash with a letter or digit after it; looking for one after each of a million slashes
    once took hours (a text event of the entry size limit held a worker that long, and then each one that took the
    entry over)."""
    text = "disk full " + tail * (1_000_000 // len(tail))
    assert set(features_from_text(text)) >= {"disk", "full"}
    with pytest.raises(ValueError, match="yields no token"):
        features_from_text("/" * 1_000_000)


def _bag_or_refusal(text: str) -> dict[str, int] | str:
    try:
        return features_from_text(text)
    except ValueError:
        return "refused"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=60), log_like_text))
@example("Échec de connexion à la base de données sur db-07")
@example("हिन्दी सर्वर 7 बंद")
@example("ＥＲＲＯＲ ﬁle not found ①")
@example("x\ud800")
def test_every_form_of_a_text_gives_one_bag(text: str) -> None:
    """Rule 1 (version 5): a text and each of its Unicode normal forms give the same bag (or are all refused), so a
    producer that writes decomposed text (as some macOS APIs do) or full-width letters meets its composed form."""
    import unicodedata

    expected = _bag_or_refusal(text)
    for form in ("NFC", "NFD", "NFKC", "NFKD"):
        assert _bag_or_refusal(unicodedata.normalize(form, text)) == expected, form


def test_a_decomposed_or_full_width_line_lands_on_its_composed_form() -> None:
    import unicodedata

    line = "Échec de connexion à la base de données sur db-07"
    decomposed = unicodedata.normalize("NFD", line)
    assert decomposed != line and words(decomposed) == words(line)
    assert words(unicodedata.normalize("NFD", "naïve")) == ["naïve"]  # version 4 cut it into "nai" and "ve"
    assert distance(fingerprint(features_from_text(line)), fingerprint(features_from_text(decomposed))) == 0
    assert words("ＥＲＲＯＲ: ﬁle ＤＢ０７ down") == ["error", "file", "db<*>", "down"]
    # a combining vowel sign with no composed form still separates words, alike in every form
    assert words("हिन्दी") == words(unicodedata.normalize("NFD", "हिन्दी")) == ["ह", "न", "द"]
