"""Verifiable tasks the embedded default trains on."""
