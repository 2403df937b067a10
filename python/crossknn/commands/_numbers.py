"""argparse types of the commands: numbers in a range, refused with what was expected and what
came."""

from __future__ import annotations

import argparse

__all__ = [
    "calibration_items",
    "fraction",
    "nonneg_float",
    "nonneg_int",
    "open_fraction",
    "positive_float",
    "positive_int",
]


def _number(text: str, kind, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None
    if kind is float and value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = _number(text, int, "an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1; got {text!r}")
    return value


def nonneg_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = _number(text, int, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0; got {text!r}")
    return value


def fraction(text: str) -> float:
    """argparse type: a number in [0, 1]."""
    value = _number(text, float, "a number in [0, 1]")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1]; got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    value = _number(text, float, "a number > 0")
    if not value > 0.0:
        raise argparse.ArgumentTypeError(f"expected a number > 0; got {text!r}")
    return value


def nonneg_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    value = _number(text, float, "a number >= 0")
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0; got {text!r}")
    return value


def open_fraction(text: str) -> float:
    """argparse type: a number in (0, 1)."""
    value = fraction(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1); got {text!r}")
    return value


def calibration_items(text: str) -> int:
    """argparse type: an integer >= 2 (items per calibration query)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"expected an integer >= 2; got {text!r}")
    return value
