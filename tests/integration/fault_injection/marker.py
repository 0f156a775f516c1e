"""The input that the fault-injected worker fails on (see ``sitecustomize``)."""

MARKER_WORD = "zeppelin"
"""A word no STS-B test sentence holds, one token in all-MiniLM-L6-v2's vocabulary."""
MARKER_TOKEN_ID = 22116
"""Its token id; the test checks that the real tokenizer agrees."""
