"""How the benchmarks start a stock server: the same CPU kernel-cache settings as ours, SGLang's own plugins only."""

from benchmarks.servers import stock_env
from sglang_ext.launch_server import CPU_ENV_DEFAULTS


def test_a_stock_server_on_cpu_gets_the_kernel_cache_bounds_ours_runs_with():
    """Guards: stock at oneDNN's default of 1024 shapes against ours at 64, which made TTFT ratios compare
    kernel-cache settings instead of caches."""
    env = stock_env({"PATH": "/bin"}, "none", cuda=False)
    assert env["SGLANG_PLUGINS"] == "none" and env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert all(env[var] == value for var, value in CPU_ENV_DEFAULTS.items())


def test_what_the_caller_set_wins_and_a_gpu_server_gets_no_cpu_settings():
    env = stock_env({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}, "tiered_kv", cuda=False)
    assert env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "1024" and env["SGLANG_PLUGINS"] == "tiered_kv"
    gpu = stock_env({}, "none", cuda=True)
    assert "SGLANG_USE_CPU_ENGINE" not in gpu and not set(CPU_ENV_DEFAULTS) & set(gpu)
