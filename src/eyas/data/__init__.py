"""Training data for EAGLE-3 drafts: sources, chat rendering with an assistant-only loss mask,
regeneration by the target, and the tokenized, memory-mappable dataset that ``eyas train`` reads."""
