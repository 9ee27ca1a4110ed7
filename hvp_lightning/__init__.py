"""hvp-lightning."""
