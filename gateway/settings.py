"""Gateway settings: every field is an env var ``KEMBED_GATEWAY_<NAME>`` and a
``kembed gateway`` flag (docs/gateway.md, "Settings").

Where Kafka is and how to log in are the shared
:class:`~kembed_shared.settings.KafkaClientSettings` (``KEMBED_BOOTSTRAP_SERVERS``, TLS,
SASL), as for every kembed command. This module imports pydantic only, so that
``kembed gateway --help`` works without the ``gateway`` extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kembed_shared import service_fields as fields
from kembed_shared.settings import none_if_blank
from schemas import DEFAULT_MAX_INPUT_CHARS

__all__ = ["GatewaySettings"]


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KEMBED_GATEWAY_", extra="ignore", frozen=True)

    host: str = Field("0.0.0.0", description="Address to listen on.")
    port: int = Field(8080, ge=0, le=65535, description="Port to listen on.")
    api_keys: SecretStr | None = Field(
        None,
        description="Comma-separated API keys, or the absolute path of a file of keys (one "
        "per line, as api_keys_file reads it: a mounted secret). A single value that starts "
        "with / is always a path: a file that cannot be read is a settings error, never a "
        "key. When set (or "
        "api_keys_file), every endpoint but /health, /ready and /metrics needs "
        "'Authorization: Bearer <key>'. Prefer the env var or a file to the flag; keys are "
        "never logged.",
    )
    api_keys_file: str | None = Field(
        None,
        description="A file with one API key per line (a mounted secret); joined with "
        "api_keys. Blank lines and lines starting with # are skipped.",
    )
    timeout_s: float = Field(
        30.0,
        gt=0,
        description="Per-request timeout; it becomes the Kafka request's deadline_ms, so a "
        "worker drops work whose caller has gone.",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A connection must send a request's complete headers within this many "
        "seconds of opening, and of the answer to its previous request; else it is answered "
        "408 and closed (a client that sends part of its headers holds no connection).",
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A request's whole body must arrive within this many seconds of its "
        "headers; else it is answered 408 request_timeout in the API's error shape and the "
        "connection is closed.",
    )
    max_body_bytes: int = Field(
        4 * 1024 * 1024, gt=0, description="Largest request body; larger is 413."
    )
    max_inputs: int = Field(
        2048,
        gt=0,
        description="Most inputs (texts to embed, documents to rerank) in one request; more "
        "is 400 (too_many_inputs).",
    )
    max_input_chars: int = Field(
        DEFAULT_MAX_INPUT_CHARS,
        gt=0,
        description="Most characters in one text (an input, a query, a document); longer "
        "is input_too_long (OpenAI's shape: 400; TEI's: 422). The gateway's client sends "
        "with the same limit; keep it at or below the workers' KEMBED_MAX_INPUT_CHARS.",
    )
    max_in_flight: int = Field(
        256,
        gt=0,
        description="Requests waiting for a result at once; beyond it a request is answered "
        "429 with Retry-After at once, not queued.",
    )
    model: str | None = Field(
        None,
        description="The model POST /embed (TEI, which names no model) asks for; unset: the "
        "workers' default.",
    )
    rerank_model: str | None = Field(
        None,
        description="The reranker POST /rerank (TEI, which names no model) and POST /v1/rerank "
        "without a model ask for; unset: the one live model of kind rerank in the catalog.",
    )
    sparse_model: str | None = Field(
        None,
        description="The sparse encoder POST /embed_sparse (TEI, which names no model) asks "
        "for; unset: the one live model of kind sparse in the catalog.",
    )
    requests_topic: str = Field(
        "embed.requests",
        description="Interactive request topic (when the catalog names no topic for a model).",
    )
    reply_topic: str = Field(
        "embed.results", description="Topic the gateway reads its results from."
    )
    catalog_topic: str = Field("embed.models", description="The model catalog topic.")
    log_level: fields.LogLevel = fields.log_level()
    log_format: fields.LogFormat = fields.log_format()

    _keys: tuple[str, ...] = PrivateAttr(default=())

    _blank = field_validator(
        "api_keys", "api_keys_file", "model", "rerank_model", "sparse_model", mode="before"
    )(none_if_blank)

    @model_validator(mode="after")
    def _read_keys(self) -> Self:
        keys: list[str] = []
        if self.api_keys is not None:
            value = self.api_keys.get_secret_value().strip()
            if _names_a_file(value):
                keys += _keys_in_file(value, "api_keys", echo=False)
            else:
                keys += [key.strip() for key in value.split(",")]
        if self.api_keys_file is not None:
            keys += _keys_in_file(self.api_keys_file, "api_keys_file")
        self._keys = tuple(dict.fromkeys(key for key in keys if key))
        if self.api_keys is not None and not self._keys:
            raise ValueError("api_keys holds no key (comma-separated keys expected)")
        return self

    def keys(self) -> tuple[str, ...]:
        """Every API key (from api_keys and api_keys_file); empty when auth is off."""
        return self._keys


def _names_a_file(value: str) -> bool:
    """Whether an ``api_keys`` value is the path of a key file rather than keys: one value
    (no comma) that starts with ``/``, whether or not the file exists. A file that is
    missing or unreadable is a settings error, never a key: a secret that failed to mount
    must not become the one valid key. (A key that starts with ``/`` goes in a key file, or
    in a comma-separated list.)"""
    return value.startswith("/") and "," not in value


def _keys_in_file(path: str, setting: str, *, echo: bool = True) -> list[str]:
    """The keys of a key file: one per line; blank lines and ``#`` comments skipped.
    ``echo``: the error may name the path (not for ``api_keys``, whose value might be a
    key that starts with ``/``); never the file's content."""
    where = f"{setting} {path!r}" if echo else f"{setting} (a path: it starts with '/')"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: the key file cannot be read ({type(exc).__name__})") from None
    lines = [line.strip() for line in text.splitlines()]
    keys = [line for line in lines if line and not line.startswith("#")]
    if not keys:
        raise ValueError(f"{where} holds no key")
    return keys
