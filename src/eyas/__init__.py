"""eyas: train, serve and verify EAGLE-3 speculative-decoding drafts for Hugging Face causal LMs."""

__version__ = "0.1.0"
