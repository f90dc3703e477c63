"""lightning_hetero."""
