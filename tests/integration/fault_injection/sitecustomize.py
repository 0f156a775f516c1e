"""Makes the worker's real torch encoder fail on any batch holding the marker token.

Python imports this module at the start of the one worker process whose PYTHONPATH holds
this folder (``tests/integration/test_batch_failures.py`` starts it; no other process and no
production code sees it). The real model has no input it fails on: every text tokenizes to
ids it can embed, and an out-of-memory error is produced for real by the other test of that
file. So, to show a batch that fails on one input, this wraps the encoder's forward pass to
raise, as a broken kernel would, when the batch holds ``MARKER_TOKEN_ID``; every other batch
runs the real model, untouched, as does everything else in the worker (Kafka, tokenizer,
batching, publishing).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from tests.integration.fault_injection.marker import MARKER_TOKEN_ID
from worker.encoder import Prepared, torch_backend

_forward_pooled = torch_backend.TorchEncoder._forward_pooled


def _failing_forward_pooled(
    self: torch_backend.TorchEncoder, forward: Any, prepared: Prepared
) -> npt.NDArray[np.float32]:
    if bool((prepared.ids == MARKER_TOKEN_ID).any()):
        raise RuntimeError("injected fault: the marker token reached the model")
    return _forward_pooled(self, forward, prepared)


setattr(torch_backend.TorchEncoder, "_forward_pooled", _failing_forward_pooled)  # noqa: B010
