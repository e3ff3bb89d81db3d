"""Wiring into ms-swift: the import hook, model registration, argument checks and the upstream patches."""
