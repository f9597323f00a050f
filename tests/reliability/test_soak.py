"""A short soak with peer faults: concurrent multi-turn sessions under several tenants, the peer killed and
restarted, then frozen and thawed. No request may fail, no node lock may be left once idle, bad inputs are
clean 4xx, and every verified final turn equals the cache-off reference's greedy answer."""

import pytest

from benchmarks.soak import SoakConfig, run_soak

pytestmark = pytest.mark.server


def test_short_soak_with_peer_faults(tmp_path):
    result = run_soak(SoakConfig(duration_s=45, sessions=6, tenants=3, seed=7, faults=True, log_dir=str(tmp_path)))
    print(result.to_dict())
    assert result.faults_injected == 2, result.fault_log
    assert result.requests > 0 and result.sessions > 0
    assert result.failures == 0, result.errors
    assert result.bad_input_failures == 0, result.errors
    assert result.leaked_lock_refs == 0 and not any(result.locks.values()), result.locks
    assert result.verified_sessions == min(result.sessions, 60)
    assert result.output_mismatches == 0, result.errors
    assert sum(result.hits_by_tier.values()) > 0, result.hits_by_tier  # the cache really was in use
    assert result.peer_used_pages > 0  # the peer tier took pages after its restart
