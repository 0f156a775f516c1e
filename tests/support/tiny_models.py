"""Tiny random-weight models of each family, built offline in sentence-transformers' folder
layout, for tests that hold kembed to ``SentenceTransformer(dir).encode``.

Tokenizers: the BERT-shaped, ModernBERT and T5 models use the bundled model's WordPiece
tokenizer (30,522 ids, ``[PAD]`` = 0, which their pad ids agree with); the XLM-RoBERTa and
MPNet models a Unigram tokenizer trained here on STS-B sentences, with RoBERTa's special
ids (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3), so their positions start after
padding index 1 as real ones do; the Qwen3-shaped decoder a byte-level BPE trained here,
which appends its EOS and pads on the left.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "SIZE",
    "bert_dense_st6",
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


def _bert(path: Path, bundled: Path, positions: int = 128) -> None:
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(SEED)
    config = BertConfig(
        vocab_size=30522,
        **SIZE,
        max_position_embeddings=positions,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(path)
    AutoTokenizer.from_pretrained(bundled).save_pretrained(path)


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
    from transformers import AutoTokenizer, T5Config, T5Model

    target = root / "t5"
    torch.manual_seed(SEED + 3)
    config = T5Config(
        vocab_size=30522,
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_heads=2,
        pad_token_id=0,
    )
    T5Model(config).save_pretrained(target)
    AutoTokenizer.from_pretrained(bundled).save_pretrained(target)
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


def unigram_tokenizer_dir(target: Path, sentences: list[str], *, max_length: int | None) -> None:
    """An XLM-R-style tokenizer (Unigram, ``<s> text </s>``) trained on ``sentences``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import UnigramTrainer
    from transformers import XLMRobertaTokenizer

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tokenizer = Tokenizer(models.Unigram())
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


def xlmr_plain(root: Path, sentences: list[str], *, positions: int = 66) -> Path:
    """XLM-RoBERTa as a plain Hugging Face folder (no sentence-transformers files, a
    tokenizer without a length limit): its window is what its positions allow,
    ``positions - pad_token_id - 1`` (64 for 66)."""
    from transformers import XLMRobertaConfig, XLMRobertaModel

    target = root / "xlmr"
    torch.manual_seed(SEED + 5)
    config = XLMRobertaConfig(
        vocab_size=600,
        **SIZE,
        max_position_embeddings=positions,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    XLMRobertaModel(config, add_pooling_layer=False).save_pretrained(target)
    unigram_tokenizer_dir(target, sentences, max_length=None)
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


def _st_folder(target: Path, pooling: str, *, max_seq_length: int, prompts: dict[str, str]) -> None:
    """Version 5's sentence-transformers files around a saved transformer: ``pooling``."""
    _write_json(target / "sentence_bert_config.json", {"max_seq_length": max_seq_length})
    _write_json(
        target / "1_Pooling" / "config.json", {"embedding_dimension": 32, "pooling_mode": pooling}
    )
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
    torch.manual_seed(SEED + 6)
    config = MPNetConfig(
        vocab_size=600,
        **SIZE,
        max_position_embeddings=130,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    MPNetModel(config, add_pooling_layer=False).save_pretrained(target)
    unigram_tokenizer_dir(target, sentences, max_length=None)
    _st_folder(target, "mean", max_seq_length=64, prompts={})
    return target


def modernbert(root: Path, bundled: Path) -> Path:
    """ModernBERT (gte-modernbert's shape: CLS pooling, Normalize; rotary positions, no
    offset), the bundled WordPiece tokenizer."""
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertModel

    target = root / "modernbert"
    torch.manual_seed(SEED + 7)
    config = ModernBertConfig(
        vocab_size=30522,
        **SIZE,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=101,
        eos_token_id=102,
        cls_token_id=101,
        sep_token_id=102,
    )
    ModernBertModel(config).save_pretrained(target)
    AutoTokenizer.from_pretrained(bundled).save_pretrained(target)
    _st_folder(target, "cls", max_seq_length=64, prompts={})
    return target


def qwen3_decoder(root: Path, sentences: list[str]) -> Path:
    """A Qwen3-Embedding-shaped decoder: last-token pooling, an EOS the tokenizer appends,
    left padding in its tokenizer config, an instruction prompt for queries. Tokenizer: a
    byte-level BPE trained here on STS-B sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3Model

    target = root / "qwen3"
    eos = "<|endoftext|>"
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=700,
        special_tokens=[eos],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(sentences, trainer)
    eos_id = tokenizer.token_to_id(eos)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, eos_id)]
    )
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        eos_token=eos,
        pad_token=eos,
        padding_side="left",
        model_max_length=64,
    )
    fast.save_pretrained(target)
    torch.manual_seed(SEED + 8)
    config = Qwen3Config(
        vocab_size=700,
        **SIZE,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        pad_token_id=eos_id,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
    )
    Qwen3Model(config).save_pretrained(target)
    instruction = "Instruct: Given a web search query, retrieve relevant passages\nQuery:"
    write_modules(
        target,
        [
            ("sentence_transformers.models.Transformer", ""),
            ("sentence_transformers.models.Pooling", "1_Pooling"),
            ("sentence_transformers.models.Normalize", "2_Normalize"),
        ],
    )
    _write_json(
        target / "1_Pooling" / "config.json",
        {"embedding_dimension": 32, "pooling_mode": "lasttoken"},
    )
    _write_json(
        target / "config_sentence_transformers.json",
        {"prompts": {"query": instruction, "document": ""}, "default_prompt_name": None},
    )
    return target
