"""Console wording shared by every command: counts with the noun in the right number."""

from __future__ import annotations


def count_of(n: int, noun: str, plural: str | None = None) -> str:
    """ "1 episode", "0 episodes", "2,048 env steps": ``n`` with thousands separators and ``noun`` in
    the singular for exactly 1, else ``plural`` (default: ``noun`` + "s")."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
