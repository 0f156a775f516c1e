"""Unit tests for worker.tokenization (real bundled tokenizer) and worker.encoder.pooling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.unit.worker.tokenizer_cost import peak_growth_mib
from worker.encoder.models import resolve_model_dir
from worker.encoder.pooling import POOLING_MODES, pool, read_pooling_mode
from worker.tokenization import TextTokenizer

CLS, SEP, UNK = 101, 102, 100


@pytest.fixture(scope="module")
def bundled_dir() -> Path:
    return resolve_model_dir("sentence-transformers/all-MiniLM-L6-v2")


@pytest.fixture(scope="module")
def tokenizer(bundled_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_model_dir(bundled_dir, max_length=256)


# ---------------------------------------------------------------------------- tokenization


def test_short_text_is_wrapped_in_cls_and_sep(tokenizer: TextTokenizer) -> None:
    """A short text is not truncated and is framed by [CLS]=101 and [SEP]=102."""
    (out,) = tokenizer.encode(["Hello world, this is a test."])
    assert not out.truncated
    assert out.ids[0] == CLS
    assert out.ids[-1] == SEP
    assert 4 < len(out.ids) < 20
    assert UNK not in out.ids


def test_long_text_is_cut_to_max_length(tokenizer: TextTokenizer) -> None:
    """A 1000-word text becomes exactly max_length ids ending in [SEP], flagged truncated."""
    (out,) = tokenizer.encode([" ".join(["word"] * 1000)])
    assert out.truncated
    assert len(out.ids) == 256
    assert out.ids[0] == CLS
    assert out.ids[-1] == SEP


def test_left_truncation_keeps_the_end_and_the_special_tokens(bundled_dir: Path) -> None:
    """Cut on the left, a long text keeps its last tokens, still framed by [CLS] and [SEP];
    the direction is the tokenizer's default or chosen per call."""
    text = "first " * 300 + "one two three"
    left = TextTokenizer.from_model_dir(bundled_dir, max_length=16, direction="left")
    right = TextTokenizer.from_model_dir(bundled_dir, max_length=16)
    (kept_end,) = left.encode([text])
    (kept_start,) = right.encode([text])
    (asked_left,) = right.encode([text], "left")
    (tail,) = right.encode(["one two three"])
    assert kept_end.truncated
    assert kept_start.truncated
    assert kept_end.ids == asked_left.ids
    assert kept_end.ids[0] == CLS
    assert kept_end.ids[-1] == SEP
    assert len(kept_end.ids) == 16
    assert kept_end.ids[-4:-1] == tail.ids[1:-1]  # "one two three" survives on the left cut
    assert kept_start.ids[1:4] != tail.ids[1:-1]


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_huge_text_gives_the_ids_of_the_whole_text(bundled_dir: Path, side: str) -> None:
    """Texts far over what the model can use (cut before tokenizing) come out as the whole
    text truncated: the same ids at either end, flagged truncated; so do texts of long words,
    which the cut leaves too few tokens, and texts with no whitespace to cut at."""
    from tokenizers import Tokenizer

    whole = Tokenizer.from_file(str(bundled_dir / "tokenizer.json"))
    whole.enable_truncation(max_length=32, direction=side)
    whole.no_padding()
    tokenizer = TextTokenizer.from_model_dir(bundled_dir, max_length=32, direction=side)
    texts = [
        "the first words, then many more. " * 400 + "and the last words",
        ("x" * 99 + " ") * 300 + "end of it",  # a token per 100 characters
        "a,b." * 2000,  # no whitespace
        "\u6771\u4eac\u90fd" * 3000,  # no whitespace either, a token per character
        "\u6771\u4eac\u90fd " * 3000,
        "word " * 100,  # under the cut: as it is
    ]
    for text, piece in zip(texts, tokenizer.encode(texts), strict=True):
        expected = whole.encode(text)
        assert piece.ids == expected.ids
        assert piece.truncated == bool(expected.overflowing)
        assert piece.truncated


def test_a_huge_text_costs_what_the_window_can_use() -> None:
    """Eight texts of a million characters each, for a 256-token model: the tokenizer's
    peak memory stays a few MiB (tokenizing them whole took hundreds)."""
    assert peak_growth_mib("texts", chars=1_000_000, n=8) < 32


def test_an_unknown_truncation_direction_is_refused(bundled_dir: Path) -> None:
    with pytest.raises(ValueError, match="truncation direction"):
        TextTokenizer.from_model_dir(bundled_dir, max_length=16, direction="middle")


def test_text_of_exactly_max_length_is_not_truncated(tokenizer: TextTokenizer) -> None:
    """A text whose ids exactly fill max_length (254 words + 2 specials) is not truncated."""
    (out,) = tokenizer.encode([" ".join(["word"] * 254)])
    assert len(out.ids) == 256
    assert not out.truncated
    (over,) = tokenizer.encode([" ".join(["word"] * 255)])
    assert len(over.ids) == 256
    assert over.truncated


def test_chinese_text_tokenizes(tokenizer: TextTokenizer) -> None:
    """Chinese text yields framed ids with known (non-[UNK]) tokens for common characters."""
    (out,) = tokenizer.encode(["中国人民"])
    assert out.ids[0] == CLS
    assert out.ids[-1] == SEP
    assert len(out.ids) == 6  # one token per character
    assert UNK not in out.ids
    assert not out.truncated


def test_batch_keeps_order_and_is_unpadded(tokenizer: TextTokenizer) -> None:
    """encode() returns one result per text, in order, each without padding."""
    texts = ["a", "a much longer sentence with many more words in it", "b"]
    out = tokenizer.encode(texts)
    assert len(out) == 3
    assert len(out[0].ids) == 3
    assert len(out[1].ids) > len(out[0].ids)
    assert out[0].ids == tokenizer.encode(["a"])[0].ids
    assert all(tokenizer.pad_id not in t.ids for t in out)
    assert tokenizer.pad_id == 0
    assert tokenizer.max_length == 256


@pytest.mark.parametrize("direction", ["right", "left"])
def test_ids_and_truncation_match_the_full_encoding(bundled_dir: Path, direction: str) -> None:
    """The offset-free encoding the worker uses gives the ids and the truncation flag of
    the tokenizer's full encoding, on STS-B sentences and on over-long passages."""
    from tokenizers import Tokenizer

    from loadtest.data import passages, stsb_sentences

    sentences = stsb_sentences()[:300]
    texts = sentences + passages(sentences, words=400)[:5]
    full = Tokenizer.from_file(str(bundled_dir / "tokenizer.json"))
    full.enable_truncation(max_length=128, direction=direction)
    full.no_padding()
    expected = full.encode_batch(texts, add_special_tokens=True)
    got = TextTokenizer.from_model_dir(bundled_dir, 128).encode(texts, direction)
    assert [piece.ids for piece in got] == [enc.ids for enc in expected]
    assert [piece.truncated for piece in got] == [bool(enc.overflowing) for enc in expected]
    assert any(piece.truncated for piece in got)


def test_missing_tokenizer_json_is_reported(tmp_path: Path) -> None:
    """A model dir without tokenizer.json raises FileNotFoundError naming the dir."""
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        TextTokenizer.from_model_dir(tmp_path, max_length=16)


# ---------------------------------------------------------------------------- pooling

# Two sequences of length 3, dim 2; row 0 has 2 real tokens, row 1 has 1. Padded positions
# hold huge values so that any leak into the result is obvious.
HIDDEN = torch.tensor(
    [
        [[1.0, 2.0], [3.0, -4.0], [1000.0, 1000.0]],
        [[-5.0, 6.0], [900.0, -900.0], [800.0, 800.0]],
    ]
)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_mean_pooling_ignores_padding() -> None:
    """mean averages only the unpadded positions of each row."""
    out = pool(HIDDEN, MASK, "mean")
    torch.testing.assert_close(out, torch.tensor([[2.0, -1.0], [-5.0, 6.0]]))


def test_mean_sqrt_len_pooling_divides_by_sqrt_length() -> None:
    """mean_sqrt_len sums unpadded positions and divides by sqrt(length)."""
    out = pool(HIDDEN, MASK, "mean_sqrt_len")
    root2 = 2.0**0.5
    torch.testing.assert_close(out, torch.tensor([[4.0 / root2, -2.0 / root2], [-5.0, 6.0]]))


def test_cls_pooling_takes_position_zero() -> None:
    """cls returns the first position of each row."""
    out = pool(HIDDEN, MASK, "cls")
    torch.testing.assert_close(out, torch.tensor([[1.0, 2.0], [-5.0, 6.0]]))


def test_max_pooling_ignores_padding() -> None:
    """max takes the per-dimension maximum over unpadded positions only."""
    out = pool(HIDDEN, MASK, "max")
    torch.testing.assert_close(out, torch.tensor([[3.0, 2.0], [-5.0, 6.0]]))


def test_lasttoken_pooling_takes_last_unpadded_position() -> None:
    """lasttoken returns the last real (unpadded) position of each row."""
    out = pool(HIDDEN, MASK, "lasttoken")
    torch.testing.assert_close(out, torch.tensor([[3.0, -4.0], [-5.0, 6.0]]))


def test_pooling_without_padding_uses_every_position() -> None:
    """With a full mask, mean and lasttoken use all positions."""
    full = torch.ones(2, 3, dtype=torch.long)
    torch.testing.assert_close(pool(HIDDEN, full, "lasttoken"), HIDDEN[:, 2])
    torch.testing.assert_close(pool(HIDDEN, full, "mean"), HIDDEN.mean(dim=1))


@pytest.mark.parametrize("mode", POOLING_MODES)
def test_pooling_returns_float32_for_half_precision(mode: str) -> None:
    """Every mode returns float32 (batch, dim), even for bfloat16 hidden states."""
    out = pool(HIDDEN.to(torch.bfloat16), MASK, mode)
    assert out.dtype == torch.float32
    assert out.shape == (2, 2)
    assert torch.all(out.abs() < 100)  # no padded value leaked in


def test_unknown_pooling_mode_raises() -> None:
    """An unknown mode raises ValueError listing the known ones."""
    with pytest.raises(ValueError, match="unknown pooling mode"):
        pool(HIDDEN, MASK, "median")


def test_bundled_model_uses_mean_pooling(bundled_dir: Path) -> None:
    """read_pooling_mode reads "mean" from the bundled model's Pooling config."""
    assert read_pooling_mode(bundled_dir) == "mean"


def test_plain_hf_dir_defaults_to_mean(tmp_path: Path) -> None:
    """A model dir without modules.json defaults to mean pooling."""
    assert read_pooling_mode(tmp_path) == "mean"


def _write_pooling_config(model_dir: Path, config: dict[str, bool]) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (model_dir / "modules.json").write_text(json.dumps(modules))
    (model_dir / "1_Pooling").mkdir()
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps(config))


def test_pooling_mode_read_from_config(tmp_path: Path) -> None:
    """The one enabled pooling_mode_* flag in the Pooling config selects the mode."""
    _write_pooling_config(
        tmp_path, {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
    )
    assert read_pooling_mode(tmp_path) == "cls"


def test_ambiguous_pooling_config_raises(tmp_path: Path) -> None:
    """A Pooling config enabling two modes at once is refused."""
    _write_pooling_config(
        tmp_path, {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}
    )
    with pytest.raises(ValueError, match="unsupported pooling"):
        read_pooling_mode(tmp_path)


def test_modules_without_pooling_are_refused(tmp_path: Path) -> None:
    """A modules.json with no Pooling module (token vectors, or modules in an order kembed
    does not run) is refused, never served as mean pooling."""
    transformer = {
        "idx": 0,
        "name": "0",
        "path": "",
        "type": "sentence_transformers.models.Transformer",
    }
    (tmp_path / "modules.json").write_text(json.dumps([transformer]))
    with pytest.raises(ValueError, match="no Pooling module"):
        read_pooling_mode(tmp_path)
    dense = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Dense"}
    (tmp_path / "modules.json").write_text(json.dumps([dense]))
    with pytest.raises(ValueError, match="not supported"):
        read_pooling_mode(tmp_path)
