"""sentence-transformers folders as sentence-transformers runs them: the module stack (Dense,
Normalize, truncate_dim), both folder formats (5 and 6), T5's encoder, RoBERTa's window,
and a clear refusal for anything kembed does not run. Tiny random-weight models built
here (tests/support/tiny_models.py), each held to ``SentenceTransformer(dir).encode``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.support.tiny_models import (
    DECODERS,
    INSTRUCTION,
    bert_dense_st6,
    bert_instructor,
    bert_st5,
    decoder,
    modernbert,
    mpnet,
    t5_encoder,
    write_modules,
    xlmr_lower_case,
    xlmr_plain,
)
from worker.encoder.folder import UnsupportedModelError, read_folder, usable_positions
from worker.encoder.torch_backend import TorchEncoder
from worker.tokenization import TextTokenizer


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


def _kembed(path: Path, texts: list[str], prompt: str = "") -> np.ndarray:
    """As the worker runs it: the prompt before each text, left out of the pooling where
    the model says so."""
    encoder = TorchEncoder(path, "m")
    tokenizer = TextTokenizer.from_model_dir(path, encoder.info.max_seq_length)
    ids = [t.ids for t in tokenizer.encode([prompt + text for text in texts])]
    skip = None if encoder.info.include_prompt else [tokenizer.prompt_length(prompt)] * len(ids)
    vectors = encoder.run(encoder.prepare(ids, pooled_from=skip))
    assert vectors.shape == (len(texts), encoder.info.dim)
    return vectors


def _reference(path: Path, texts: list[str], prompt_name: str | None = None) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    return np.asarray(model.encode(texts, convert_to_numpy=True, prompt_name=prompt_name))


def _min_cos(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(axis=1).min())


def test_a_sentence_transformers_6_folder_runs_its_dense_and_normalize(
    root: Path, model_dir: Path, family_mix: list[str]
) -> None:
    """Version 6's folder: ``pooling_mode``, the limit in tokenizer_config.json, Dense and
    Normalize modules: the vectors are sentence-transformers' (in direction: the request's
    ``normalize`` is the Normalize module), of the Dense layer's size."""
    path = bert_dense_st6(root, model_dir)
    folder = read_folder(path)
    assert (folder.pooling, len(folder.dense), folder.normalize) == ("cls", 1, True)
    encoder = TorchEncoder(path, "m")
    assert (encoder.info.dim, encoder.info.max_seq_length) == (24, 64)
    ours, theirs = _kembed(path, family_mix), _reference(path, family_mix)
    assert theirs.shape == ours.shape
    assert _min_cos(ours, theirs) >= 0.9999
    assert not np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-3)  # before Normalize
    prompted = _kembed(path, family_mix, prompt="query: ")
    assert _min_cos(prompted, _reference(path, family_mix, prompt_name="query")) >= 0.9999


def test_a_sentence_transformers_5_folder_reads_its_flags_limit_and_bin_weights(
    root: Path, model_dir: Path, family_mix: list[str]
) -> None:
    """Version 5's folder (``pooling_mode_*`` flags, ``max_seq_length`` in
    sentence_bert_config.json, pytorch_model.bin Dense weights, GELU, no bias)."""
    path = bert_st5(root, model_dir)
    encoder = TorchEncoder(path, "m")
    assert (encoder.info.pooling, encoder.info.dim, encoder.info.max_seq_length) == ("max", 20, 48)
    assert _min_cos(_kembed(path, family_mix), _reference(path, family_mix)) >= 0.9999


def test_truncate_dim_cuts_the_vectors_as_sentence_transformers_does(
    root: Path, model_dir: Path, family_mix: list[str]
) -> None:
    path = bert_dense_st6(root, model_dir, truncate_dim=8)
    assert read_folder(path).truncate_dim == 8
    ours, theirs = _kembed(path, family_mix), _reference(path, family_mix)
    assert ours.shape == theirs.shape == (len(family_mix), 8)
    assert _min_cos(ours, theirs) >= 0.9999


def test_a_t5_model_runs_its_encoder_alone(
    root: Path, model_dir: Path, family_mix: list[str]
) -> None:
    """A T5 folder (encoder and decoder weights) runs as its encoder, mean-pooled, through
    a bias-free Dense and Normalize: sentence-t5's stack."""
    path = t5_encoder(root, model_dir)
    encoder = TorchEncoder(path, "m")
    assert (encoder.info.dim, encoder.info.max_seq_length) == (16, 64)
    assert _min_cos(_kembed(path, family_mix), _reference(path, family_mix)) >= 0.9999


def test_xlm_roberta_without_sentence_transformers_files_uses_its_usable_window(
    root: Path, family_sentences: list[str], family_mix: list[str]
) -> None:
    """RoBERTa numbers positions from pad_token_id + 1: 66 positions hold 64 tokens. An
    over-long text is cut there and runs (taking 66 indexed past the table); the vectors
    equal sentence-transformers' at that window."""
    from sentence_transformers import SentenceTransformer

    path = xlmr_plain(root, family_sentences, positions=66)
    encoder = TorchEncoder(path, "m")
    assert (encoder.info.pooling, encoder.info.max_seq_length) == ("mean", 64)
    reference = SentenceTransformer(str(path), device="cpu")
    reference.max_seq_length = 64
    theirs = np.asarray(reference.encode(family_mix, convert_to_numpy=True))
    assert _min_cos(_kembed(path, family_mix), theirs) >= 0.9999


def test_do_lower_case_lower_cases_before_the_tokenizer(
    root: Path, family_sentences: list[str], family_mix: list[str]
) -> None:
    """``do_lower_case`` in sentence_bert_config.json, with a cased tokenizer: the inputs
    are lower-cased first, as sentence-transformers does (else "Kafka" and "kafka" differ)."""
    path = xlmr_lower_case(root, family_sentences)
    tokenizer = TextTokenizer.from_model_dir(path, 64)
    upper, lower = tokenizer.encode(["KAFKA Keeps Logs", "kafka keeps logs"])
    assert upper.ids == lower.ids
    assert _min_cos(_kembed(path, family_mix), _reference(path, family_mix)) >= 0.9999


@pytest.mark.parametrize(
    ("config", "usable"),
    [
        ({"model_type": "xlm-roberta", "max_position_embeddings": 514, "pad_token_id": 1}, 512),
        ({"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1}, 512),
        ({"model_type": "mpnet", "max_position_embeddings": 514, "pad_token_id": 1}, 512),
        ({"model_type": "bert", "max_position_embeddings": 512, "pad_token_id": 0}, 512),
        ({"model_type": "modernbert", "max_position_embeddings": 8192}, 8192),
        ({"model_type": "t5"}, None),
    ],
)
def test_usable_positions_per_family(config: dict[str, object], usable: int | None) -> None:
    assert usable_positions(config) == usable


def _folder_with(tmp_path: Path, model_dir: Path, modules: list[tuple[str, str]]) -> Path:
    path = tmp_path / "model"
    shutil.copytree(model_dir, path)
    write_modules(path, modules)
    return path


TRANSFORMER = ("sentence_transformers.models.Transformer", "")
POOLING = ("sentence_transformers.models.Pooling", "1_Pooling")


@pytest.mark.parametrize(
    ("modules", "message"),
    [
        ([TRANSFORMER, POOLING, ("sentence_transformers.models.LayerNorm", "2")], "LayerNorm"),
        ([TRANSFORMER, ("pylate.models.Dense.Dense", "1_Dense")], "ColBERT-style"),
        ([TRANSFORMER], "no Pooling module"),
        ([TRANSFORMER, ("sentence_transformers.models.Dense", "2"), POOLING], "order"),
        ([("sentence_transformers.models.StaticEmbedding", "0")], "StaticEmbedding"),
    ],
)
def test_a_module_kembed_does_not_run_is_refused_by_name(
    tmp_path: Path, model_dir: Path, modules: list[tuple[str, str]], message: str
) -> None:
    path = _folder_with(tmp_path, model_dir, modules)
    with pytest.raises(UnsupportedModelError, match=message) as caught:
        TorchEncoder(path, "m")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"config_sentence_transformers.json": {"model_type": "SparseEncoder"}}, "sparse"),
        ({"config_sentence_transformers.json": {"model_type": "MultiVectorEncoder"}}, "multi"),
        ({"config.json": {"architectures": ["HF_ColBERT"]}}, "ColBERT-style"),
        ({"1_Pooling/config.json": {"pooling_mode": "weightedmean"}}, "weightedmean"),
        ({"1_Pooling/config.json": {"pooling_mode": ["cls", "mean"]}}, "unsupported pooling"),
        ({"config_sentence_transformers.json": {"truncate_dim": 0}}, "truncate_dim"),
        ({"1_Pooling/config.json": {"include_prompt": "no"}}, "include_prompt must be"),
    ],
)
def test_a_model_type_or_setting_kembed_does_not_serve_is_refused(
    tmp_path: Path, model_dir: Path, change: dict[str, dict[str, object]], message: str
) -> None:
    path = tmp_path / "model"
    shutil.copytree(model_dir, path)
    for name, values in change.items():
        file = path / name
        config = json.loads(file.read_text()) if file.is_file() else {}
        file.write_text(json.dumps({**config, **values}))
    with pytest.raises(UnsupportedModelError, match=message):
        read_folder(path)


def test_the_bundled_model_reads_as_before(model_dir: Path) -> None:
    folder = read_folder(model_dir)
    assert (folder.pooling, folder.dense, folder.normalize, folder.max_seq_length) == (
        "mean",
        (),
        True,
        256,
    )


@pytest.mark.parametrize("family", ["mpnet", "modernbert"])
def test_mpnet_and_modernbert_equal_sentence_transformers(
    family: str, root: Path, model_dir: Path, family_sentences: list[str], family_mix: list[str]
) -> None:
    """MPNet (positions after its padding index) and ModernBERT (CLS)."""
    path = modernbert(root, model_dir) if family == "modernbert" else mpnet(root, family_sentences)
    assert TorchEncoder(path, "m").info.max_seq_length == 64
    assert _min_cos(_kembed(path, family_mix), _reference(path, family_mix)) >= 0.9999


@pytest.mark.parametrize("family", sorted(DECODERS))
def test_decoder_embedders_equal_sentence_transformers(
    family: str, root: Path, family_sentences: list[str], family_mix: list[str]
) -> None:
    """Qwen3, Qwen2, Mistral and Llama-shaped decoders (tests/support/tiny_models.py:
    last-token or mean pooling, the BOS/EOS their tokenizers add, left or right padding in
    sentence-transformers and right padding in kembed: rotary positions make them agree),
    with and without the instruction prompt (left out of a Llama's mean pooling)."""
    path = decoder(root / "decoders", family_sentences, family)
    shape = DECODERS[family]
    encoder = TorchEncoder(path, "m")
    info = encoder.info
    assert (info.max_seq_length, info.pooling) == (64, shape.pooling)
    assert info.include_prompt is shape.include_prompt
    assert _min_cos(_kembed(path, family_mix), _reference(path, family_mix)) >= 0.9999
    ours = _kembed(path, family_mix, prompt=INSTRUCTION)
    assert _min_cos(ours, _reference(path, family_mix, prompt_name="query")) >= 0.9999


def test_a_pooling_without_the_prompt_leaves_its_tokens_out(
    root: Path, model_dir: Path, family_mix: list[str]
) -> None:
    """``include_prompt: false`` (INSTRUCTOR's shape): the prompt's tokens as
    sentence-transformers counts them ([CLS] and the prompt's) are masked out of the mean;
    pooling them too would drift from the reference."""
    path = bert_instructor(root, model_dir)
    query = json.loads((path / "config_sentence_transformers.json").read_text())["prompts"]
    prompt = query["query"]
    tokenizer = TextTokenizer.from_model_dir(path, 64)
    assert tokenizer.prompt_length(prompt) == len(tokenizer.encode([prompt])[0].ids) - 1
    theirs = _reference(path, family_mix, prompt_name="query")
    assert _min_cos(_kembed(path, family_mix, prompt=prompt), theirs) >= 0.9999
    encoder = TorchEncoder(path, "m")
    ids = [t.ids for t in tokenizer.encode([prompt + text for text in family_mix])]
    assert _min_cos(encoder.encode(ids), theirs) < 0.999  # the prompt pooled: not the same
    assert _min_cos(_kembed(path, family_mix), _reference(path, family_mix)) >= 0.9999
