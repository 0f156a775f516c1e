"""Target URIs: which database a sink writes to, with the password taken out.

| URI | target |
| --- | --- |
| ``postgresql://user@host:5432/db`` (or ``postgres://``) | PostgreSQL with pgvector |
| ``milvus:///path/to/file.db`` | Milvus Lite: a local file, no server |
| ``http://host:19530``, ``https://host``, ``milvus://host:19530`` | a Milvus server or cluster |

A password may come with the URI (``user:password@``, or ``?password=`` for Postgres) or,
better, from ``target_password``; either way it is held as a ``SecretStr`` and
:attr:`TargetSpec.display` (what logs and errors show) never holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from pydantic import SecretStr

__all__ = ["TargetSpec", "parse_target", "scrub"]

Kind = Literal["postgres", "milvus"]


@dataclass(frozen=True, slots=True)
class TargetSpec:
    kind: Kind
    uri: str
    """The URI without its password: a libpq URI, a Milvus server URI, or a Lite file path."""
    user: str | None = None
    password: SecretStr | None = None

    @property
    def lite(self) -> bool:
        """A Milvus Lite file rather than a server."""
        return self.kind == "milvus" and not self.uri.startswith(("http://", "https://"))

    @property
    def display(self) -> str:
        """The target for logs and error messages: no password, ever."""
        return self.uri


def parse_target(target: str, password: SecretStr | None = None) -> TargetSpec:
    """The target a URI names; ValueError (whose text holds no password) when unusable.
    ``password`` (the ``target_password`` setting) wins over one in the URI."""
    parts = urlsplit(target.strip())
    scheme = parts.scheme.lower()
    netloc, user, in_uri = _split_userinfo(parts.netloc)
    if scheme in ("postgres", "postgresql"):
        query = parse_qsl(parts.query, keep_blank_values=True)
        for name, value in query:
            if name == "password":
                in_uri = in_uri or value
        query = [(name, value) for name, value in query if name != "password"]
        user_part = f"{_quote_user(user)}@" if user else ""
        uri = urlunsplit(
            ("postgresql", user_part + netloc, parts.path, urlencode(query), parts.fragment)
        )
        return TargetSpec("postgres", uri, user, password or _secret(in_uri))
    if scheme == "milvus" and not netloc:
        if not parts.path or parts.path == "/":
            raise ValueError("target milvus:///PATH needs the path of a Milvus Lite file")
        return TargetSpec("milvus", unquote(parts.path))
    if scheme in ("http", "https", "milvus"):
        if not netloc:
            raise ValueError(f"target {scheme}://HOST:PORT needs a host")
        server = urlunsplit(("https" if scheme == "https" else "http", netloc, parts.path, "", ""))
        return TargetSpec("milvus", server.rstrip("/"), user, password or _secret(in_uri))
    if not scheme and target.strip().endswith(".db"):
        return TargetSpec("milvus", target.strip())
    shown = f"{scheme}://..." if scheme else "a URI without a scheme"
    raise ValueError(
        f"target {shown} is not supported: use postgresql://, milvus:///file.db, "
        "http(s)://host:19530 or milvus://host:19530"
    )


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
