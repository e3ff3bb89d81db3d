"""Data at patch size K: every document padded to a multiple of K; the report of what the patch stage trains on."""
