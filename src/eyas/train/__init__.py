"""Training EAGLE-3 drafts. Never imported by the engine."""
