"""A generated hostile-input corpus for the reliability suite: every kind of bad entry the contract names, oversized
and deeply nested input, odd Unicode, and IDs that look like key names, hash tags or stream IDs, interleaved with
valid events.

`corpus(seed, valid=...)` returns the entries in publishing order; each says whether it is valid (it must be indexed
once) or hostile (it must be dead-lettered once, with `reason` when the reason is certain).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from worker.devtools.workload import Workload
from worker.text import features_from_text

LIMITS = {"max_tokens": 50, "max_token_length": 100, "max_entry_bytes": 20_000}
"""Worker settings the corpus is built against (small, so that oversized input stays cheap to publish)."""

ODD_IDS = [
    "{incidents}:fp",
    "{incidents}:meta",
    "{incidents}:band:0:0000",
    "{incidents}:events",
    "{other}",
    "{",
    "}",
    "{}",
    "*",
    "$",
    ">",
    "0-0",
    "-",
    "+",
    "0",
    "incidents",
    "nul\x00byte",
    "line\nbreak",
    " spaced ",
    "\u202eright-to-left",
    "zero\u200bwidth",
    "e\u0301",
    "\u00e9",
    "\U0001f525",
    "\u6f22\u5b57",
    "x" * 256,
    '"quoted"',
    "back\\slash",
]
"""Valid incident IDs that are easy to mishandle: each must be indexed under exactly this string."""

TEXT_TEMPLATES = [
    "Disk full on db-{host}: writes failing since {n}",
    "Failed password for {word} from 10.0.{host}.{n} port {n} ssh2",
    "Connection refused to cache-{host}.prod:6379 after {n} retries ({word})",
    "TLS certificate for api-{host}.example.com expires in {n} days",
    "GET /v2/orders/{n}?user={word} returned 500 in {n} ms",
    "kernel: Out of memory: Killed process {n} ({word}) on node-{host}",
]
"""Log-line templates of the corpus's text events: lines of one template land near each other."""

TEXT_WORDS = ["root", "admin", "nginx", "postgres", "deploy", "backup", "ftp", "guest"]

ODD_TOKENS = ["", "\u200b", "e\u0301", "\u00e9", "\U0001f525", "\x00", "\u202e", "\u6f22", "t" * 100, "{incidents}"]


@dataclass(frozen=True)
class Entry:
    fields: dict[str, Any]
    valid: bool
    reason: str | None = None  # the dead letter's reason, when the corpus knows it for certain

    @property
    def incident_id(self) -> str:
        return str(self.fields["incident_id"])

    @property
    def features(self) -> dict[str, int]:
        """The bag: the features given, or the bag of the text (a text event)."""
        if "text" in self.fields:
            return features_from_text(self.fields["text"])
        return dict(self.fields["features"])


def _hostile(rng: random.Random, n: int) -> list[Entry]:
    good = json.dumps({"dock": 3, "scanner": 2})
    kinds: list[tuple[dict[str, Any], str | None]] = [
        ({"features": good}, "missing_field"),
        ({"incident_id": f"h{n}"}, "missing_field"),
        ({"incident_id": f"h{n}", "op": "upsert"}, "missing_field"),
        ({"incident_id": f"h{n}", "features": '{"dock": 3,'}, "bad_json"),
        ({"incident_id": f"h{n}", "features": "{not json"}, "bad_json"),
        ({"incident_id": f"h{n}", "features": ""}, "bad_json"),
        ({"incident_id": f"h{n}", "features": '{"a":' + "[" * 5000}, "bad_json"),  # nested past the parser
        ({"incident_id": f"h{n}", "features": '{"a": ' + "9" * 5000 + "}"}, None),  # an integer of 5,000 digits
        ({"incident_id": f"h{n}", "features": "[1, 2]"}, "bad_features"),
        ({"incident_id": f"h{n}", "features": '"text"'}, "bad_features"),
        ({"incident_id": f"h{n}", "features": "null"}, "missing_field"),
        ({"incident_id": f"h{n}", "features": '{"dock": true}'}, "bad_weight"),
        ({"incident_id": f"h{n}", "features": '{"dock": 2.0}'}, "bad_weight"),
        ({"incident_id": f"h{n}", "features": '{"dock": "2"}'}, "bad_weight"),
        ({"incident_id": f"h{n}", "features": '{"dock": 0}'}, "bad_weight"),
        ({"incident_id": f"h{n}", "features": '{"dock": -4}'}, "bad_weight"),
        ({"incident_id": f"h{n}", "features": '{"dock": 9007199254740992}'}, "bad_weight"),
        ({"incident_id": f"h{n}", "features": '{"dock": {"deep": 1}}'}, "bad_weight"),
        ({"incident_id": f"h{n}", "features": "{}"}, "empty_bag"),
        ({"incident_id": f"h{n}", "features": '{"\\ud800": 1}'}, "bad_token"),
        ({"incident_id": f"h{n}", "features": b'{"\xff\xfe": 1}'}, "not_utf8"),
        ({"incident_id": b"\xc3\x28" + str(n).encode(), "features": good}, "not_utf8"),
        ({"incident_id": "", "features": good}, "bad_incident_id"),
        ({"incident_id": "x" * 257, "features": good}, "bad_incident_id"),
        ({"incident_id": f"h{n}", "features": good, "op": "purge"}, "bad_op"),
        ({"incident_id": f"h{n}", "features": good, "op": "ADD"}, "bad_op"),
        ({"incident_id": f"h{n}", "features": json.dumps({f"t{i}": 1 for i in range(60)})}, "too_many_tokens"),
        ({"incident_id": f"h{n}", "features": json.dumps({"t" * 101: 1})}, "token_too_long"),
        ({"incident_id": f"h{n}", "features": good, "padding": "p" * rng.randint(20_001, 60_000)}, "too_large"),
        ({"incident_id": f"h{n}", "features": json.dumps({f"k{i}": 1 for i in range(3000)})}, "too_large"),
        # text events
        ({"incident_id": f"h{n}", "features": good, "text": "disk full"}, "features_and_text"),
        ({"incident_id": f"h{n}", "features": good, "text": ""}, "features_and_text"),
        ({"incident_id": f"h{n}", "text": ""}, "empty_bag"),
        ({"incident_id": f"h{n}", "text": " \t-- !!! (...) \x00\x1b"}, "empty_bag"),
        ({"incident_id": f"h{n}", "text": "/" * 19_000}, "empty_bag"),  # once quadratic: seconds of a worker
        ({"incident_id": f"h{n}", "text": b"disk \xff full"}, "not_utf8"),
        ({"incident_id": f"h{n}", "text": b"disk \xed\xa0\x80 full"}, "not_utf8"),  # a surrogate, as CESU-8
        (
            {"incident_id": f"h{n}", "text": " ".join(f"w{c}{d}" for c in "abcdefgh" for d in "abcdefgh")},
            "too_many_tokens",
        ),
        ({"incident_id": f"h{n}", "text": "disk " + "t" * 101}, "token_too_long"),
        ({"incident_id": f"h{n}", "text": "disk full", "op": "merge"}, "bad_op"),
        ({"incident_id": f"h{n}", "text": "disk " + "\u00e9" * 10_000}, "too_large"),  # 20,005 bytes, not characters
    ]
    fields, reason = rng.choice(kinds)
    return [Entry(fields, valid=False, reason=reason)]


def corpus(seed: int, *, valid: int = 2000, hostile_every: int = 8) -> list[Entry]:
    """`valid` events from the synthetic workload plus every odd-but-valid ID and token, with a hostile entry after
    every `hostile_every` valid ones (each kind at random); all valid incident IDs differ."""
    rng = random.Random(seed)
    entries: list[Entry] = []
    for incident_id, bag in Workload(seed=seed).take(valid):
        entries.append(Entry({"incident_id": incident_id, "features": bag}, valid=True))
    for k, odd in enumerate(ODD_IDS):
        bag = {rng.choice(ODD_TOKENS): rng.randint(1, 5), f"odd{k}": 1}
        entries.append(Entry({"incident_id": odd, "features": bag, "extra": "ignored"}, valid=True))
    for k in range(valid // 10):  # text events: log lines of a few kinds, with near duplicates among them
        template = rng.choice(TEXT_TEMPLATES)
        line = template.format(host=rng.randint(1, 40), n=rng.randint(0, 99_999), word=rng.choice(TEXT_WORDS))
        entries.append(Entry({"incident_id": f"text-{k}", "text": line}, valid=True))
    entries.append(
        Entry(
            {"incident_id": "odd-text", "text": "e\u0301 \u202eabc \x1b[2J \U0001f525 \u6f22\u5b57 x\x00y"}, valid=True
        )
    )
    entries.append(Entry({"incident_id": "max-weight", "features": {"w": 2**53 - 1, "v": 1}}, valid=True))
    entries.append(Entry({"incident_id": "all-odd-tokens", "features": dict.fromkeys(ODD_TOKENS, 1)}, valid=True))
    rng.shuffle(entries)
    mixed: list[Entry] = []
    for n, entry in enumerate(entries):
        mixed.append(entry)
        if hostile_every and n % hostile_every == 0:
            mixed.extend(_hostile(rng, n))
    return mixed


def publish_corpus(client: Any, entries: list[Entry], stream: str = "{incidents}:events") -> list[str]:
    """XADD every entry (a features dict as JSON); returns the entry IDs in order."""
    pipe = client.pipeline(transaction=False)
    for entry in entries:
        fields = {k: json.dumps(v, ensure_ascii=False) if isinstance(v, dict) else v for k, v in entry.fields.items()}
        pipe.xadd(stream, fields)
    return [i.decode() if isinstance(i, bytes) else str(i) for i in pipe.execute()]
