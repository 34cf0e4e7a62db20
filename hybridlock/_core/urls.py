"""Sentinel URLs: which sentinels to ask, for which service, and how to log in. Pure: parsing only.

redis-py reads ``redis://``, ``rediss://`` and ``unix://`` URLs itself but has no URL for a Sentinel-managed master,
so hybridlock reads this form (the one the ``redis-sentinel-url`` package and several frameworks use)::

    redis+sentinel://[[username]:password@]host[:port][,host[:port]...]/service_name[/db][?option=value&...]
    rediss+sentinel://...        the same over TLS (to the sentinels and to the master)

* every ``host:port`` is a sentinel (port 26379 when left out; IPv6 addresses in brackets, ``[::1]:26379``);
* ``service_name`` is the name the sentinels monitor (``sentinel monitor <service_name> ...``);
* ``db`` is the database number, in the path or as ``?db=N`` (not both; 0 by default);
* the user name and password are the master's (``AUTH``); options ``sentinel_username`` and
  ``sentinel_password`` are the sentinels' own, when they ask for one.

Any other option is refused, so a misspelt one does not go unnoticed. Passwords are never shown in messages
(``clients.redacted_url``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote

from ..errors import InvalidArgumentError

__all__ = ["DEFAULT_SENTINEL_PORT", "SENTINEL_SCHEMES", "SentinelURL", "is_sentinel_url", "parse_sentinel_url"]

DEFAULT_SENTINEL_PORT = 26379
#: scheme -> whether it means TLS.
SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
_OPTIONS = ("db", "sentinel_username", "sentinel_password")


@dataclass(frozen=True)
class SentinelURL:
    """What a sentinel URL says. ``repr`` hides the passwords."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    tls: bool = False

    def __repr__(self) -> str:
        hidden = {"password": self.password, "sentinel_password": self.sentinel_password}
        shown = ", ".join(
            f"{name}={'***' if hidden.get(name) else getattr(self, name)!r}"
            for name in ("sentinels", "service", "db", "username", "password", "sentinel_username",
                         "sentinel_password", "tls")
        )  # fmt: skip
        return f"SentinelURL({shown})"


def is_sentinel_url(url: str) -> bool:
    scheme, sep, _ = url.partition("://")
    return bool(sep) and scheme.lower() in SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelURL:
    """Read a ``redis+sentinel://`` URL (see the module's docstring); ``InvalidArgumentError`` saying what is wrong.
    The message never quotes the URL (it may hold a password): the caller adds a redacted copy."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SENTINEL_SCHEMES:
        raise InvalidArgumentError(f"a sentinel URL starts with {' or '.join(f'{s}://' for s in SENTINEL_SCHEMES)}")
    rest, _, _fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    userinfo, at, hosts_and_path = rest.rpartition("@")
    if not at:
        userinfo, hosts_and_path = "", rest
    hosts, slash, path = hosts_and_path.partition("/")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = (unquote(secret) if colon else unquote(user)) or None
        if not colon:
            username = None  # one field alone is a password, as redis-py reads redis://secret@host
    sentinels = tuple(_host_port(part) for part in hosts.split(",") if part.strip())
    if not sentinels:
        raise InvalidArgumentError("a sentinel URL needs at least one sentinel host")
    parts = [unquote(p) for p in path.split("/")] if slash else []
    if not parts or not parts[0]:
        raise InvalidArgumentError("a sentinel URL needs the service name as its path: .../service_name[/db]")
    if len(parts) > 2 or (len(parts) == 2 and not parts[1]):
        raise InvalidArgumentError("a sentinel URL's path is /service_name or /service_name/db")
    service = parts[0]
    db_text = parts[1] if len(parts) == 2 else None
    options: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in _OPTIONS:
            raise InvalidArgumentError(f"unknown sentinel URL option {name!r} (known: {', '.join(_OPTIONS)})")
        if name in options:
            raise InvalidArgumentError(f"sentinel URL option {name!r} given twice")
        options[name] = value
    if "db" in options:
        if db_text is not None:
            raise InvalidArgumentError("a sentinel URL gives db in its path or as ?db=, not both")
        db_text = options["db"]
    db = 0
    if db_text is not None:
        if not db_text.isdigit():
            raise InvalidArgumentError(f"a sentinel URL's db must be a non-negative integer, not {db_text!r}")
        db = int(db_text)
    return SentinelURL(
        sentinels=sentinels,
        service=service,
        db=db,
        username=username,
        password=password,
        sentinel_username=options.get("sentinel_username") or None,
        sentinel_password=options.get("sentinel_password") or None,
        tls=SENTINEL_SCHEMES[scheme.lower()],
    )


def _host_port(text: str) -> tuple[str, int]:
    text = text.strip()
    if text.startswith("["):  # [IPv6]:port
        host, bracket, after = text[1:].partition("]")
        if not bracket or not host:
            raise InvalidArgumentError(f"bad sentinel address {text!r}")
        port_text = after[1:] if after.startswith(":") else after
        if after and not after.startswith(":"):
            raise InvalidArgumentError(f"bad sentinel address {text!r}")
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise InvalidArgumentError(f"bad sentinel address {text!r}: no host")
    if not port_text:
        return host, DEFAULT_SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidArgumentError(f"bad sentinel port {port_text!r} in {text!r}")
    return host, int(port_text)
