"""benchmarks.tuner_segments: the tuner's switches forced on a tree without it, beside each candidate pinned."""

import pytest

from benchmarks.replay import ReplayConfig, replay
from benchmarks.trace import parse_rows
from benchmarks.tuner_segments import ScheduleMismatch, breakdown, main
from benchmarks.workloads import KIND_DEFAULTS, GenConfig, generate_rows
from sglang_ext.tiered_cache import TieredRadixCache
from tiers.shadow import TuningConfig

CAPACITY = 50_000


@pytest.fixture(scope="module")
def tenant_chat():
    """Tenant chat under pressure with a 60 s TTL on every turn: the tuner leaves recency for the learned setting
    (TTLs ignored, as recency ignored them), then takes its twin that honours TTLs, then goes back to the no-TTL
    twin (which lets go of every retained prefix at once)."""
    config = dict(KIND_DEFAULTS["tenant-chat"], requests=800)
    return parse_rows(generate_rows("tenant-chat", GenConfig(seed=3, **config)))


def test_the_tuners_switches_forced_on_a_tree_without_it_give_its_hits_to_the_token(tenant_chat):
    result = breakdown(tenant_chat, ReplayConfig("tinylfu", CAPACITY), TuningConfig())
    segments = result.segments
    assert [s.live for s in segments] == ["lru-no-ttl", "gated-no-ttl", "gated", "gated-no-ttl"]  # both kinds
    # the tuner's own run is the replay's, and the segments cover it request by request
    assert result.tuned_hit_rate == replay(tenant_chat, ReplayConfig("tinylfu", CAPACITY)).token_hit_rate
    assert segments[0].start == 0 and segments[-1].end == len(tenant_chat.requests)
    assert all(a.end == b.start for a, b in zip(segments, segments[1:]))
    assert sum(s.requested_tokens for s in segments) == result.input_tokens
    assert sum(s.tuned_hits for s in segments) == pytest.approx(result.tuned_hit_rate * result.input_tokens)
    # before the first switch the live tree is recency pinned; after it, its state is its own
    assert segments[0].state == 0 and any(s.state != 0 for s in segments[1:])
    d = result.to_dict()
    assert d["choice_total"] + d["state_total"] == pytest.approx(
        sum(s.tuned_hits - max(s.pinned_hits.values()) for s in segments) / result.input_tokens)


def test_a_shadow_that_shares_state_with_the_live_tree_is_caught(tenant_chat, monkeypatch):
    """The check the breakdown rests on: if a miniature wrote into the live tree's state (here, its retention
    budget), the forced schedule would not give the tuner's hits, and the breakdown refuses to report."""
    make_shadow = TieredRadixCache._make_shadow

    def sharing(self, setting, capacity):
        shadow = make_shadow(self, setting, capacity)
        shadow.cache.retention = self.retention
        return shadow

    monkeypatch.setattr(TieredRadixCache, "_make_shadow", sharing)
    with pytest.raises(ScheduleMismatch):
        breakdown(tenant_chat, ReplayConfig("tinylfu", CAPACITY), TuningConfig())


def test_the_command_line_refuses_a_run_without_a_tuner(tmp_path, capsys):
    assert main(["--trace", str(tmp_path / "none.jsonl"), "--capacity-tokens", "5e4", "--shadow-rate", "0"]) == 2
    assert "turns the tuner off" in capsys.readouterr().err
    assert main(["--trace", str(tmp_path / "none.jsonl"), "--capacity-tokens", "5e4"]) == 2
    assert "none.jsonl" in capsys.readouterr().err
