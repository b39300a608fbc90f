"""`incident-worker verify [--repair]`: check that the postings, twin groups, meta and expiry entries are what the
fingerprints call for, online, and repair what is not. `collect_verify` walks and returns a `VerifyReport`
(worker/integrity.py); `print_verify` and `VerifyReport.as_json` show it."""

from __future__ import annotations

import argparse

from ..integrity import DEFAULT_BATCH, KINDS, REPAIRS, Verifier, VerifyReport
from ..settings import Settings
from ._format import duration, json_line, plural, shown
from ._shared import (
    CONNECTION,
    EXIT_FAILURE,
    EXIT_OK,
    add_settings_flags,
    command_client,
    count_arg,
    describe,
    json_flag,
    positive_arg,
    setting_given,
    with_settings,
)

__all__ = ["collect_verify", "configure", "print_verify"]

SHOWN_EXAMPLES = 5
"""Findings of each kind written out in the summary for people; `--json --examples N` gives more."""


def collect_verify(
    client: object, settings: Settings, *, repair: bool, batch: int, max_rate: float, configured: bool
) -> VerifyReport:
    """Walk the index of `settings.namespace` and check (or repair) it. `configured`: the user chose the layout
    (flags or environment), so a stored layout that differs is a finding."""
    layout = (settings.bands, settings.max_distance)
    verifier = Verifier(
        client,  # type: ignore[arg-type]
        settings.namespace,
        repair=repair,
        batch=batch,
        max_rate=max_rate,
        configured=layout if configured else None,
        default_layout=layout,
    )
    return verifier.run()


def print_verify(report: VerifyReport, examples: int = SHOWN_EXAMPLES) -> None:
    """The findings for people: one line per kind with its meaning, a few examples, and what to do."""
    scanned = report.scanned
    print(
        f"verified {{{report.namespace}}} ({report.layout or 'no layout'}) in {duration(report.elapsed_s)}: "
        f"{plural(scanned['incidents'], 'incident')}, {plural(scanned['posting_keys'], 'posting set')}, "
        f"{plural(scanned['groups'], 'twin group')}"
        + (f", {scanned['expiry_entries']:,} expiry entries" if scanned["expiry_entries"] else "")
        + (f", {scanned['group_entries']:,} group entries" if scanned["group_entries"] else "")
    )
    counts = report.counts
    if not counts:
        print("no findings: the postings, twin groups, groups and meta are what the fingerprints call for")
        return
    for kind, count in counts.items():
        found = report.examples(kind, examples)
        fixed = sum(1 for f in report.findings if f.kind == kind and f.repaired)
        state = f", {fixed:,} {REPAIRS[kind]}" if report.repair else ""
        print(f"{kind}: {count:,} ({KINDS[kind]}){state}")
        for finding in found:
            detail = f"  [{shown(finding.detail)}]" if finding.detail else ""
            print(f"  {shown(finding.subject)}{detail}")
        if count > len(found):
            print(f"  ... and {count - len(found):,} more")
    if report.dropped:
        print(f"{plural(report.dropped, 'finding')} no longer held when repaired (a worker changed it meanwhile)")
    unrepaired = report.unrepaired
    if report.repair and not unrepaired:
        print(f"repaired all {len(report.findings):,}; run verify again to see a clean index")
    elif report.repair:
        print(f"{plural(len(unrepaired), 'finding')} not repaired: see above")
    else:
        print(f"{plural(len(unrepaired), 'finding')}: run `incident-worker verify --repair` to fix them")


@with_settings("verify")
def _verify(args: argparse.Namespace, settings: Settings) -> int:
    configured = setting_given(args, "bands") or setting_given(args, "max_distance")
    report = collect_verify(
        command_client(settings, "verify"),
        settings,
        repair=args.repair,
        batch=args.batch,
        max_rate=args.max_rate,
        configured=configured,
    )
    if args.json:
        print(json_line(report.as_json(args.examples)))
    else:
        print_verify(report, args.examples)
    return EXIT_OK if report.clean else EXIT_FAILURE


def configure(parser: argparse.ArgumentParser) -> None:
    describe(
        parser,
        "Check the index online, while workers keep processing: every incident of {N}:fp has its fingerprint's "
        "postings (one representative per fingerprint) and its twin group, no posting or group member lacks its "
        "incident or belongs to another fingerprint, fingerprints are 16 lowercase hex digits, {N}:meta agrees "
        "with the layout, and {N}:expiry (with retention) has one entry per incident. Each finding is confirmed "
        "in one atomic step before it is reported. --repair fixes each one atomically from {N}:fp, only where it "
        "still holds, so it never undoes a worker's change.",
        examples="""
  incident-worker verify
  incident-worker verify --repair --max-rate 20000
  incident-worker verify --json | jq '.counts'
""",
        exits="""
  0  no findings (with --repair: every finding repaired)
  1  findings left, the index cannot be verified (a migration under way, a meta of another version), or Redis failed
  2  bad usage or settings
""",
    )
    parser.add_argument("--repair", action="store_true", help="fix each confirmed finding (atomically, per subject)")
    parser.add_argument(
        "--batch",
        type=positive_arg,
        default=DEFAULT_BATCH,
        metavar="N",
        help=f"keys or members read per step, and so the work of each call (default {DEFAULT_BATCH})",
    )
    parser.add_argument(
        "--max-rate",
        type=count_arg,
        default=0,
        metavar="N",
        help="read at most N items (incidents, set members) per second, sleeping between steps (default 0: no limit)",
    )
    parser.add_argument(
        "--examples",
        type=count_arg,
        default=SHOWN_EXAMPLES,
        metavar="N",
        help=f"findings of each kind to show (default {SHOWN_EXAMPLES})",
    )
    json_flag(parser, "the report as one JSON object")
    add_settings_flags(parser, only=[*CONNECTION, "bands", "max_distance"])
    parser.set_defaults(handler=_verify)
