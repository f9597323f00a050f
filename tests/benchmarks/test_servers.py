"""How the benchmarks start servers: a stock one gets the same CPU kernel-cache settings as ours and SGLang's own
plugins only; ports come from outside the range outgoing connections take, and a port taken anyway means another
try; a run tells a server that died by itself from one it stopped."""

import ast
import socket
import subprocess
import sys

import pytest

from benchmarks import servers
from benchmarks.servers import PORT_TAKEN_LINES, Server, free_port, stock_env
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


def _server(tmp_path, code: str) -> Server:
    log = tmp_path / "server-1.log"
    log.write_text("starting\nScheduler hit an exception: boom\n")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    return Server(url="http://127.0.0.1:1", proc=proc, log_path=log)


def test_a_server_that_exits_by_itself_is_a_crash_with_its_log(tmp_path):
    server = _server(tmp_path, "raise SystemExit(3)")
    server.proc.wait(timeout=60)
    crash = server.crash()
    assert "code 3" in crash and "Scheduler hit an exception: boom" in crash
    server.stop()  # stopping a dead server afterwards does not hide that it crashed
    assert server.crash() == crash


def test_a_server_stopped_while_running_is_not_a_crash(tmp_path):
    server = _server(tmp_path, "import time; time.sleep(60)")
    assert server.crash() is None
    server.stop()
    assert server.proc.poll() is not None and server.crash() is None


def test_a_chosen_port_is_free_and_below_the_ephemeral_range():
    low = servers._ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert 10000 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free


def test_a_server_that_could_not_bind_its_port_is_stopped_and_reported(tmp_path):
    """uvicorn logs the bind failure and the process hangs on: without the check, a 300-s wait for health."""
    hang = f"print({PORT_TAKEN_LINES[0]!r} + ' (127.0.0.1, 1): address already in use', flush=True); " \
           "import time; time.sleep(120)"
    with pytest.raises(servers._PortTaken):
        servers._start_on_a_port([sys.executable, "-c", hang], {}, tmp_path, "s", None)


def test_a_server_whose_nccl_port_was_taken_is_another_try_not_a_failure(tmp_path):
    """torch.distributed's TCPStore fails on a taken NCCL port and the server exits (seen in CI, two replicas
    starting at once); it is given its NCCL port from below the ephemeral range, like its HTTP port."""
    args = "import sys; print(sys.argv[1:], flush=True); "
    exits = args + "print('DistNetworkError: ... code: -98, name: EADDRINUSE', flush=True); raise SystemExit(1)"
    with pytest.raises(servers._PortTaken):
        servers._start_on_a_port([sys.executable, "-c", exits], {}, tmp_path, "s", None)
    given = ast.literal_eval(next(tmp_path.glob("s-*.log")).read_text().splitlines()[0])
    assert 10000 <= int(given[given.index("--nccl-port") + 1]) < servers._ephemeral_low()


def test_a_taken_port_means_another_try_up_to_a_bound(tmp_path, monkeypatch):
    tries, taken = [], [2]

    def start(cmd, env, log_dir, name, admin_key):
        tries.append(name)
        if len(tries) <= taken[0]:
            raise servers._PortTaken("taken")
        return "started"

    monkeypatch.setattr(servers, "_start_on_a_port", start)
    assert servers.start_server([], tmp_path, "s") == "started" and len(tries) == 3
    tries.clear()
    taken[0] = servers.START_ATTEMPTS
    with pytest.raises(servers._PortTaken):
        servers.start_server([], tmp_path, "s")
    assert len(tries) == servers.START_ATTEMPTS
