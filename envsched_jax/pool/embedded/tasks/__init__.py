"""Per-environment metadata and deterministic task builders of the embedded pool."""
