"""Target URIs: which database a sink writes to, with the password taken out.

| URI | target |
| --- | --- |
| ``postgresql://user@host:5432/db`` (or ``postgres://``) | PostgreSQL with pgvector |
| ``milvus:///path/to/file.db`` | Milvus Lite: a local file, no server |
| ``http://host:19530``, ``https://host``, ``milvus://host:19530`` | a Milvus server or cluster |

Which scheme names which database is ``sink.registry.STORES``; this module holds the URI
grammars its entries use (:func:`libpq_target`, :func:`server_target`,
:func:`milvus_target`), light functions that import no database client.

A password may come with the URI (``user:password@``, or ``?password=`` for Postgres) or,
better, from ``target_password``; either way it is held as a ``SecretStr`` and
:attr:`TargetSpec.display` (what logs and errors show) never holds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlencode, urlunsplit

from pydantic import SecretStr

__all__ = [
    "TargetParser",
    "TargetSpec",
    "libpq_target",
    "milvus_target",
    "scrub",
    "server_target",
]


@dataclass(frozen=True, slots=True)
class TargetSpec:
    kind: str
    """The database: its key in ``sink.registry.STORES``."""
    uri: str
    """The URI without its password: a libpq URI, a server URI, or a local file's path."""
    user: str | None = None
    password: SecretStr | None = None
    lite: bool = False
    """A local file the store opens in this process (Milvus Lite) rather than a server."""

    @property
    def display(self) -> str:
        """The target for logs and error messages: no password, ever."""
        return self.uri


TargetParser = Callable[[str, SplitResult, "SecretStr | None"], TargetSpec]
"""How one database reads its URIs: ``(kind, the split URI, the target_password setting)``
to the target, or ValueError (whose text holds no password)."""


def libpq_target(kind: str, parts: SplitResult, password: SecretStr | None) -> TargetSpec:
    """A libpq URI, normalised to ``postgresql://``; a ``?password=`` leaves the query."""
    netloc, user, in_uri = _split_userinfo(parts.netloc)
    query = parse_qsl(parts.query, keep_blank_values=True)
    for name, value in query:
        if name == "password":
            in_uri = in_uri or value
    query = [(name, value) for name, value in query if name != "password"]
    user_part = f"{_quote_user(user)}@" if user else ""
    uri = urlunsplit(
        ("postgresql", user_part + netloc, parts.path, urlencode(query), parts.fragment)
    )
    return TargetSpec(kind, uri, user, password or _secret(in_uri))


def server_target(kind: str, parts: SplitResult, password: SecretStr | None) -> TargetSpec:
    """A server reached over HTTP: ``https://`` stays HTTPS, any other scheme is HTTP; the
    host is required, credentials leave the URI."""
    netloc, user, in_uri = _split_userinfo(parts.netloc)
    if not netloc:
        raise ValueError(f"target {parts.scheme.lower()}://HOST:PORT needs a host")
    scheme = "https" if parts.scheme.lower() == "https" else "http"
    server = urlunsplit((scheme, netloc, parts.path, "", ""))
    return TargetSpec(kind, server.rstrip("/"), user, password or _secret(in_uri))


def milvus_target(kind: str, parts: SplitResult, password: SecretStr | None) -> TargetSpec:
    """``milvus:///PATH`` (no host): a Milvus Lite file; otherwise a server."""
    if parts.scheme.lower() == "milvus" and not parts.netloc:
        if not parts.path or parts.path == "/":
            raise ValueError("target milvus:///PATH needs the path of a Milvus Lite file")
        return TargetSpec(kind, unquote(parts.path), lite=True)
    return server_target(kind, parts, password)


def scrub(text: str, spec: TargetSpec) -> str:
    """``text`` (say, a database error) with the target's password masked."""
    if spec.password is not None:
        secret = spec.password.get_secret_value()
        if secret:
            text = text.replace(secret, "***")
    return text


def _split_userinfo(netloc: str) -> tuple[str, str | None, str | None]:
    """(hosts, user, password) of a netloc; user and password percent-decoded."""
    if "@" not in netloc:
        return netloc, None, None
    userinfo, _, hosts = netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    return hosts, unquote(user) or None, unquote(password) if colon else None


def _quote_user(user: str) -> str:
    return quote(user, safe="")


def _secret(value: str | None) -> SecretStr | None:
    return SecretStr(value) if value else None
