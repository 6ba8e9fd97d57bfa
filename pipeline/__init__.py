"""The voice pipeline: typed events flowing through async-generator stages (see pipeline/session/)."""
