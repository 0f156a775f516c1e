"""A bulk ingestion job in its own process, as it would be in production.

    python -m loadtest.bulk_client BOOTSTRAP TEXTS PER_REQUEST TOPIC REPLY_TOPIC

Prints ``started`` when it begins publishing, then one JSON line with the run's figures.
Keeping it out of the benchmark's process matters: publishing and decoding tens of
thousands of texts would otherwise stall the event loop that times the interactive calls.
"""

from __future__ import annotations

import asyncio
import json
import sys

from loadtest import e2e
from loadtest.data import stsb_sentences


async def main(bootstrap: str, count: int, per_request: int, topic: str, reply: str) -> None:
    sentences = stsb_sentences()
    texts = [sentences[i % len(sentences)] for i in range(count)]
    print("started", flush=True)
    run = await e2e.bulk(bootstrap, texts, per_request, topic=topic, reply_topic=reply)
    figures = {
        "texts": run.texts,
        "seconds": run.seconds,
        "errors": run.errors,
        "texts_per_s": run.texts_per_s,
        "tokens_per_s": run.tokens_per_s,
    }
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    bootstrap, count, per_request, topic, reply = sys.argv[1:6]
    asyncio.run(main(bootstrap, int(count), int(per_request), topic, reply))
