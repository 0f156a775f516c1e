"""The models a worker serves: :class:`ServedModel` (a model with its encoder, tokenizer,
names, prompts, topics and kind) and loading one from settings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from schemas import EmbedRequest, Kind, SparseRequest
from schemas.catalog import ModelDescription
from worker.encoder import Encoder
from worker.encoder.models import detect_kind
from worker.model_settings import default_name
from worker.settings import ModelSpec, WorkerSettings
from worker.tokenization import TextTokenizer

__all__ = ["ModelLoader", "ServedModel", "load_model", "load_served_model", "model_kind"]


@dataclass(frozen=True, slots=True)
class ServedModel:
    """A model the worker serves, with what it takes to run requests for it."""

    name: str
    """Served name: requests' ``model`` and results' ``model``."""
    encoder: Encoder
    tokenizer: TextTokenizer
    aliases: frozenset[str] = frozenset()
    """Other names requests may use for it."""
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    requests_topic: str = ""
    bulk_topic: str = ""
    """Its request topics ("": none). Of requests that name no model, it answers those of
    the topics it is the first model of (the first model answers any other topic's)."""
    kind: Kind = Kind.EMBED
    """``embed``: an embedding model (embed requests); ``rerank``: a cross-encoder, whose
    encoder returns one logit per (query, document) pair (rerank requests). What the kind
    does with requests and results is its module's (``worker.kinds``)."""
    activation: str = "sigmoid"
    """A reranker's activation (``worker.kinds.rerank.ACTIVATIONS``), applied to its logits
    unless a request asks for raw scores."""
    max_active_dims: int | None = None
    """A sparse encoder's cap on each text's weights (its folder's ``max_active_dims``),
    when a request gives no ``top_k``; None: all."""

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(topic for topic in (self.requests_topic, self.bulk_topic) if topic)

    @property
    def description(self) -> ModelDescription:
        """The model as clients see it (its catalog card, the model section of ``/info``),
        as its encoder runs now."""
        info = self.encoder.info
        return ModelDescription(
            name=self.name,
            aliases=tuple(sorted(self.aliases)),
            dim=info.dim,
            max_seq_length=info.max_seq_length,
            pooling=info.pooling,
            dtype=info.dtype,
            quantization=info.quantization or "none",
            device=info.device,
            prompts=dict(self.prompts),
            default_prompt_name=self.default_prompt_name or None,
            requests_topic=self.requests_topic,
            bulk_topic=self.bulk_topic or None,
            kind=self.kind,
        )

    def prompt_for(self, request: EmbedRequest | SparseRequest) -> str:
        """The text put before each input: the request's prompt, its named prompt, or the
        model's default prompt."""
        if request.prompt is not None:
            return request.prompt
        name = request.prompt_name or self.default_prompt_name
        return self.prompts[name] if name else ""


def load_model(settings: WorkerSettings) -> tuple[Encoder, TextTokenizer, frozenset[str]]:
    """Load the encoder and tokenizer of a single-model ``settings`` (the encoder class is
    its kind's: :func:`model_kind`), and the names requests may use for the model."""
    from worker.encoder.autotune import initial_candidate
    from worker.encoder.models import aliases_for, resolve_model_dir
    from worker.encoder.torch_backend import TorchEncoder, resolve_compile, resolve_device

    model_dir = resolve_model_dir(settings.model)
    probe = TextTokenizer.from_model_dir(model_dir, 512)
    device = resolve_device(settings.device)
    kind = model_kind(settings, model_dir)
    if kind in (Kind.RERANK, Kind.SPARSE):
        # Nothing tunes a reranker or a sparse encoder (worker.tuning): it serves as
        # configured, auto = fp32 (exact), compiled only when asked for.
        dtype = initial_candidate(settings.dtype, device.type).dtype
        compile = settings.torch_compile == "on" and settings.quantization == "none"
    elif settings.quantization == "none":
        # The safe variant; tune_model measures the others (and compiles) later.
        dtype, compile = initial_candidate(settings.dtype, device.type).dtype, False
    else:  # quantized: nothing to tune (bitsandbytes' kernels do not compile)
        dtype, compile = settings.dtype, resolve_compile(settings.torch_compile, device)
    options: dict[str, Any] = {
        "device": settings.device,
        "dtype": dtype,
        "max_seq_length": settings.max_seq_length,
        "pad_id": probe.pad_id,
        "threads": settings.torch_threads,
        "compile": compile,
        "quantization": settings.quantization,
    }
    encoder: TorchEncoder
    if kind == Kind.RERANK:
        from worker.encoder.cross_encoder import TorchCrossEncoder

        encoder = TorchCrossEncoder(model_dir, settings.served_name(), **options)
    elif kind == Kind.SPARSE:
        from worker.encoder.sparse import TorchSparseEncoder

        encoder = TorchSparseEncoder(model_dir, settings.served_name(), **options)
    else:
        encoder = TorchEncoder(
            model_dir, settings.served_name(), pooling=settings.pooling, **options
        )
    tokenizer = TextTokenizer.from_model_dir(
        model_dir, encoder.info.max_seq_length, settings.truncation_direction
    )
    # The configured value answers too, unless it is a path (never a model name).
    given = {settings.model} if default_name(settings.model) == settings.model else set()
    names = frozenset({settings.served_name(), *given, *aliases_for(settings.model)})
    return encoder, tokenizer, names


def model_kind(settings: WorkerSettings, model_dir: Path) -> Kind:
    """The kind of model a single-model ``settings`` serves from ``model_dir``: its
    ``model_kind``, or (``auto``) what the model's config says
    (:func:`worker.encoder.models.detect_kind`)."""
    detected = detect_kind(model_dir)
    if settings.model_kind == "auto":
        return detected
    if settings.model_kind == Kind.RERANK.value and detected != Kind.RERANK:
        raise ValueError(
            f"{model_dir} is configured as a reranker (kind rerank) but is no sequence "
            "classifier: its config.json names no ...ForSequenceClassification architecture"
        )
    if settings.model_kind == Kind.SPARSE.value and detected != Kind.SPARSE:
        raise ValueError(
            f"{model_dir} is configured as a sparse encoder (kind sparse) but is no "
            "sentence-transformers SparseEncoder folder (MLMTransformer -> SpladePooling)"
        )
    return Kind(settings.model_kind)


def load_served_model(settings: WorkerSettings, spec: ModelSpec) -> ServedModel:
    """Load one of the worker's models, with its names, prompts and request topics."""
    from worker.encoder.models import read_prompts

    encoder, tokenizer, names = load_model(settings.for_model(spec))
    own_prompts, own_default = read_prompts(encoder.info.path)
    prompts = own_prompts if spec.prompts is None else spec.prompts
    default = spec.default_prompt_name or (own_default if spec.prompts is None else None)
    if default is not None and default not in prompts:
        raise ValueError(f"default_prompt_name {default!r} is not one of the model's prompts")
    name = spec.served_name()
    requests_topic, bulk_topic = settings.topics_of(spec)
    kind = model_kind(settings.for_model(spec), encoder.info.path)
    activation = getattr(encoder, "activation", "sigmoid") if kind == Kind.RERANK else "sigmoid"
    max_active_dims = None
    if kind == Kind.SPARSE:
        from worker.encoder.sparse_folder import read_sparse

        max_active_dims = read_sparse(encoder.info.path).max_active_dims
    return ServedModel(
        name=name,
        encoder=encoder,
        tokenizer=tokenizer,
        aliases=(names | set(spec.aliases)) - {name},
        prompts=prompts,
        default_prompt_name=default,
        requests_topic=requests_topic,
        bulk_topic=bulk_topic,
        kind=kind,
        activation=activation,
        max_active_dims=max_active_dims,
    )


ModelLoader: TypeAlias = Callable[[WorkerSettings, ModelSpec], ServedModel]
"""How the worker gets each of its models: :func:`load_served_model`, or, in a benchmark
that measures the worker without its model (``loadtest.ceiling_worker``), a stand-in."""
