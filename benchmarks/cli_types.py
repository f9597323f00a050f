"""argparse value types shared by the subcommands (errors name the flag and exit 2, as argparse does)."""

from __future__ import annotations

import argparse
import json
import math


def capacity(text: str) -> int:
    """Token counts accept 1e6-style notation."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"must be a non-negative whole number of tokens: {text!r}")
    return int(value)


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def positive_int(text: str) -> int:
    value = _integer(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def shadow_settings(text: str) -> str:
    """The self-tuner's candidates, as the server's --tier-shadow-settings takes them (tiers.shadow.parse_settings;
    empty: the defaults)."""
    from tiers.shadow import parse_settings

    try:
        if text:
            parse_settings(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def seed(text: str) -> int:
    value = _integer(text)
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be a whole number in [0, 2**32): {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0: {text!r}")
    return value


def float_in(low: float, high: float, unit: str, include_low: bool = False):
    """A type for numbers in (low, high] of `unit` ([low, high] with `include_low`; NaN is outside every range)."""
    opening = "[" if include_low else "("

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (low <= value <= high if include_low else low < value <= high):
            raise argparse.ArgumentTypeError(f"must be in {opening}{low:g}, {high:g}] {unit}".rstrip() + f", got {text}")
        return value

    return parse


gigabytes = float_in(0, 64, "GB")  # a peer pool's size
share = float_in(0, 1, "", include_low=True)  # a fraction where 0 turns the thing off


def json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value
