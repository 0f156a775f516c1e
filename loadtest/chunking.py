"""What cutting documents into chunks costs the worker's CPU, against the tokenization every
input gets anyway, measured in one process and one run.

Documents of about 1,000 and 20,000 words are built from STS-B sentences. The baseline is
the worker's own tokenization of the same characters (``TextTokenizer.encode``, the fast
path without offsets, on texts of at most the model's window, as a caller who cut the
documents himself would send them); the measured step is ``worker.chunking.expand`` (the
whole text tokenized with offsets, the windows planned and every chunk text checked), which
runs before that tokenization for chunked requests. Single-threaded, as in the worker
(``TOKENIZERS_PARALLELISM=false``); CPU time of this process.

    python -m loadtest.chunking
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import time  # the variable above is set before tokenizers loads
from collections.abc import Callable
from functools import partial

from loadtest.data import stsb_sentences
from schemas import Chunking, EmbedRequest
from worker.chunking import Chunker, expand
from worker.encoder.models import resolve_model_dir
from worker.tokenization import TextTokenizer

MAX_SEQ = 256


def documents(words: int, count: int) -> list[str]:
    """``count`` documents of about ``words`` words each, of consecutive STS-B sentences."""
    sentences = stsb_sentences("en")
    out: list[str] = []
    current: list[str] = []
    size = i = 0
    while len(out) < count:
        sentence = sentences[i % len(sentences)]
        current.append(sentence)
        size += len(sentence.split())
        i += 1
        if size >= words:
            out.append(" ".join(current))
            current, size = [], 0
    return out


def cpu_ms(work: Callable[[], object], repeat: int) -> float:
    start = time.process_time()
    for _ in range(repeat):
        work()
    return (time.process_time() - start) * 1000 / repeat


def main() -> None:
    model_dir = resolve_model_dir("sentence-transformers/all-MiniLM-L6-v2")
    tokenizer = TextTokenizer.from_model_dir(model_dir, MAX_SEQ)
    chunker = Chunker(tokenizer.tokenizer, MAX_SEQ)
    print("| documents | chunking | chunks | tokenize chunk texts (ms) | cut (ms) | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for words, count in ((1000, 20), (20000, 1)):
        docs = documents(words, count)
        for chunking in (Chunking(256, 32), Chunking(128, 16)):
            request = EmbedRequest(id="b", inputs=tuple(docs), chunking=chunking)
            expanded = expand(request, chunker, "", 1 << 20)
            texts = list(expanded.inputs)
            repeat = 5
            baseline = cpu_ms(partial(tokenizer.encode, texts), repeat)
            cut = cpu_ms(partial(expand, request, chunker, "", 1 << 20), repeat)
            print(
                f"| {count} x {words} words | {chunking.max_tokens}/{chunking.overlap_tokens} "
                f"| {len(texts)} | {baseline:.1f} | {cut:.1f} | {cut / baseline:.2f} |"
            )


if __name__ == "__main__":
    main()
