"""``eyas bench``: speculative decoding against the same model without it, on the same prompts."""
