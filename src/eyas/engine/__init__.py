"""The speculative-decoding engine: drafting, verification, sampling, batching and statistics."""
