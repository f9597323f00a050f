"""The CPU server bounds oneDNN's per-shape caches (they grew the scheduler ~1 MB per request), unless the user
chose a capacity, and runs SGLang's torch.compile'd helpers eagerly (compiling them stopped the scheduler: the live
check is in tests/reliability/test_bad_input_fuzz.py); and its idle scheduler sleeps instead of spinning (a peer
tier too), in ours and in the stock servers we compare."""

from sglang_ext.launch_server import CPU_ENV_DEFAULTS, apply_defaults, set_cpu_env_defaults


def test_cpu_caches_are_bounded_and_compilation_is_off_by_default():
    env = {}
    set_cpu_env_defaults(env)
    assert set(env) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY", "TORCH_COMPILE_DISABLE"}
    assert env.pop("TORCH_COMPILE_DISABLE") == "1"
    assert all(0 < int(v) < 1024 for v in env.values())  # below oneDNN's and ideep's default of 1024


def test_a_capacity_the_user_set_is_kept():
    env = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "512"}
    set_cpu_env_defaults(env)
    assert env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "512"
    assert env["LRU_CACHE_CAPACITY"] == CPU_ENV_DEFAULTS["LRU_CACHE_CAPACITY"]


def test_an_idle_cpu_scheduler_sleeps_in_ours_and_in_the_stock_servers_we_compare():
    import argparse

    from sglang.srt.server_args import ServerArgs

    from benchmarks.servers import stock_args

    argv, added = apply_defaults(["--model-path", "m"], cuda=False)
    assert "--sleep-on-idle" in argv and "--sleep-on-idle" in added
    assert "--sleep-on-idle" in stock_args("m")  # stock and ours compare caches, not idle loops
    assert "--sleep-on-idle" not in apply_defaults(["--model-path", "m"], cuda=True)[0]  # GPU: SGLang's default
    peer = ["--model-path", "m", "--enable-hierarchical-cache", "--hicache-storage-backend", "dynamic"]
    assert "--sleep-on-idle" in apply_defaults(peer, cuda=False)[0]  # a peer tier sleeps too
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    assert parser.parse_args(["--model-path", "m", "--sleep-on-idle"]).sleep_on_idle  # the pinned SGLang's flag
