"""A snapshot send's adds written as one apply_batch call, straight to Redis protocol bytes
(`FingerprintIndex.snapshot_adds`, the snapshot path's hot loop): the very bytes hiredis makes of the calls
`FingerprintIndex.apply_command` builds, in a few strings an add (tests/test_snapshot_adds.py holds them equal)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from . import library
from .copywritten import WrittenListing
from .library import SnapshotClaim, StreamTarget
from .transport import Packed, bulk, sends_packed

__all__ = ["SnapshotAdd", "pack_adds"]


class SnapshotAdd(NamedTuple):
    """One add of a snapshot send, for `FingerprintIndex.snapshot_adds`: what its `apply_command` would be given."""

    incident_id: str
    fp: int
    entry_id: str
    claim: SnapshotClaim
    alert_text: str
    tokenizer: str
    alert_extra: str | None
    """`library.pack_alert_extra` of this add; None: the send's."""


_BULK_DISTANCES = {d: bulk(str(d)) for d in range(65)}
"""A listed match's distance as an argument (`FingerprintIndex.snapshot_adds`)."""


class _PairCache(dict[tuple[str, int], str]):
    """(ID, distance) -> the pair's two arguments, written on a miss (`__missing__`) and kept: a whole listing is
    then one join over look-ups made in C, with Python only for the pairs not seen before.

    A near storm's claims list 116 matches each, nearly all of them listed by earlier claims too (96% of the IDs in
    the storm of `bench --near-storm`), but most claims also list one pair or more not seen before. A cache that
    fell back to writing the whole listing at its first miss wrote most listings pair by pair: a third of a storm
    worker's Python time (benchmarks/journal/near-storms.md, section 12). Emptied at _PAIRS_KEPT."""

    def __missing__(self, pair: tuple[str, int]) -> str:
        incident_id, d = pair
        written = f"${len(incident_id)}\r\n{incident_id}\r\n" + (_BULK_DISTANCES.get(d) or bulk(str(d)))
        if type(incident_id) is str and type(d) is int:  # (what else a listing holds is written, not kept)
            self[pair] = written
        return written


_PAIRS = _PairCache()
_PAIRS_KEPT = 65_536


def _listing(listed: Sequence[tuple[str, int]]) -> str:
    """A claim's listed matches as their arguments (ID, distance, ...): as the copy's compiled loop wrote them
    (`copywritten`), or written from the cache."""
    if type(listed) is WrittenListing:
        return listed.written
    try:
        return "".join(map(_PAIRS.__getitem__, listed))
    except TypeError:  # (a listing of lists, which are no keys: each pair written)
        return "".join(_PairCache.__missing__(_PAIRS, (m, d)) for m, d in listed)


def pack_adds(
    index: Any,
    adds: Sequence[SnapshotAdd],
    *,
    stream: StreamTarget,
    max_matches: int = 0,
    max_candidates: int | None = None,
    alert_extra: str = "",
    max_replied: int | None = None,
) -> Packed | None:
    """The apply_batch call of these adds on the snapshot path, packed: the very bytes hiredis makes of
    `library.apply_batch` of each add's `apply_command("add", incident_id, fp, stream=stream, entry_id=...,
    snapshot=claim, alert_text=..., tokenizer=...)`, written in a few strings an add instead of ~36 arguments
    built, flattened, sliced and packed one by one (a fifth of a snapshot worker's CPU went there).

    None when they cannot be written so: a migration under way (its postings too), a cluster client (its
    pipelines take arguments, `sends_packed`), or any text that is not ASCII. Build the calls one by one then.
    `alert_extra` is each add's `library.pack_alert_extra`, the same for all (an add's own, when it is given
    in `SnapshotAdd`, wins); `max_replied` as `apply_command`'s.
    """
    if index.building is not None or not sends_packed(index.redis):
        return None
    keys, layout = index.keys, index.layout
    limits = library.pack_limits(
        max_matches, index.max_candidates if max_candidates is None else max_candidates, max_replied
    )
    # the keys and arguments every add of the send shares (ApplyKeys, ApplyArgs: the order is theirs)
    head = "".join(map(bulk, (keys.meta, keys.fingerprints, keys.changes, stream.events_stream, stream.alerts_stream)))
    expiry = bulk(keys.expiry)
    shared = "".join(bulk(str(v)) for v in (index.layout_tag, layout.max_distance, layout.bands, 0, stream.group))
    after_entry = "".join(bulk(str(v)) for v in (stream.alerts_maxlen, limits, 0))
    n_keys = bulk(str(8 + layout.bands))
    twin_prefix, posting_keys, pack_claim = keys.twin_prefix, index.posting_keys, library.pack_claim
    n_twins = len(twin_prefix) + 16  # a twin key's length, of a fingerprint of 64 bits (16 hex digits)
    # a band of whole hex digits (the default layout's 16 bits at 0, 16, 32, 48) names its posting key by the
    # fingerprint's own digits: its key is prefix + hex_fp[start:end], no look-up (others: `posting_keys`)
    sliced = [
        (f"${len(band.prefix) + digits}\r\n{band.prefix}", 16 - (offset + width) // 4, 16 - offset // 4)
        for band, offset, width, digits in zip(
            index._band_keys, layout.offsets, layout.widths, layout.hex_digits, strict=True
        )
        if offset % 4 == 0 and width == 4 * digits
    ]
    if len(sliced) < layout.bands:
        sliced = []
    if len(_PAIRS) > _PAIRS_KEPT:
        _PAIRS.clear()
    key_parts: list[str] = []
    counts: list[str] = []
    arg_parts: list[str] = []
    n_args = 0
    for incident_id, fp, entry_id, claim, alert_text, tokenizer, extra in adds:
        hex_fp = f"{fp:016x}"
        if len(hex_fp) != 16:
            return None  # not a fingerprint of 64 bits (apply_command sends it, for the call to refuse)
        if sliced:
            postings = "".join([f"{pre}{hex_fp[start:end]}\r\n" for pre, start, end in sliced])
        else:
            postings = "".join([f"${len(k)}\r\n{k}\r\n" for k in posting_keys(fp)])
        key_parts.append(
            f"{head}${n_twins}\r\n{twin_prefix}{hex_fp}\r\n${n_twins}\r\n{twin_prefix}{hex_fp}\r\n{expiry}{postings}"
        )
        packed = pack_claim(claim)
        listed = claim.listed
        n_listed = listed.arguments if type(listed) is WrittenListing else 2 * len(listed)
        n_args += 18 + n_listed
        counts.append(f"{n_keys}${len(str(18 + n_listed))}\r\n{18 + n_listed}\r\n")
        if extra is None:
            extra = alert_extra
        arg_parts.append(
            f"$3\r\nadd\r\n${len(incident_id)}\r\n{incident_id}\r\n$16\r\n{hex_fp}\r\n$1\r\n*\r\n{shared}"
            f"${len(entry_id)}\r\n{entry_id}\r\n{after_entry}${len(alert_text)}\r\n{alert_text}\r\n"
            f"${len(tokenizer)}\r\n{tokenizer}\r\n${len(packed)}\r\n{packed}\r\n$0\r\n\r\n"
            f"${len(extra)}\r\n{extra}\r\n"
        )
        if n_listed:
            arg_parts.append(_listing(listed))
    n, keys_total = len(adds), (8 + layout.bands) * len(adds)
    command = (
        f"*{3 + keys_total + 1 + 2 * n + n_args}\r\n$5\r\nFCALL\r\n{bulk(library.FN_APPLY_BATCH)}"
        f"{bulk(str(keys_total))}{''.join(key_parts)}{bulk(str(n))}{''.join(counts)}{''.join(arg_parts)}"
    )
    return Packed(command.encode()) if command.isascii() else None
