"""IRON's design API: only what the host runtime asks of it (devices)."""
