"""The reuse gate: events resolve by traffic, classes learn, declined suffixes carry their returns."""

import pytest
from hypothesis import given, settings, strategies as st

from tiers.policies._gate import ReuseGate
from tiers.policy import Candidate, create_policy

CAP = 100


def _gate(**kw):
    return ReuseGate(CAP, **kw)


def test_a_record_within_the_horizon_counts_a_reuse_for_the_class():
    g = _gate(horizon=2.0)
    g.opened("k", depth=1, size=4)
    cls = g.class_of(1, 4)
    before = g.reuse_probability(cls)
    g.observe(0, 150)  # 150 units of misses: inside 2 x 100
    g.record("k")
    assert g.hits[cls] == 1 and g.events[cls] == 1
    assert g.reuse_probability(cls) > before


def test_an_event_expires_as_not_reused_after_horizon_traffic_and_not_before():
    g = _gate(horizon=2.0)
    g.opened("k", depth=1, size=4)
    cls = g.class_of(1, 4)
    g.observe(0, 200)  # exactly the horizon: still open
    assert len(g) == 1 and g.events.get(cls, 0) == 0
    g.observe(10, 11)  # one more unit of misses (hits are not traffic)
    assert len(g) == 0 and g.events[cls] == 1 and g.hits.get(cls, 0) == 0
    g.record("k")  # too late: changes nothing
    assert g.hits.get(cls, 0) == 0


def test_a_class_that_never_comes_back_is_declined_and_one_that_does_is_admitted():
    g = _gate(threshold=0.3, horizon=1.0)
    assert g.passes("first cold", depth=1, size=1)  # the prior lets an unknown class in
    for i in range(20):
        g.opened(("cold", i), depth=1, size=1)
        g.opened(("warm", i), depth=1, size=64)
        g.observe(0, 10)
        g.record(("warm", i))
        g.observe(0, CAP + 1)  # the cold one expires unrecorded
    assert not g.passes("new cold", depth=1, size=1)
    assert g.passes("new warm", depth=1, size=64)


def test_a_declined_suffix_that_comes_back_is_classed_one_deeper_each_time():
    g = _gate(threshold=0.3, horizon=10.0)
    # first turns (depth 1) never continue; the classes one and two deeper always do
    for i in range(30):
        g.opened(("first", i), 1, 8)
        g.observe(0, 1100)
    for d in (2, 3):
        for i in range(10):
            g.opened(("deep", d, i), d, 8)
            g.record(("deep", d, i))
    assert not g.passes("conv", 1, 8)  # declined: its event is open under depth 1
    g.record("conv")  # the conversation's next turn arrives under the same key
    assert g.passes("conv", 1, 8)  # classed as depth 2 now
    g.opened("conv", 1, 8)
    assert g._open["conv"][0] == g.class_of(2, 8)


def test_withdraw_drops_the_event_without_counting_it():
    g = _gate()
    g.opened("front", 1, 4)
    g.withdraw("front")
    g.observe(0, 10 * CAP)
    assert not g.events and not g.hits and len(g) == 0


@pytest.mark.parametrize(
    "kw", [{"threshold": -0.1}, {"threshold": 1.5}, {"horizon": 0}, {"max_depth": 0}, {"prior_events": 0}]
)
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError, match="gate"):
        _gate(**kw)


@settings(max_examples=50)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 40), st.booleans()), max_size=300))
def test_open_events_never_outlive_the_horizon(ops):
    """Guards: an event FIFO that grows without bound (it is sized by traffic, not by a count)."""
    g = _gate(horizon=1.0)
    for i, (key, size, rec) in enumerate(ops):
        if rec:
            g.record(key)
        g.opened((key, i), 1, size)
        g.observe(0, size)
        assert all(g.traffic - opened <= g.horizon_units for _, opened, _, _ in g._open.values())
        assert len(g) <= g.horizon_units


def test_without_traffic_the_open_events_are_bounded_in_units_not_in_number():
    """Guards: a tier that never calls observe (a flat lower tier) keeps its FIFO bounded, and by the units
    its events hold, so the bound does not loosen when one unit stands for a token instead of a block."""
    g = _gate(horizon=1.0)  # 100 units
    for i in range(50):
        g.opened(("k", i), 1, 10)
    assert len(g) == 10  # the horizon's units, 10 each; the rest expired unrecorded
    assert g.events[g.class_of(1, 10)] == 40 and not g.hits


@pytest.mark.parametrize("name", ["tinylfu", "reuse-gate"])
def test_policy_declines_a_class_that_never_returns_and_keeps_admitting_one_that_does(name):
    """Through the policy interface: admit() asks the gate before anything else."""
    p = create_policy(name, CAP, horizon=1.0) if name == "reuse-gate" else create_policy(name, CAP, gate_horizon=1.0)
    p.on_insert("root", "root", 1, None)
    for i in range(40):
        cold, warm = ("cold", i), ("warm", i)
        p.record(cold)
        p.observe(0, 1)
        if p.admit(Candidate(cold, 1, "root"), []):  # the tier inserts what is admitted
            p.on_insert(cold, cold, 1, "root")
        p.record(warm)
        p.observe(0, 64)
        if p.admit(Candidate(warm, 64, "root"), []):
            p.on_insert(warm, warm, 64, "root")
        p.record(warm)  # the warm suffix is used again
        p.observe(0, CAP + 1)
    assert not p.admit(Candidate("new cold", 1, "root"), [])
    assert p.admit(Candidate("new warm", 64, "root"), [])
