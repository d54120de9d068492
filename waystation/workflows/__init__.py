"""Deterministic workflow code: the agent loop, its events and their fold. No I/O here."""
