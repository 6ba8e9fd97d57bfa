"""Model backends behind narrow protocols, the lazy registry that picks them, and model packs
(fetch, verify, convert, cache)."""
