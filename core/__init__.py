"""The leaf package that models/ and pipeline/ both import: the error tree, the injected clock and
the model worker threads (with the CPU gate). It imports neither."""
