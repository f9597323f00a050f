"""The CPU server bounds oneDNN's per-shape caches (they grew the scheduler ~1 MB per request), unless the user
chose a capacity."""

from sglang_ext.launch_server import CPU_ENV_DEFAULTS, bound_cpu_caches


def test_cpu_caches_are_bounded_by_default():
    env = {}
    bound_cpu_caches(env)
    assert set(env) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"}
    assert all(0 < int(v) < 1024 for v in env.values())  # below oneDNN's and ideep's default of 1024


def test_a_capacity_the_user_set_is_kept():
    env = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "512"}
    bound_cpu_caches(env)
    assert env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "512"
    assert env["LRU_CACHE_CAPACITY"] == CPU_ENV_DEFAULTS["LRU_CACHE_CAPACITY"]
