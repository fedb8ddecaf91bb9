"""What turns the target's logits into tokens: a request's sampling settings and their rows on the device
(``sampling``), penalties and logit bias (``penalties``), structured output's token masks (``grammar``) and the
log-probabilities a request asks for (``logprobs``). Below the engine, above ``spec`` (whose tree verification
draws from the same distribution)."""
