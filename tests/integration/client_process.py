"""One SDK client in its own process, for the cross-process routing test.

Usage: client_process.py BOOTSTRAP NAME OUT.npz. Sends 24 concurrent requests of 4 texts,
each text prefixed with NAME, reading replies on partition 0 (shared with the other
client on purpose), and saves the texts, vectors and dropped-result count.
"""

from __future__ import annotations

import asyncio
import sys

import numpy as np

from producer_sdk import EmbedClient


async def main(bootstrap: str, name: str, out: str) -> None:
    requests = [[f"{name} request {i} text {j}" for j in range(4)] for i in range(24)]
    async with EmbedClient(bootstrap, reply_partition=0, client_id=f"test-{name}") as client:
        results = await asyncio.gather(*(client.embed(texts, timeout=120) for texts in requests))
        # Give the other client's last results time to arrive and be dropped here.
        await asyncio.sleep(2)
        dropped = client.dropped_results
    texts = [text for batch in requests for text in batch]
    np.savez(out, texts=np.array(texts), vectors=np.concatenate(results), dropped=dropped)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
