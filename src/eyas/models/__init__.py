"""Models: the target runtime (HF model + aux-state capture) and the EAGLE-3 draft."""
