"""Tiny random-weight models of each family, built offline in sentence-transformers' folder
layout, for tests that hold kembed to ``SentenceTransformer(dir).encode``.

Tokenizers: the BERT-shaped, ModernBERT and T5 models use the bundled model's WordPiece
tokenizer (30,522 ids, ``[PAD]`` = 0, which their pad ids agree with); the XLM-RoBERTa and
MPNet models a Unigram tokenizer trained here on STS-B sentences, with RoBERTa's special
ids (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3), so their positions start after
padding index 1 as real ones do; the decoders (Qwen3, Qwen2, Mistral, Llama) a byte-level
BPE trained here, with each family's BOS/EOS and padding side (:data:`DECODERS`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

__all__ = [
    "DECODERS",
    "INSTRUCTION",
    "SIZE",
    "bert_dense_st6",
    "bert_instructor",
    "decoder",
    "bert_st5",
    "family_texts",
    "modernbert",
    "mpnet",
    "qwen3_decoder",
    "t5_encoder",
    "unigram_tokenizer_dir",
    "xlmr_lower_case",
    "xlmr_plain",
    "write_modules",
]

SEED = 1234
_ROBERTA_IDS: dict[str, Any] = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
SIZE: dict[str, Any] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}
"""Every encoder's size here: 2 layers of 32 units."""


def family_texts(sentences: list[str]) -> list[str]:
    """Mixed lengths in one batch (padding matters), several scripts, and texts over every
    window here, with different beginnings and ends (the truncation side matters)."""
    long = " ".join(sentences[:40])
    return [
        "A man is playing a guitar.",
        "一个女孩正在梳头。",
        "Быстрая коричневая лиса.",
        "Kafka keeps an ordered log.",
        sentences[100],
        long,
        " ".join(sentences[200:206]),
        " ".join(reversed(sentences[300:340])),
    ]


def _save(path: Path, seed: int, model: Callable[[], Any], tokenizer: Path | None) -> None:
    """The random-weight model ``model()`` makes (seeded) saved at ``path``, with the
    tokenizer of the folder ``tokenizer`` (None: the caller writes one)."""
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
    model().save_pretrained(path)
    if tokenizer is not None:
        AutoTokenizer.from_pretrained(tokenizer).save_pretrained(path)


def _bert(path: Path, bundled: Path, positions: int = 128) -> None:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=30522, **SIZE, max_position_embeddings=positions)
    _save(path, SEED, lambda: BertModel(config, add_pooling_layer=False), bundled)


def bert_dense_st6(root: Path, bundled: Path, *, truncate_dim: int | None = None) -> Path:
    """BERT, CLS pooling, Dense 32 -> 24 (tanh), Normalize, a ``query`` prompt, length limit
    64: saved by the installed sentence-transformers (version 6's format)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    hf = root / "bert-hf"
    _bert(hf, bundled)
    torch.manual_seed(SEED + 1)
    modules = [
        Transformer(str(hf), max_seq_length=64),
        Pooling(32, pooling_mode="cls"),
        Dense(32, 24, activation_function=torch.nn.Tanh()),
        Normalize(),
    ]
    model = SentenceTransformer(
        modules=modules, prompts={"query": "query: "}, truncate_dim=truncate_dim
    )
    target = root / ("bert-dense-st6" if truncate_dim is None else f"bert-dense-{truncate_dim}")
    model.save(str(target))
    return target


def write_modules(path: Path, modules: list[tuple[str, str]]) -> None:
    """A ``modules.json`` of (type, folder) entries."""
    entries = [
        {"idx": i, "name": str(i), "path": folder, "type": kind}
        for i, (kind, folder) in enumerate(modules)
    ]
    (path / "modules.json").write_text(json.dumps(entries, indent=2))


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def bert_st5(root: Path, bundled: Path, *, mode_flag: str = "pooling_mode_max_tokens") -> Path:
    """BERT in sentence-transformers 5's layout, written by hand: ``pooling_mode_*`` flags,
    ``max_seq_length`` in ``sentence_bert_config.json``, a Dense module (GELU, no bias)
    with ``pytorch_model.bin`` weights, module types under ``sentence_transformers.models``."""
    target = root / "bert-st5"
    _bert(target, bundled)
    _write_json(
        target / "sentence_bert_config.json", {"max_seq_length": 48, "do_lower_case": False}
    )
    flags = {
        key: key == mode_flag
        for key in (
            "pooling_mode_cls_token",
            "pooling_mode_mean_tokens",
            "pooling_mode_max_tokens",
            "pooling_mode_mean_sqrt_len_tokens",
        )
    }
    _write_json(target / "1_Pooling" / "config.json", {"word_embedding_dimension": 32, **flags})
    torch.manual_seed(SEED + 2)
    linear = torch.nn.Linear(32, 20, bias=False)
    (target / "2_Dense").mkdir()
    torch.save({"linear.weight": linear.weight.detach()}, target / "2_Dense" / "pytorch_model.bin")
    _write_json(
        target / "2_Dense" / "config.json",
        {
            "in_features": 32,
            "out_features": 20,
            "bias": False,
            "activation_function": "torch.nn.modules.activation.GELU",
        },
    )
    write_modules(
        target,
        [
            ("sentence_transformers.models.Transformer", ""),
            ("sentence_transformers.models.Pooling", "1_Pooling"),
            ("sentence_transformers.models.Dense", "2_Dense"),
        ],
    )
    _write_json(
        target / "config_sentence_transformers.json",
        {"__version__": {"sentence_transformers": "5.1.0"}, "prompts": {}},
    )
    return target


def t5_encoder(root: Path, bundled: Path) -> Path:
    """A T5 model (encoder and decoder saved, as sentence-t5 / gtr-t5 are), mean pooling,
    Dense 32 -> 16 without bias or activation, Normalize (the sentence-t5 stack)."""
    from transformers import T5Config, T5Model

    target = root / "t5"
    config = T5Config(
        vocab_size=30522, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, pad_token_id=0
    )
    _save(target, SEED + 3, lambda: T5Model(config), bundled)
    _write_json(target / "sentence_bert_config.json", {"max_seq_length": 64})
    _write_json(
        target / "1_Pooling" / "config.json", {"embedding_dimension": 32, "pooling_mode": "mean"}
    )
    torch.manual_seed(SEED + 4)
    linear = torch.nn.Linear(32, 16, bias=False)
    from safetensors.torch import save_file

    (target / "2_Dense").mkdir()
    save_file(
        {"linear.weight": linear.weight.detach().contiguous()},
        target / "2_Dense" / "model.safetensors",
    )
    _write_json(
        target / "2_Dense" / "config.json",
        {
            "in_features": 32,
            "out_features": 16,
            "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity",
        },
    )
    write_modules(
        target,
        [
            ("sentence_transformers.models.Transformer", ""),
            ("sentence_transformers.models.Pooling", "1_Pooling"),
            ("sentence_transformers.models.Dense", "2_Dense"),
            ("sentence_transformers.models.Normalize", "3_Normalize"),
        ],
    )
    return target


def unigram_tokenizer_dir(
    target: Path, sentences: list[str], *, max_length: int | None, as_rebuilt: bool = True
) -> None:
    """An XLM-R-style tokenizer (Unigram, ``<s> text </s>``) trained on ``sentences``.

    ``as_rebuilt``: its tokenizer.json holds the pipeline transformers 5 builds for the
    XLM-R tokenizer class (no normalizer; whitespace split, then Metaspace), so that the
    file and ``AutoTokenizer`` agree. False: NFKC and Metaspace alone, which transformers
    replaces on loading (runs of whitespace then tokenize differently from the file)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import UnigramTrainer
    from transformers import XLMRobertaTokenizer

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tokenizer = Tokenizer(models.Unigram())
    if as_rebuilt:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()]
        )
    else:
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = UnigramTrainer(vocab_size=600, special_tokens=specials, unk_token="<unk>")
    tokenizer.train_from_iterator(sentences, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    options: dict[str, Any] = {} if max_length is None else {"model_max_length": max_length}
    fast = XLMRobertaTokenizer(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        **options,
    )
    fast.save_pretrained(target)


def xlmr_plain(
    root: Path, sentences: list[str], *, positions: int = 66, as_rebuilt: bool = True
) -> Path:
    """XLM-RoBERTa as a plain Hugging Face folder (no sentence-transformers files, a
    tokenizer without a length limit): its window is what its positions allow,
    ``positions - pad_token_id - 1`` (64 for 66)."""
    from transformers import XLMRobertaConfig, XLMRobertaModel

    target = root / "xlmr"
    config = XLMRobertaConfig(
        vocab_size=600, **SIZE, **_ROBERTA_IDS, max_position_embeddings=positions
    )
    _save(target, SEED + 5, lambda: XLMRobertaModel(config, add_pooling_layer=False), None)
    unigram_tokenizer_dir(target, sentences, max_length=None, as_rebuilt=as_rebuilt)
    return target


def xlmr_lower_case(root: Path, sentences: list[str]) -> Path:
    """XLM-RoBERTa (a cased tokenizer) in sentence-transformers 5's layout with
    ``do_lower_case: true``: sentence-transformers lower-cases every input first."""
    target = xlmr_plain(root / "lower", sentences, positions=130)
    _write_json(target / "sentence_bert_config.json", {"max_seq_length": 64, "do_lower_case": True})
    _write_json(
        target / "1_Pooling" / "config.json",
        {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True},
    )
    write_modules(
        target,
        [
            ("sentence_transformers.models.Transformer", ""),
            ("sentence_transformers.models.Pooling", "1_Pooling"),
        ],
    )
    return target


def _st_folder(
    target: Path,
    pooling: str,
    *,
    max_seq_length: int | None,
    prompts: dict[str, str],
    include_prompt: bool = True,
) -> None:
    """Version 5's sentence-transformers files around a saved transformer: ``pooling``
    (``max_seq_length`` None: the tokenizer's ``model_max_length`` is the limit)."""
    if max_seq_length is not None:
        _write_json(target / "sentence_bert_config.json", {"max_seq_length": max_seq_length})
    pooling_config = {"embedding_dimension": 32, "pooling_mode": pooling}
    if not include_prompt:
        pooling_config["include_prompt"] = False
    _write_json(target / "1_Pooling" / "config.json", pooling_config)
    write_modules(
        target,
        [
            ("sentence_transformers.models.Transformer", ""),
            ("sentence_transformers.models.Pooling", "1_Pooling"),
            ("sentence_transformers.models.Normalize", "2_Normalize"),
        ],
    )
    _write_json(target / "config_sentence_transformers.json", {"prompts": prompts})


def mpnet(root: Path, sentences: list[str]) -> Path:
    """MPNet (all-mpnet-base-v2's shape: mean pooling, Normalize), the Unigram tokenizer
    (MPNet numbers positions from its padding index 1, as RoBERTa does)."""
    from transformers import MPNetConfig, MPNetModel

    target = root / "mpnet"
    config = MPNetConfig(vocab_size=600, **SIZE, **_ROBERTA_IDS, max_position_embeddings=130)
    _save(target, SEED + 6, lambda: MPNetModel(config, add_pooling_layer=False), None)
    unigram_tokenizer_dir(target, sentences, max_length=None)
    _st_folder(target, "mean", max_seq_length=64, prompts={})
    return target


def modernbert(root: Path, bundled: Path) -> Path:
    """ModernBERT (gte-modernbert's shape: CLS pooling, Normalize; rotary positions, no
    offset), the bundled WordPiece tokenizer."""
    from transformers import ModernBertConfig, ModernBertModel

    target = root / "modernbert"
    ids: dict[str, Any] = {"pad_token_id": 0, "bos_token_id": 101, "eos_token_id": 102}
    config = ModernBertConfig(
        vocab_size=30522,
        **SIZE,
        **ids,
        max_position_embeddings=128,
        cls_token_id=101,
        sep_token_id=102,
    )
    _save(target, SEED + 7, lambda: ModernBertModel(config), bundled)
    _st_folder(target, "cls", max_seq_length=64, prompts={})
    return target


@dataclass(frozen=True)
class Decoder:
    """How one decoder family's embedders are saved (the shapes their public models have)."""

    config: str
    """transformers' config and model class prefix (``Qwen3`` -> Qwen3Config, Qwen3Model)."""
    template: str
    """The tokenizer.json post-processor: ``bos``, ``eos``, both or none around ``$A``."""
    padding_side: str
    pooling: str
    include_prompt: bool = True
    sizes: dict[str, int] = field(default_factory=dict)


DECODERS = {
    # Qwen3-Embedding: the tokenizer appends <|endoftext|>, left padding, last token.
    "qwen3": Decoder("Qwen3", "$A eos", "left", "lasttoken", sizes={"head_dim": 16}),
    # gte-Qwen2-instruct: the same EOS, right padding, last token.
    "qwen2": Decoder("Qwen2", "$A eos", "right", "lasttoken"),
    # e5-mistral: BOS and EOS around the text, left padding, last token (the EOS).
    "mistral": Decoder("Mistral", "bos $A eos", "left", "lasttoken", sizes={"head_dim": 16}),
    # LLM2Vec-style Llama: BOS, right padding, mean pooling without the instruction.
    "llama": Decoder("Llama", "bos $A", "right", "mean", include_prompt=False),
}
INSTRUCTION = "Instruct: Given a web search query, retrieve relevant passages\nQuery:"


def _bpe_tokenizer(target: Path, sentences: list[str], family: Decoder) -> dict[str, int]:
    """A byte-level BPE trained on ``sentences`` with ``<s>``, ``</s>`` and
    ``<|endoftext|>``, its post-processor ``family.template``; the special ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer
    from transformers import PreTrainedTokenizerFast

    bos, eos = ("<s>", "</s>") if "bos" in family.template else ("<|endoftext|>",) * 2
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=700,
        special_tokens=sorted({bos, eos}),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(sentences, trainer)
    ids = {"bos_token_id": _token_id(tokenizer, bos), "eos_token_id": _token_id(tokenizer, eos)}
    single = family.template.replace("bos", bos).replace("eos", eos)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single,
        pair=f"{single} {single.replace('$A', '$B')}",
        special_tokens=[(bos, ids["bos_token_id"]), (eos, ids["eos_token_id"])],
    )
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=eos,
        pad_token=eos,
        padding_side=family.padding_side,
        model_max_length=64,
    )
    fast.save_pretrained(target)
    return ids


def _token_id(tokenizer: Any, token: str) -> int:
    found = tokenizer.token_to_id(token)
    assert isinstance(found, int), token
    return found


def decoder(root: Path, sentences: list[str], name: str) -> Path:
    """A decoder embedder of family ``name`` (:data:`DECODERS`) with a ``query``
    instruction prompt; its tokenizer a byte-level BPE trained here on STS-B sentences."""
    import transformers
    from transformers import AutoTokenizer

    family = DECODERS[name]
    target = root / name
    ids = _bpe_tokenizer(target, sentences, family)
    config = getattr(transformers, f"{family.config}Config")(
        vocab_size=700,
        **SIZE,
        **ids,
        **family.sizes,
        num_key_value_heads=1,
        max_position_embeddings=256,
        pad_token_id=ids["eos_token_id"],
    )
    model = getattr(transformers, f"{family.config}Model")
    _save(target, SEED + 8 + sorted(DECODERS).index(name), lambda: model(config), None)
    # Saved again as transformers loads it for this model type (Qwen2's class, for one,
    # splits digits apart), so that tokenizer.json is what a published folder holds.
    AutoTokenizer.from_pretrained(target).save_pretrained(target)
    _st_folder(
        target,
        family.pooling,
        max_seq_length=None,
        prompts={"query": INSTRUCTION, "document": ""},
        include_prompt=family.include_prompt,
    )
    return target


def qwen3_decoder(root: Path, sentences: list[str]) -> Path:
    """A Qwen3-Embedding-shaped decoder (:data:`DECODERS`)."""
    return decoder(root, sentences, "qwen3")


def bert_instructor(root: Path, bundled: Path) -> Path:
    """BERT, mean pooling that leaves the prompt's tokens out (``include_prompt: false``,
    as INSTRUCTOR and GRIT are saved), a ``query`` instruction, Normalize."""
    target = root / "bert-instructor"
    _bert(target, bundled)
    _st_folder(
        target,
        "mean",
        max_seq_length=64,
        prompts={"query": "Represent the question for retrieving supporting documents: "},
        include_prompt=False,
    )
    return target


def splade(
    root: Path, bundled: Path, *, strategy: Literal["max", "sum"] = "max", top: int | None = None
) -> Path:
    """A SPLADE-style sparse encoder in sentence-transformers' SparseEncoder layout,
    written by the installed sentence-transformers: BERT with its masked-LM head (the
    bundled WordPiece), SpladePooling ``strategy``, ``query``/``document`` prompts, length
    limit 64, and ``max_active_dims`` ``top``. The head's bias is shifted down (-0.35) so
    that, as in a trained SPLADE model, most terms weigh zero: a few hundred per text."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from transformers import BertConfig, BertForMaskedLM

    hf = root / f"splade-hf-{strategy}"

    def model() -> Any:
        config = BertConfig(vocab_size=30522, **SIZE, max_position_embeddings=128)
        mlm = BertForMaskedLM(config)
        with torch.no_grad():
            mlm.cls.predictions.bias.sub_(0.35)
        return mlm

    _save(hf, SEED + 7, model, bundled)
    encoder = SparseEncoder(
        modules=[
            Transformer(str(hf), transformer_task="fill-mask", max_seq_length=64),
            SpladePooling(strategy),
        ],
        prompts={"query": "query: ", "document": ""},
        max_active_dims=top,
    )
    target = root / f"splade-{strategy}{'' if top is None else f'-top{top}'}"
    encoder.save(str(target))
    return target
