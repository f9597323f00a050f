"""The pinned SGLang interface: the installed SGLang matches it, and drift is refused naming what changed."""

import pytest

from sglang.srt.mem_cache.hiradix_cache import HiRadixCache
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang_ext import compat, launch_server, plugin
from sglang_ext.request_api import attach_stats_to_internal_state, tiers_stats_reply

ALL_HOOKS = compat.CACHE_HOOKS + compat.HTTP_HOOKS


def test_the_installed_sglang_is_the_pinned_interface():
    assert compat.problems(ALL_HOOKS) == []


def test_another_sglang_version_is_named():
    assert compat.problems((), version="0.5.21") == ["installed sglang is 0.5.21, this project needs 0.5.20"]


def test_a_removed_hook_is_named(monkeypatch):
    monkeypatch.delattr(RadixCache, "_delete_leaf")
    found = compat.problems(ALL_HOOKS)
    assert len(found) == 1 and "RadixCache._delete_leaf is gone" in found[0]


def test_a_hook_whose_parameters_changed_is_named(monkeypatch):
    monkeypatch.setattr(HiRadixCache, "_evict_regular", lambda self, node, reason: 0)
    found = compat.problems(ALL_HOOKS)
    assert found == ["sglang.srt.mem_cache.hiradix_cache.HiRadixCache._evict_regular takes (self, node, reason), "
                     "expected (self, node) (overridden: drops counted)"]


def test_a_missing_private_global_is_named(monkeypatch):
    from sglang.srt.entrypoints import http_server

    monkeypatch.delattr(http_server, "_global_state")
    assert any("http_server._global_state is gone" in p for p in compat.problems(ALL_HOOKS))


def test_the_launcher_refuses_a_drifted_sglang_naming_the_hook(monkeypatch, capsys):
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")  # main() sets it; the test restores it
    monkeypatch.setattr(HiRadixCache, "_inc_hit_count", lambda self, node: None)
    assert launch_server.main(["--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "HiRadixCache._inc_hit_count takes (self, node)" in err


def test_the_tiered_backend_refuses_to_build_on_a_drifted_sglang(monkeypatch):
    monkeypatch.setattr(plugin, "_incompatible", "RadixCache._split_node is gone")
    with pytest.raises(compat.IncompatibleSGLang, match="_split_node"):
        plugin.build_tree_cache(ctx=None)


def test_tiers_stats_is_never_an_empty_body():
    status, body = tiers_stats_reply([{"load": 1}])  # the hook did not run on that rank
    assert status == 503 and "get_internal_state" in body["error"]
    assert tiers_stats_reply([])[0] == 503
    assert tiers_stats_reply([{"tiers": {"cache": "X"}}]) == (200, {"cache": "X"})
    assert tiers_stats_reply([{"tiers": {"a": 1}}, {"tiers": {"b": 2}}]) == (200, {"ranks": [{"a": 1}, {"b": 2}]})


def test_a_cache_that_is_not_ours_says_so_in_its_stats():
    class Result:
        internal_state = {}

    class Scheduler:
        tree_cache = RadixCache.create_simulated()

    state = attach_stats_to_internal_state(Result(), Scheduler()).internal_state["tiers"]
    assert state["cache"] == "RadixCache" and "not the tiered cache" in state["error"]
