"""W-TinyLFU structure: window/main regions, hill climbing of the window, LRU at a full window."""

import pytest
from hypothesis import given, settings, strategies as st

from tests.tiers.test_policies import Tree
from tiers.clock import ManualClock
from tiers.policies._climber import HillClimber
from tiers.policies.wtinylfu import PROBATION, PROTECTED, WINDOW
from tiers.policy import Candidate, create_policy


# --- hill climbing ---
def _climb(climber, rate_of, periods):
    for _ in range(periods):
        r = rate_of(climber.frac)
        climber.observe(int(r * 1000), 1000)  # one request of a whole period at the rate this window gives
    return climber.frac


@pytest.mark.parametrize("start", [0.05, 0.95])
def test_climber_moves_toward_the_better_window(start):
    """Guards: a climber that walks away from the hit rate's peak (sign error, no reversal)."""
    peak = 0.6
    c = HillClimber(start, period=1000)
    frac = _climb(c, lambda f: 0.5 - abs(f - peak) * 0.1, 200)
    assert abs(frac - peak) < abs(start - peak)
    assert abs(frac - peak) <= 0.1


def test_climber_reverses_when_the_rate_drops_and_stays_in_bounds():
    """Guards: a climber that keeps going after a drop, or leaves [min, max]."""
    c = HillClimber(0.5, period=10, step=0.1)
    c.observe(5, 10)  # first sample: moves by one step in the initial direction
    assert c.frac == pytest.approx(0.6)
    c.observe(3, 10)  # worse: reverse
    assert c.frac == pytest.approx(0.5, abs=0.01)
    for _ in range(100):
        c.observe(10, 10)
        assert 0.0 <= c.frac <= 1.0


def test_climber_waits_for_a_full_period():
    c = HillClimber(0.5, period=100)
    assert not c.observe(10, 99)
    assert c.frac == 0.5
    assert c.observe(0, 1)


# --- the policy's regions ---
def _serve(p, t, key_of, req, size=1, cap=None):
    """One flat-tier request: a hit touches the entry, a miss makes room (if admitted) and inserts."""
    cap = cap or p.capacity
    e = key_of.get(req)
    p.record(req)
    if e is not None:
        p.on_access(e)
        p.observe(size, size)
        return True
    p.observe(0, size)
    need = sum(t.size.values()) + size - cap
    if need > 0:
        vs = p.victims(need)
        if not p.admit(Candidate(req, size), vs):
            return False
        for v in t.evict(need):
            key_of.pop(next(k for k, x in key_of.items() if x == v))
    key_of[req] = t.add(size=size)
    t.p.index.nodes[key_of[req]].key = req
    return False


def _run(p, requests):
    t = Tree(p)
    key_of = {}
    return sum(_serve(p, t, key_of, r) for r in requests)


# keys are tuples of ints: their hash (what the sketch counts) does not change between processes

def _recency_workload(n):
    # each key is asked twice, 8 keys apart, then never again: only recency can hit it
    out = []
    for i in range(n):
        out.append((0, i))
        if i >= 8:
            out.append((0, i - 8))
    return out


def _frequency_workload(n):
    # a hot set asked over and over among a scan of one-shot keys: only frequency can hit it
    out = []
    for i in range(n):
        out.append((1, i % 12))
        out.append((2, i))
        out.append((3, i))
    return out


def _adaptive(window, step):
    # sketch counts decide the window -> main contest here (no class prior, no bypass), as in Caffeine;
    # a fixed seed makes the sketch's hashing and jitter repeatable
    return create_policy(
        "wtinylfu", 20, clock=ManualClock(), window=window, period_factor=2.0, step=step, freq="sketch",
        bypass=False, seed=1,
    )


def test_window_grows_on_a_recency_workload():
    """Guards: the climber must move the window in the direction that raises the hit rate; here a
    window of ~90% or more keeps the second ask of each key (a smaller one sends it into main's contest,
    which a count-1 newcomer loses)."""
    p = _adaptive(0.7, 0.1)
    hits = _run(p, _recency_workload(3000))
    assert p.window_frac > 0.7  # it started at 0.7
    assert hits > _run(_adaptive(0.7, 0.0), _recency_workload(3000))  # a climber that never moves


def test_window_shrinks_on_a_frequency_workload():
    """Guards: the same climber must shrink the window when main's frequency filter is what hits."""
    p = _adaptive(0.9, 0.1)
    hits = _run(p, _frequency_workload(3000))
    assert p.window_frac < 0.9  # it started at 0.9
    assert hits > _run(_adaptive(0.9, 0.0), _frequency_workload(3000))


def test_small_window_beats_full_window_on_frequency_workload():
    """Guards: a main region whose admission filter lets the scan flush the hot set."""
    reqs = _frequency_workload(1500)
    small = _run(_adaptive(0.1, 0.0), reqs)  # step 0: the window stays where it is
    full = _run(_adaptive(1.0, 0.0), reqs)
    assert small > full


def test_new_entries_enter_the_window_and_uses_promote_in_main():
    p = create_policy("wtinylfu", 4, clock=ManualClock(), window=0.25, adapt=False)
    t = Tree(p)
    es = [t.add() for _ in range(4)]
    assert all(p.index.nodes[e].region == WINDOW for e in es)
    t.evict(1)  # the cache is full: window overflow moves into main first, then one entry goes
    regions = [p.index.nodes[e].region for e in es if e in t.size]
    assert regions.count(WINDOW) <= 1 and PROBATION in regions
    e = next(e for e in es if e in t.size and p.index.nodes[e].region == PROBATION)
    p.on_access(e)
    assert p.index.nodes[e].region == PROTECTED
    assert p.units[WINDOW] + p.units[PROBATION] + p.units[PROTECTED] == sum(t.size.values())


# --- a full window is LRU ---
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10**6)), max_size=80))
def test_full_window_gives_lru_victims(ops):
    """Guards: the policy's floor. At a 100% window it must choose exactly what LRU chooses, locks,
    splits and revived parents included, and admit everything."""
    a = Tree(create_policy("wtinylfu", 30, clock=ManualClock(), window=1.0, adapt=False))
    b = Tree(create_policy("lru", 30, clock=ManualClock()))
    for op, r in ops:
        live = sorted(a.size)
        if op == 0 or not live:
            parent = live[r % len(live)] if live and r % 3 else None
            for t in (a, b):
                t.add(parent, size=1 + r % 4)
        elif op == 1:
            for t in (a, b):
                t.p.on_access(live[r % len(live)])
        elif op == 2:
            e = live[r % len(live)]
            if a.size[e] >= 2:
                for t in (a, b):
                    t.split(e)
        else:
            closed = set()
            for e in live[: r % 3]:
                while e is not None:
                    closed.add(e)
                    e = a.parent[e]
            n = 1 + r % 9
            assert a.p.admit(Candidate(("new", r), 1), a.p.victims(n))
            assert a.evict(n, protected=lambda e: e in closed) == b.evict(n, protected=lambda e: e in closed)


@pytest.mark.parametrize("window", [0.0, 0.3, 1.0])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_moving_window_keeps_victims_leaf_only_and_unlocked(window, data):
    """Guards: region moves during a query (window winners, inner nodes) or a window that the climber
    moves every few requests must never offer a locked entry, an ancestor of one, or an inner node
    (Tree.evict asserts both), and the regions' units must add up to what is cached."""
    p = create_policy("wtinylfu", 12, clock=ManualClock(), window=window, period_factor=0.25, step=0.3)
    t = Tree(p)
    ops = data.draw(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 10**6)), max_size=80))
    for op, r in ops:
        live = sorted(t.size)
        if op == 0 or not live:
            parent = live[r % len(live)] if live and r % 3 else None
            t.add(parent, size=1 + r % 3)
        elif op == 1:
            p.on_access(live[r % len(live)])
            p.observe(r % 2, 1)
        elif op == 2:
            e = live[r % len(live)]
            if t.size[e] >= 2:
                t.split(e)
        elif op == 3:
            p.observe(r % 5, 4)
        else:
            closed = set()
            for e in live[: r % 3]:
                while e is not None:
                    closed.add(e)
                    e = t.parent[e]
            for v in t.evict(1 + r % 7, protected=lambda e: e in closed):
                assert v not in closed
        assert sum(p.units) == sum(t.size.values())
        assert 0.0 <= p.window_frac <= 1.0
