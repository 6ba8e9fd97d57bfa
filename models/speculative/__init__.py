"""Speculative decoding for the embedded LLM.

A cheap proposer drafts K tokens; the target model scores all of them in one forward pass; a
modified rejection-sampling rule keeps the output distribution exactly the target's.

Glossary
- draft: the K tokens a proposer suggests after the current sequence, with the distributions q it
  drew them from (a point mass for deterministic proposers such as n-gram lookup).
- accepted: a drafted token the target keeps: with probability min(1, p(x)/q(x)), left to right,
  stopping at the first rejection. At temperature 0: kept iff it is the target's argmax.
- recovered: the token sampled, at the first rejection, from the normalized max(0, p - q) (at
  temperature 0: the target's argmax), which replaces the rejected one.
- bonus token: when all K are accepted, one more token sampled from the target's distribution
  after the last drafted one, which the same forward pass already computed.
- acceptance rate: accepted / drafted tokens. Mean acceptance length: 1 + accepted / drafts, the
  tokens a target forward pass yields on average.

Modules: proposer (the protocol), ngram and draft_model (proposers), verifier (rejection sampling),
controller (choosing K from measured costs), memory (the guard before loading a pair), decoder
(the step that ties them together, and the strategy the embedded backend plugs in).
"""
