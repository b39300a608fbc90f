"""Redis URLs: checked before use, and shown without their secrets.

redis-py reads `redis://`, `rediss://` (TLS) and `unix://` URLs, with a password in the user-info part
(`redis://user:password@host`) or as a query parameter (`?password=`, and `?ssl_password=` for the passphrase of a
TLS key). Python's URL parser reads some mistyped URLs as something else without a word: an unencoded `#` in a
password starts a fragment, an unencoded `/` or `?` ends the host part early, so `redis://:pa/ss@db:6379/0` connects
to localhost with no password. `check_url` refuses every such URL with a message that says which character to
encode and how, and never quotes the URL; `safe_url` is the only form of a URL that may be shown; `url_secrets`
lists what must never be shown, for the logs to hide wherever it turns up.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import cast
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from redis.connection import URL_QUERY_ARGUMENT_PARSERS, SSLConnection, parse_url

from .errors import RedisUrlError

__all__ = ["SCHEMES", "SECRET_PARAMETERS", "RedisUrlError", "check_url", "safe_url", "url_secrets"]

SCHEMES = ("redis", "rediss", "unix")

SECRET_PARAMETERS = frozenset({"password", "ssl_password"})
"""Query parameters whose values are secrets (redis-py hands both to the connection)."""

_TEXT_PARAMETERS = frozenset({"password", "username", "client_name"})
_TLS_PARAMETERS = frozenset(
    {
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_password",
        "ssl_ciphers",
        "ssl_check_hostname",
        "ssl_min_version",
    }
)
# TLS options that only later redis-py versions' connections take (5.3 has no verify flags): allowed where the
# installed one takes them, since an option it does not know fails at the first command
_LATER_TLS_OPTIONS = frozenset({"ssl_include_verify_flags", "ssl_exclude_verify_flags"})
_TLS_PARAMETERS |= _LATER_TLS_OPTIONS & frozenset(inspect.signature(SSLConnection.__init__).parameters)
# TLS switches that redis-py parses from a URL only in its later versions (8.x): allowed where it parses them (an
# unparsed "false" would reach the connection as a true string), and never on a plain connection, which refuses them
_TLS_SWITCHES = frozenset({"ssl_validate_ocsp", "ssl_validate_ocsp_stapled"})
_TLS_PARAMETERS |= _TLS_SWITCHES & frozenset(URL_QUERY_ARGUMENT_PARSERS)
_COMMON = frozenset(URL_QUERY_ARGUMENT_PARSERS) - _TLS_PARAMETERS - _TLS_SWITCHES - {"timeout"} | _TEXT_PARAMETERS
KNOWN_PARAMETERS = {
    "redis": _COMMON,
    "rediss": _COMMON | _TLS_PARAMETERS,
    "unix": _COMMON - {"socket_keepalive"},
}
"""Query parameters a connection of each scheme takes (`max_connections` goes to the pool). redis-py passes any
other name on, and the connection then fails at the first command with an unexpected keyword argument (`timeout`
of a blocking pool, `socket_keepalive` of a unix socket), so these are refused up front."""

_ENCODING_ADVICE = (
    "percent-encode special characters in the user name and password: @ as %40, # as %23, / as %2F, ? as %3F, "
    "% as %25, : in a user name as %3A (Python: urllib.parse.quote(password, safe=''))"
)
_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_PORT = re.compile(r"[0-9]{1,5}")


def _scheme(url: str) -> str:
    scheme, separator, _ = url.partition("://")
    return scheme.lower() if separator else ""


def check_url(url: str) -> None:
    """Refuse a URL redis-py would reject, or would read otherwise than a person does. Returns None if it is fine."""
    scheme = _scheme(url)
    if scheme not in SCHEMES:
        shown = f" (it starts with {scheme + '://'!r})" if re.fullmatch(r"[a-z][a-z0-9+.-]{0,15}", scheme) else ""
        raise RedisUrlError(
            f"a Redis URL must start with redis://, rediss:// (TLS) or unix://, as in redis://localhost:6379/0{shown}"
        )
    rest = url.split("://", 1)[1]
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in rest):
        raise RedisUrlError(f"the Redis URL holds a space or a control character; {_ENCODING_ADVICE}, a space as %20")
    if "#" in rest:
        raise RedisUrlError(
            "the Redis URL holds an unencoded '#', which would cut it short (everything after it is ignored); "
            + _ENCODING_ADVICE
        )
    if _ESCAPE.search(rest):
        raise RedisUrlError(f"the Redis URL holds a '%' that is not followed by two hex digits; {_ENCODING_ADVICE}")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if authority.count("@") > 1:
        raise RedisUrlError(
            "the Redis URL holds more than one '@' before the host, so where the password ends is a guess; "
            + _ENCODING_ADVICE
        )
    if "@" in tail:
        raise RedisUrlError(
            "the Redis URL holds an '@' after a '/' or '?': a '/' or '?' in the password ends the host part early "
            f"and the URL would name another host; {_ENCODING_ADVICE}"
        )
    userinfo, _, host = authority.rpartition("@")
    if "@" in authority and ":" not in userinfo and not re.search(r"[?&]password=", tail):
        raise RedisUrlError(
            "the Redis URL names a user but no password (no ':' before the '@', no ?password=): write a ':' and the "
            "password between the user name and the '@' (nothing before the ':' for a password alone, nothing after "
            "it for a user without one), or give the password as ?password="
        )
    path = tail.split("?", 1)[0]
    if scheme == "unix":
        if host:
            raise RedisUrlError(
                "a unix:// URL names the socket by its path, with no host: unix:///path/to/redis.sock "
                "(three slashes), or unix://user:password@/path/to/redis.sock"
            )
        if not path.strip("/"):
            raise RedisUrlError("the unix:// URL names no socket path; as in unix:///run/redis/redis.sock")
    else:
        _check_host(host)
        if path.strip("/") and not re.fullmatch(r"/[0-9]+/?", path):
            raise RedisUrlError(
                "the path of a Redis URL is the database number, as in redis://host:6379/0; anything else there "
                "is often a password with an unencoded '/': " + _ENCODING_ADVICE
            )
    has_db = scheme != "unix" and bool(path.strip("/"))
    _check_query(scheme, tail.partition("?")[2], has_password=":" in userinfo, has_db=has_db)
    try:
        parse_url(url)
    except ValueError:
        raise RedisUrlError(f"redis-py cannot read the Redis URL; {_ENCODING_ADVICE}") from None


def _check_host(host: str) -> None:
    if host.startswith("["):
        address, bracket, port = host[1:].partition("]")
        if not bracket or not address or (port and not port.startswith(":")):
            raise RedisUrlError("an IPv6 address in a Redis URL is written in brackets, as in redis://[::1]:6379/0")
        port = port[1:]
    else:
        address, _, port = host.partition(":")
        if not address:
            raise RedisUrlError("the Redis URL names no host; as in redis://localhost:6379/0")
    if port and not (_PORT.fullmatch(port) and 0 < int(port) < 65536):
        raise RedisUrlError(
            "the port of the Redis URL is not a number from 1 to 65535; if a ':' in the password made it so, "
            + _ENCODING_ADVICE
        )


def _check_query(scheme: str, query: str, *, has_password: bool, has_db: bool) -> None:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise RedisUrlError(
            "the query of the Redis URL is not name=value pairs joined by '&'; " + _ENCODING_ADVICE
        ) from None
    if "+" in query:
        raise RedisUrlError(
            "the Redis URL's query holds a '+', which means a space there; write a '+' as %2B (and a space as %20)"
        )
    names = [name for name, _ in pairs]
    for name in names:
        if names.count(name) > 1:
            raise RedisUrlError(f"the Redis URL gives {name!r} more than once; give it once")
        if name not in KNOWN_PARAMETERS[scheme]:
            known = ", ".join(sorted(KNOWN_PARAMETERS[scheme]))
            raise RedisUrlError(
                f"the Redis URL's query names {name!r}, which a {scheme}:// connection does not take; known: {known}"
            )
    if has_password and "password" in names:
        raise RedisUrlError("the Redis URL gives a password both before the host and as ?password=; give it once")
    if has_db and "db" in names:
        raise RedisUrlError("the Redis URL gives the database both as its path and as ?db=; give it once")
    for name, value in pairs:
        parser = cast("Callable[[str], object] | None", URL_QUERY_ARGUMENT_PARSERS.get(name))
        if parser is not None and name not in SECRET_PARAMETERS:
            try:
                parser(value)
            except (TypeError, ValueError):
                raise RedisUrlError(f"the Redis URL's {name}={value!r} is not a valid {name}") from None


def safe_url(url: str) -> str:
    """The URL with every secret replaced by `***`: the only form of a Redis URL for a log or a message.

    A URL that `check_url` refuses is not shown beyond its scheme, since where its password ends is unknown.
    """
    scheme = _scheme(url)
    try:
        check_url(url)
    except RedisUrlError:
        return f"{scheme}://***" if scheme in SCHEMES else "***"
    parts = urlsplit(url)
    userinfo = ""
    if "@" in parts.netloc:
        user = parts.netloc.rpartition("@")[0].split(":", 1)[0]
        userinfo = f"{user}:***@"
    host = parts.netloc.rpartition("@")[2]
    query = "&".join(
        f"{quote(name, safe='')}={'***' if name in SECRET_PARAMETERS else quote(value, safe='')}"
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
    )
    return f"{parts.scheme}://{userinfo}{host}{parts.path}" + (f"?{query}" if query else "")


def url_secrets(url: str) -> list[str]:
    """Every secret in the URL, as written and as decoded, longest first: the password, secret query parameters.

    Works on refused URLs too, taking more than it must: a user name alone (no ':') may be a password typed
    without the ':' before it.
    """
    found: set[str] = set()
    rest = url.split("://", 1)[-1]
    authority = re.split(r"[/?]", rest, maxsplit=1)[0]
    for userinfo in {rest.rpartition("@")[0], authority.rpartition("@")[0]}:
        password = userinfo.split(":", 1)[1] if ":" in userinfo else userinfo
        found.update({password, unquote(password)})
    for match in re.finditer(r"(?:^|[?&])([^=&?]+)=([^&]*)", rest.partition("?")[2]):
        if unquote(match.group(1)) in SECRET_PARAMETERS:
            found.update({match.group(2), unquote(match.group(2)), unquote(match.group(2).replace("+", " "))})
    return sorted((secret for secret in found if secret), key=len, reverse=True)
