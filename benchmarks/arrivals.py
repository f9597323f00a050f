"""Arrival times and length samples for generated workloads: Poisson, or taken from the Azure LLM traces.

Azure CSV rows are `TIMESTAMP, ContextTokens, GeneratedTokens`; they carry no prefix structure, so they are
used only for when requests arrive (inter-arrival gaps, optionally scaled) and how long prompts and outputs are.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from typing import List, Tuple

from benchmarks.trace import TRACES_DIR

AZURE_FILES = {"azure-conv": "AzureLLMInferenceTrace_conv.csv", "azure-code": "AzureLLMInferenceTrace_code.csv"}
ARRIVAL_KINDS = ("poisson",) + tuple(AZURE_FILES)


@dataclass(frozen=True)
class AzureTrace:
    times_s: Tuple[float, ...]  # from the first row
    context_tokens: Tuple[int, ...]
    generated_tokens: Tuple[int, ...]


def _seconds(stamp: str) -> float:
    """'2023-11-16 18:15:46.6805900' -> seconds since midnight (the traces span one day; 7 fraction digits)."""
    _, clock = stamp.strip().split(" ")
    h, m, s = clock.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def load_azure(kind: str) -> AzureTrace:
    if kind not in AZURE_FILES:
        raise ValueError(f"unknown Azure trace {kind!r}; choose one of {', '.join(AZURE_FILES)}")
    path = TRACES_DIR / AZURE_FILES[kind]
    times, ctx, gen = [], [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            times.append(_seconds(row["TIMESTAMP"]))
            ctx.append(int(row["ContextTokens"]))
            gen.append(int(row["GeneratedTokens"]))
    if not times:
        raise ValueError(f"{path}: no rows")
    t0 = times[0]
    return AzureTrace(tuple(t - t0 for t in times), tuple(ctx), tuple(gen))


def arrival_times(kind: str, n: int, rng: random.Random, rate: float = 1.0, time_scale: float = 1.0) -> List[float]:
    """`n` non-decreasing start times in seconds. Azure gaps are replayed in order (cycled if n is larger)."""
    if kind == "poisson":
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        t, out = 0.0, []
        for _ in range(n):
            t += rng.expovariate(rate)
            out.append(t)
        return out
    times = load_azure(kind).times_s
    gaps = [b - a for a, b in zip(times, times[1:])] or [1.0]
    t, out = 0.0, []
    for i in range(n):
        out.append(t)
        t += max(0.0, gaps[i % len(gaps)]) * time_scale
    return out


class LengthSampler:
    """Prompt-part and output lengths: drawn from an Azure trace if given, else from a log-normal."""

    def __init__(self, rng: random.Random, azure: str = ""):
        self._rng = rng
        self._azure = load_azure(azure) if azure else None

    def user_tokens(self, cap: int = 4000) -> int:
        if self._azure:
            return max(1, min(cap, self._rng.choice(self._azure.context_tokens)))
        return max(1, min(cap, int(self._rng.lognormvariate(5.5, 1.0))))

    def output_tokens(self, cap: int = 2000) -> int:
        if self._azure:
            return max(1, min(cap, self._rng.choice(self._azure.generated_tokens)))
        return max(1, min(cap, int(self._rng.lognormvariate(5.0, 0.8))))
