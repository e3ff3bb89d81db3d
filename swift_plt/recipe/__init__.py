"""The two-stage recipe (patch level, then token level) and the export to a plain HF model."""
