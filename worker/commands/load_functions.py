"""`incident-worker load-functions`: the deployment step that loads the index's Redis Functions library.

Workers may not load code (docs/contract.md#who-may-do-what): whoever can load a library can replace any other
application's, or squat the worker's function names; so their Redis user has no FUNCTION LOAD. An administrator runs
this once per version of the code, before that version's workers start: docker-compose.yml as a one-shot service
the workers wait for, deploy/kubernetes/load-functions.yaml as a Job.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

import redis

from .. import __version__
from ..errors import CommandError
from ..replies import text
from ..settings import Settings
from ._format import json_line
from ._shared import EXIT_OK, add_settings_flags, describe, json_flag, refused_permission, with_settings

__all__ = ["configure"]


@with_settings("load-functions")
def _load_functions(args: argparse.Namespace, settings: Settings) -> int:
    from .. import library
    from ..connection import connect

    admin_url = settings.admin_redis_url or settings.redis_url
    admin = settings.model_copy(update={"redis_url": admin_url})
    client = connect(admin, client_name="incident-worker-load-functions")
    try:
        library.load(client)
        others = [name for name in _other_versions(client) if name != library.LIBRARY_NAME]
    except redis.exceptions.NoPermissionError as error:
        # not a grant to add: the workers' user must never load code (docs/contract.md, "Who may do what")
        raise CommandError(
            refused_permission(
                admin,
                error,
                "loading the functions is an administrator's step: give an admin's URL as --admin-redis-url (or "
                "INCIDENT_WORKER_ADMIN_REDIS_URL), never the workers' user",
            )
        ) from None
    if args.delete_other_versions:
        for name in others:
            client.function_delete(name)
    where = admin.safe_redis_url
    if args.json:
        kept = [] if args.delete_other_versions else others
        deleted = others if args.delete_other_versions else []
        print(
            json_line(
                {
                    "loaded": library.LIBRARY_NAME,
                    "version": __version__,
                    "redis": where,
                    "other_versions": kept,
                    "deleted": deleted,
                }
            )
        )
        return EXIT_OK
    print(f"loaded {library.LIBRARY_NAME} (incident-fingerprint-worker {__version__}) into Redis at {where}")
    if others and args.delete_other_versions:
        print(f"deleted the other versions' libraries: {', '.join(others)}")
    elif others:
        print(
            f"other versions' libraries are loaded too: {', '.join(others)}; once no worker of those versions "
            "runs, remove them with --delete-other-versions"
        )
    return EXIT_OK


_VERSION_NAME = re.compile(r"incident_index_(v\d+|[0-9a-f]{10})")
"""The names this code's libraries have had: a version number, then a hash of the source."""


def _other_versions(client: Any) -> list[str]:
    """The libraries of this code on the server (any version): named as it names them, and registering the functions
    it registers (`<name>_apply`, `<name>_ensure_meta`). Another application's library whose name merely starts with
    incident_index_ is none of them, and --delete-other-versions leaves it alone."""
    listed = client.function_list(library="incident_index_*")
    replies = list(listed.values()) if isinstance(listed, dict) else [listed]  # a cluster client answers per node
    ours = set()
    for reply in replies:
        for entry in reply:
            fields = {
                text(k): v
                for k, v in (
                    dict(zip(entry[::2], entry[1::2], strict=True)) if isinstance(entry, list) else entry
                ).items()
            }
            name = text(fields.get("library_name", ""))
            functions = set()
            for function in fields.get("functions") or []:
                described = (
                    dict(zip(function[::2], function[1::2], strict=True)) if isinstance(function, list) else function
                )
                functions.add(text(described.get(b"name", described.get("name", ""))))
            if _VERSION_NAME.fullmatch(name) and {f"{name}_apply", f"{name}_ensure_meta"} <= functions:
                ours.add(name)
    return sorted(ours)


def configure(parser: argparse.ArgumentParser) -> None:
    describe(
        parser,
        "Load the index's Redis Functions library (worker/lua/, named after a hash of its code) with an "
        "administrator's credentials: FUNCTION LOAD REPLACE, on every primary of a cluster. Workers may not load "
        "code, so this is a deployment step, run once per version of the code before its workers start (compose "
        "and the Kubernetes manifests do it). Loading is idempotent; several versions' libraries can be loaded "
        "at once, for a rolling upgrade. The administrator's URL is --admin-redis-url (or "
        "INCIDENT_WORKER_ADMIN_REDIS_URL), else --redis-url.",
        examples="""
  incident-worker load-functions --admin-redis-url redis://admin:PASSWORD@redis:6379/0
  INCIDENT_WORKER_ADMIN_REDIS_URL=redis://admin:PASSWORD@redis:6379/0 incident-worker load-functions --json
  incident-worker load-functions --delete-other-versions     # after an upgrade, once no old worker runs
  docker compose run --rm load-functions
""",
        exits="""
  0  loaded
  1  Redis refused (a user without FUNCTION LOAD, for one) or cannot be reached
  2  bad usage or settings
""",
    )
    parser.add_argument(
        "--delete-other-versions",
        action="store_true",
        help="also delete the libraries of other versions of this code (never another application's)",
    )
    json_flag(parser, "what was loaded and what other versions are loaded as one JSON object")
    add_settings_flags(parser, only=["admin_redis_url", "redis_url", "cluster"])
    parser.set_defaults(handler=_load_functions)
