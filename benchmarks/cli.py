"""What the benchmarks' command lines share: comma-separated lists as argparse types, so a bad
item is an argparse error naming the flag, not a traceback after the run has started."""

from __future__ import annotations

import argparse


def comma_list(text: str) -> list[str]:
    """Comma-separated names (cells, routers, targets), blanks dropped."""
    return [p.strip() for p in text.split(",") if p.strip()]


def comma_ints(text: str) -> list[int]:
    """Comma-separated whole numbers (seeds, sizes, worker counts)."""
    try:
        return [int(s) for s in comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers, comma-separated: {text!r}"
        ) from None


def comma_floats(text: str) -> list[float]:
    """Comma-separated numbers."""
    try:
        return [float(s) for s in comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers, comma-separated: {text!r}") from None
