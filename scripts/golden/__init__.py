"""The golden test vectors of wire format v1, by family (written by scripts.make_golden_vectors)."""
