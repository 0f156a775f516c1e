"""KEMBED_MODELS and the single-model settings: model specs, names, topics, prompts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from kembed_cli.commands.status import _request_topics
from schemas import EmbedRequest
from schemas.catalog import ModelDescription
from worker.encoder import ModelInfo
from worker.encoder.models import read_prompts, resolve_model_dir
from worker.model_settings import default_name
from worker.served import ServedModel
from worker.settings import ModelSpec, WorkerSettings

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def settings_of(**values: Any) -> WorkerSettings:
    """Settings as the env vars or flags give them (structured values as JSON text)."""
    return WorkerSettings.model_validate(values)


def test_single_model_settings_describe_one_spec() -> None:
    settings = settings_of(model_name="minilm", pooling="cls", truncation_direction="left")
    (spec,) = settings.model_specs()
    assert spec.served_name() == "minilm"
    assert (spec.pooling, spec.truncation_direction) == ("cls", "left")
    assert settings.topics_of(spec) == ("embed.requests", "embed.requests.bulk")


def test_models_from_json_text_and_per_model_settings() -> None:
    """KEMBED_MODELS (JSON text, as from a flag) gives one spec per model; per-model keys
    win over the worker-wide ones, unset keys take them."""
    models = [
        {"model": MINILM, "name": "fp32"},
        {"model": MINILM, "name": "int8", "quantization": "int8", "requests_topic": "e.q8"},
    ]
    settings = settings_of(models=json.dumps(models), dtype="bfloat16")
    fp32, int8 = settings.model_specs()
    assert settings.for_model(fp32).dtype == "bfloat16"
    assert settings.for_model(int8).quantization == "int8"
    assert settings.for_model(int8).served_name() == "int8"
    assert settings.for_model(int8).models == ()
    assert settings.topics_of(fp32) == ("embed.requests", "embed.requests.bulk")
    assert settings.topics_of(int8) == ("e.q8", "e.q8.bulk")
    no_bulk = ModelSpec.model_validate({"model": MINILM, "requests_topic": "e.x", "bulk_topic": ""})
    assert settings.topics_of(no_bulk) == ("e.x", "")


def test_a_name_used_by_two_models_is_refused() -> None:
    models = [
        {"model": MINILM, "name": "a", "aliases": ["shared"]},
        {"model": MINILM, "name": "b", "aliases": ["shared"]},
    ]
    with pytest.raises(ValidationError, match="used by two models"):
        settings_of(models=json.dumps(models))


def test_a_default_prompt_must_be_one_of_the_prompts() -> None:
    with pytest.raises(ValidationError, match="not one of its prompts"):
        settings_of(prompts='{"query": "query: "}', default_prompt_name="passage")


def test_unknown_model_keys_are_refused() -> None:
    with pytest.raises(ValidationError):
        settings_of(models=json.dumps([{"model": MINILM, "pooling_mode": "cls"}]))


def test_prompt_precedence() -> None:
    """The request's prompt text, else its named prompt, else the model's default."""
    model = ServedModel(
        name="m",
        encoder=None,  # type: ignore[arg-type]  # prompts need no encoder
        tokenizer=None,  # type: ignore[arg-type]
        prompts={"query": "query: ", "passage": "passage: "},
        default_prompt_name="passage",
    )
    plain = ServedModel(name="p", encoder=None, tokenizer=None)  # type: ignore[arg-type]
    request = EmbedRequest(id="r", inputs=("x",))
    assert model.prompt_for(request) == "passage: "
    assert model.prompt_for(EmbedRequest(id="r", inputs=("x",), prompt_name="query")) == "query: "
    assert model.prompt_for(EmbedRequest(id="r", inputs=("x",), prompt="Q: ")) == "Q: "
    assert plain.prompt_for(request) == ""


def test_a_served_model_describes_itself_as_its_encoder_runs() -> None:
    """What the catalog card and /info say of a model: no bulk topic and no default prompt
    are absent (not empty), aliases sorted, precision as the encoder runs now."""
    info = ModelInfo(name="m", path=Path("m"), dim=8, max_seq_length=16, pooling="cls",
                     dtype="float32", device="cpu")  # fmt: skip
    encoder = SimpleNamespace(info=info)
    model = ServedModel(
        name="m",
        encoder=encoder,  # only its info is read
        tokenizer=None,  # type: ignore[arg-type]
        aliases=frozenset({"z", "a"}),
        prompts={"query": "q: "},
        default_prompt_name="",
        requests_topic="embed.requests",
        bulk_topic="",
    )
    described = model.description
    assert described == ModelDescription(
        name="m", aliases=("a", "z"), dim=8, max_seq_length=16, pooling="cls",
        dtype="float32", quantization="none", device="cpu", prompts={"query": "q: "},
        default_prompt_name=None, requests_topic="embed.requests", bulk_topic=None,
    )  # fmt: skip
    encoder.info = replace(info, dtype="float16")  # the tuner switched precision
    assert model.description.dtype == "float16"


def test_prompts_come_from_the_sentence_transformers_config(tmp_path: Path) -> None:
    """The bundled model declares no prompts; a model that does is read as it says."""
    assert read_prompts(resolve_model_dir(MINILM)) == ({}, None)
    model_dir = tmp_path
    config = {"prompts": {"query": "query: ", "document": ""}, "default_prompt_name": "query"}
    (model_dir / "config_sentence_transformers.json").write_text(json.dumps(config))
    assert read_prompts(model_dir) == ({"query": "query: ", "document": ""}, "query")
    config["default_prompt_name"] = "summary"
    (model_dir / "config_sentence_transformers.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not one of its prompts"):
        read_prompts(model_dir)


def test_request_topics_of_all_models_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker subscribes to every model's topics, each once; `kembed status` defaults
    to the same list, read from the environment."""
    models = [
        {"model": MINILM, "name": "a"},
        {"model": MINILM, "name": "b"},
        {"model": MINILM, "name": "c", "requests_topic": "e.c", "bulk_topic": ""},
    ]
    settings = settings_of(models=json.dumps(models))
    assert settings.request_topics() == (["embed.requests", "e.c"], ["embed.requests.bulk"])
    monkeypatch.setenv("KEMBED_MODELS", json.dumps(models))
    assert _request_topics() == ["embed.requests", "e.c", "embed.requests.bulk"]
    monkeypatch.setenv("KEMBED_MODELS", "not json")
    assert _request_topics() == ["embed.requests", "embed.requests.bulk"]


def test_a_model_directory_is_served_under_its_own_name_never_its_path() -> None:
    """With no name given, a local directory is served as its last part (so no catalog
    entry, /v1/models id or result's model is a filesystem path); a model id as itself."""
    assert default_name("/models/e5-small-v2") == "e5-small-v2"
    assert default_name("./models/e5-small-v2/") == "e5-small-v2"
    assert default_name("~/models/bge") == "bge"
    assert default_name("BAAI/bge-small-en-v1.5") == "BAAI/bge-small-en-v1.5"
    assert ModelSpec.model_validate({"model": "/models/e5-small-v2"}).served_name() == "e5-small-v2"
    assert (
        ModelSpec.model_validate({"model": "/models/e5-small-v2", "name": "e5"}).served_name()
        == "e5"
    )
    assert WorkerSettings.model_validate({"model": "/srv/reranker"}).served_name() == "reranker"
