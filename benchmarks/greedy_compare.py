"""Two greedy answers to one prompt: equal, apart at a numerical tie, or different.

A cached prefix and a recomputed one are the same numbers only up to rounding: on CPU, bf16 matrix products are
blocked by batch shape (oneDNN), so a prompt answered inside a batch under load and alone on a cache-off
reference can round its logits differently. Where the two best next tokens are that close, greedy decoding
may take either, and from there the answers part. That is noise, not a wrong cache; wrong KV (a corrupt or
misplaced page) moves logits far more than rounding does, and shows as a split where the other answer's token
is not a near-tie on either side.

So each side asks for the top-2 log-probabilities of its output tokens (`request_fields`); at the first
position where the answers differ, the split is a tie when both sides rank both tokens in their top 2 within
`TIE_NATS` of each other. Anything else, including an answer without log-probabilities, is a difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

TIE_NATS = 0.05  # bf16 keeps ~3 significant digits; the splits seen in soaks were 0.0039 nats (2^-8, one bf16 step)
TOP = 2


def request_fields() -> dict:
    """What to add to a /generate body so that its answer can be compared."""
    return {"return_logprob": True, "top_logprobs_num": TOP}


@dataclass(frozen=True)
class Comparison:
    verdict: str  # "equal", "tie" or "differs"
    position: int = -1  # first output position where the answers part (-1: they do not)
    gap_nats: Optional[float] = None  # at a tie: the larger of the two sides' gaps between the two tokens

    def describe(self) -> str:
        if self.verdict == "equal":
            return "equal"
        gap = "" if self.gap_nats is None else f", gap {self.gap_nats:.4f} nats"
        return f"{self.verdict} at output position {self.position}{gap}"


def _top(answer: dict, position: int) -> dict:
    """{token id: logprob} of the top entries at one output position; {} where the answer has none."""
    try:
        rows = answer["meta_info"]["output_top_logprobs"][position]
        return {int(r[1]): float(r[0]) for r in rows}
    except (KeyError, IndexError, TypeError, ValueError):
        return {}


def _gap(top: dict, a: int, b: int) -> Optional[float]:
    return abs(top[a] - top[b]) if a in top and b in top else None


def compare(mine: dict, ref: dict, tie_nats: float = TIE_NATS) -> Comparison:
    """`mine` and `ref`: /generate answers (with `output_ids`, and `meta_info.output_top_logprobs` when asked
    with `request_fields()`)."""
    a: Sequence[int] = mine.get("output_ids") or []
    b: Sequence[int] = ref.get("output_ids") or []
    if list(a) == list(b):
        return Comparison("equal")
    j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if j >= min(len(a), len(b)):  # one answer is a prefix of the other: a stop, not a tie
        return Comparison("differs", j)
    gaps = [_gap(_top(mine, j), a[j], b[j]), _gap(_top(ref, j), a[j], b[j])]
    if any(g is None for g in gaps):
        return Comparison("differs", j)
    gap = max(gaps)
    return Comparison("tie" if gap <= tie_nats else "differs", j, round(gap, 6))
