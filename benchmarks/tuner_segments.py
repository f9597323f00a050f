"""Where a self-tuned row's hits went: the tuner's switches, then each candidate pinned, segment by segment.

    python -m benchmarks.tuner_segments --trace T --capacity-tokens C [--block-tokens B] [--limit N]
        [--session-ttl S] [--shadow-rate R] [--shadow-seed N] [--shadow-settings LIST] [--json]

Design note
-----------
The self-tuner (tiers.shadow) moves the live tree between candidate settings on what its miniatures read. Where
a row ends below a candidate pinned from the start, each segment between two switches lost it in one of two ways:

- **choice**: the setting the tuner ran there served those requests worse than another setting pinned from the
  start did (pinned[live] - max(pinned), over the segment's requests);
- **state**: the tree the tuner carried into the segment, built under other settings, served it worse (or better)
  than the same setting pinned from the start (tuned - pinned[live]).

The two add up to the segment's tuned hits minus the best pinned candidate's. Only the choice is something better
miniatures could fix; the state is the price of any switch.

The tuner's own run is replayed first and its switches logged; the same switches are then forced, at the same
requests, on a tree with no tuner: the shadows must never touch the live tree, so that tree's hits must be the
tuner's to the token (ScheduleMismatch otherwise: a bug, not a finding). Device-only tree, as `replay` builds it
(`benchmarks.replay.device_engine`); one replay per candidate, so a row costs (candidates + 2) replays.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

from benchmarks.host_engine import logical_tree_time
from benchmarks.replay import ReplayConfig, arrive, device_engine
from benchmarks.trace import Trace, load_trace
from tiers.clock import ManualClock
from tiers.shadow import Setting, TuningConfig, tuning_at

# (index of the request whose insert changed the live setting, the new setting): that request made room for itself
# under the old setting and is admitted under the new one, so it opens the new setting's stretch
Switch = Tuple[int, Setting]


class ScheduleMismatch(AssertionError):
    """The forced schedule did not reproduce the tuner's hits: something other than steering reached the tree."""


@dataclass(frozen=True)
class Segment:
    start: int  # first request of the segment (trace index)
    end: int  # one past its last
    live: str  # the setting the tuner ran over it
    requested_tokens: int
    tuned_hits: int  # the tuner's hit tokens over the segment
    pinned_hits: Mapping[str, int]  # each candidate's, pinned from the first request, over the same requests

    @property
    def choice(self) -> int:
        return self.pinned_hits[self.live] - max(self.pinned_hits.values())

    @property
    def state(self) -> int:
        return self.tuned_hits - self.pinned_hits[self.live]


@dataclass(frozen=True)
class Breakdown:
    tuned_hit_rate: float
    pinned_hit_rates: Mapping[str, float]
    segments: Tuple[Segment, ...]
    input_tokens: int

    def to_dict(self) -> dict:
        out = asdict(self)
        out["segments"] = [dict(asdict(s), choice=s.choice, state=s.state) for s in self.segments]
        out["choice_total"] = sum(s.choice for s in self.segments) / self.input_tokens
        out["state_total"] = sum(s.state for s in self.segments) / self.input_tokens
        return out


class _Schedule:
    """Stands in for the tuner on the forced run: samples nothing, and switches the live setting at the requests
    given, where the tuner does (inside the insert, after the request is recorded, before its admission)."""

    def __init__(self, switches: Sequence[Switch], now: List[int]):
        self._at, self._now = dict(switches), now

    def offer(self, keys, request, size: int, hit: int, carries_ttl: bool = False) -> Optional[Setting]:
        return self._at.pop(self._now[0], None)

    def stats(self) -> str:
        return "forced schedule"


def serve(trace: Trace, cfg: ReplayConfig, tuning: Optional[TuningConfig] = None, start: Optional[Setting] = None,
          schedule: Sequence[Switch] = ()) -> Tuple[List[int], List[Switch]]:
    """Hit tokens per request, and the live tree's switches: the tuner's (`tuning`), or none but `schedule` after
    the tree starts on `start`."""
    reqs = trace.requests
    clock = ManualClock(reqs[0].time_s if reqs else 0.0)
    switches: List[Switch] = []
    now = [0]
    with logical_tree_time():
        engine = device_engine(trace, cfg, clock, tuning)
        tree = engine.cache
        if start is not None:
            tree._steer(start)
        if schedule:
            tree.tuner = _Schedule(schedule, now)
        steer = tree._steer

        def logged(setting: Setting) -> None:  # every switch, seen where the tree makes it
            switches.append((now[0], setting))
            steer(setting)

        tree._steer = logged
        hits = []
        for i, req in enumerate(reqs):
            now[0] = i
            req = arrive(req, cfg, clock)
            hits.append(req.hit_tokens(engine.access(req).hit_blocks, trace.block_tokens))
    return hits, switches


def breakdown(trace: Trace, cfg: ReplayConfig, tuning: TuningConfig) -> Breakdown:
    """The tuner's run, its schedule forced (checked to reproduce it), each candidate pinned, per segment."""
    tuned, switches = serve(trace, cfg, tuning)
    first = tuning.settings[0]
    forced, applied = serve(trace, cfg, start=first, schedule=switches)
    if forced != tuned or applied != switches:
        raise ScheduleMismatch(f"the forced schedule hit {sum(forced)} tokens in {len(applied)} switches, the tuner "
                               f"{sum(tuned)} in {len(switches)}")
    pinned = {s.name: serve(trace, cfg, start=s)[0] for s in tuning.settings}
    asked = [r.input_length for r in trace.requests]
    cuts = [0] + [i for i, _ in switches] + [len(asked)]
    lives = [first.name] + [s.name for _, s in switches]
    segments = tuple(
        Segment(a, b, live, sum(asked[a:b]), sum(tuned[a:b]), {n: sum(h[a:b]) for n, h in pinned.items()})
        for a, b, live in zip(cuts, cuts[1:], lives) if b > a)
    total = trace.total_input_tokens or 1
    return Breakdown(sum(tuned) / total, {n: sum(h) / total for n, h in pinned.items()}, segments, total)


def _table(b: Breakdown) -> str:
    names = list(b.pinned_hit_rates)
    lines = ["| requests | live | tuned | " + " | ".join(f"{n} pinned" for n in names) + " | choice | state |",
             "|---" * (len(names) + 5) + "|"]
    for s in b.segments:
        rate = (lambda h: h / s.requested_tokens if s.requested_tokens else 0.0)
        lines.append(f"| {s.start}-{s.end} | {s.live} | {rate(s.tuned_hits):.4f} | "
                     + " | ".join(f"{rate(s.pinned_hits[n]):.4f}" for n in names)
                     + f" | {s.choice / b.input_tokens:+.4f} | {s.state / b.input_tokens:+.4f} |")
    d = b.to_dict()
    lines.append(f"\ntuned {b.tuned_hit_rate:.4f}; pinned " + ", ".join(
        f"{n} {r:.4f}" for n, r in b.pinned_hit_rates.items())
        + f"; over the whole trace: choice {d['choice_total']:+.4f}, state {d['state_total']:+.4f}"
        " (segment rates are over the segment's tokens; choice and state over the whole trace's)")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tuner_segments", description=__doc__.split("\n")[0])
    p.add_argument("--trace", required=True, help="JSONL trace: a path or a name under ../shared/traces/")
    p.add_argument("--capacity-tokens", type=float, required=True, help="device capacity in trace tokens")
    p.add_argument("--block-tokens", type=int, default=512, help="tokens per hash_ids block")
    p.add_argument("--limit", type=int, help="only the first N rows")
    p.add_argument("--session-ttl", type=float, help="TTL (s) for session rows without one, as in replay")
    p.add_argument("--shadow-rate", type=float, default=TuningConfig.sample_rate, help="the tuner's least rate")
    p.add_argument("--shadow-seed", type=int, default=0, help="which chains the tuner's sample takes")
    p.add_argument("--shadow-settings", default="", help="the tuner's candidates (default: the server's)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    args = p.parse_args(argv)
    try:
        tuning = tuning_at(args.shadow_rate, args.shadow_seed, settings=args.shadow_settings)
        if tuning is None:
            raise ValueError("--shadow-rate 0 turns the tuner off: there is nothing to break down")
        trace = load_trace(args.trace, block_tokens=args.block_tokens, limit=args.limit)
        cfg = ReplayConfig(policy="tinylfu", capacity_tokens=int(args.capacity_tokens),
                           session_ttl_s=args.session_ttl)
        result = breakdown(trace, cfg, tuning)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=1) if args.json else _table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
