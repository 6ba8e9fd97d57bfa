"""One module per schema revision, applied in order of their down_revision chain."""
