"""Real SGLang servers on 127.0.0.1 for benchmarks and tests: start, wait healthy (with a deadline), talk, stop.

`tiered`: `python -m sglang_ext.launch_server` (the project). `stock`: `python -m sglang.launch_server` with the same
model and, without CUDA, the same CPU settings, so the two differ only in the cache.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parent.parent
START_DEADLINE_S = float(os.environ.get("SGLANG_EXT_START_DEADLINE", "300"))
PEER_START_DEADLINE_S = 60.0
REQUEST_DEADLINE_S = 120.0


def _ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range. Why below: a server binds its port tens of seconds
    after it is chosen (after loading the model), and meanwhile every outgoing connection on the machine takes
    a port from the ephemeral range; a soak makes thousands, and one took a chosen port (the server then
    failed to bind and never became healthy)."""
    low, high = 10000, _ephemeral_low() - 1
    for _ in range(100):
        port = random.randint(low, high) if high > low else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port in {low}-{high}")


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log_path: Path
    admin_key: Optional[str] = None  # sent as a bearer token on `get` (SGLang's --admin-api-key)
    stopped: bool = False  # set by `stop` on a running server: an exit without it is a crash

    def crash(self) -> Optional[str]:
        """None while the server runs or after `stop`; else its exit code and the last lines of its log."""
        code = self.proc.poll()
        if self.stopped or code is None:
            return None
        return f"{self.log_path.name} exited by itself with code {code}; its log ends:\n{self.log_tail(40)}"

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def post(self, path: str, body: dict, timeout: float = REQUEST_DEADLINE_S) -> dict:
        status, parsed = self.post_status(path, body, timeout)
        if status != 200:
            raise RuntimeError(f"POST {path} -> {status}: {parsed}")
        return parsed

    def post_status(self, path: str, body, timeout: float = REQUEST_DEADLINE_S, method: str = "POST",
                    headers: Optional[dict] = None):
        """(status, parsed body) without raising on 4xx/5xx."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"content-type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, raw.decode(errors="replace")

    def get(self, path: str, timeout: float = REQUEST_DEADLINE_S):
        headers = {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}
        with urllib.request.urlopen(urllib.request.Request(self.url + path, headers=headers), timeout=timeout) as r:
            raw = r.read()
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode()

    def generate(self, text=None, input_ids=None, max_new_tokens: int = 8, **extra) -> dict:
        body = {"sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}, **extra}
        body["text" if text is not None else "input_ids"] = text if text is not None else input_ids
        return self.post("/generate", body)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.stopped = True
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stock_args(model_path: Optional[str] = None) -> List[str]:
    """Flags that make `sglang.launch_server` serve what `sglang_ext.launch_server` serves by default."""
    from sglang_ext.embedded_model import ensure_embedded_model
    from sglang_ext.launch_server import CPU_DEFAULTS, CPU_FLAGS, CPU_IDLE_FLAGS, cuda_available

    args = ["--model-path", model_path or str(ensure_embedded_model())]
    if not cuda_available():
        for flag, value in CPU_DEFAULTS.items():
            args += [flag, value]
        args += CPU_FLAGS + CPU_IDLE_FLAGS
    return args


def stock_env(env: dict, stock_plugins: str, cuda: bool) -> dict:
    """The environment of a stock server: `stock_plugins` as SGLang's plugin whitelist ("none": stock SGLang)
    and, on CPU, SGLang's CPU engine and the oneDNN cache bounds our launcher sets (what the caller set wins), so
    that stock and ours compare caches, not kernel-cache settings (a bound of 64 shapes costs ~15% per bf16
    forward of varied lengths here: benchmarks/RESULTS.md, "Live trace replay")."""
    from sglang_ext.launch_server import CPU_ENV_DEFAULTS

    out = {**env, "SGLANG_PLUGINS": stock_plugins}
    if not cuda:
        out.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        for var, value in CPU_ENV_DEFAULTS.items():
            out.setdefault(var, value)
    return out


class _PortTaken(RuntimeError):
    """A port chosen for the server (HTTP or torch.distributed's) was taken before the server bound it."""


# what the log shows when a chosen port was taken: uvicorn's line (the process then hangs, unhealthy), and
# torch.distributed's TCPStore failing on the NCCL port (the process then exits)
PORT_TAKEN_LINES = ("error while attempting to bind on address", "EADDRINUSE")
START_ATTEMPTS = 3


def start_server(args: List[str], log_dir: Path, name: str = "server", kind: str = "tiered",
                 env: Optional[dict] = None, model_path: Optional[str] = None,
                 admin_key: Optional[str] = None, stock_plugins: str = "none") -> Server:
    """Start a server and wait until /health answers; `kind` is "tiered" (the project) or "stock" (SGLang).
    `admin_key`: started with `--admin-api-key`, and the returned Server sends it on `get`.
    `stock_plugins`: SGLANG_PLUGINS of a stock server ("none": none of ours; "tiered_kv": our plugin, for its
    CPU HiCache seams, while the tree cache stays SGLang's own). A port taken before the server bound it
    means another try on another port."""
    if admin_key:
        args = [*args, "--admin-api-key", admin_key]
    log_dir.mkdir(parents=True, exist_ok=True)
    if kind == "tiered":
        cmd = [sys.executable, "-m", "sglang_ext.launch_server", *args]
    elif kind == "stock":
        cmd = [sys.executable, "-m", "sglang.launch_server", *stock_args(model_path), *args]
    else:
        raise ValueError(f"kind must be 'tiered' or 'stock', got {kind!r}")
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if kind == "stock":
        from sglang_ext.launch_server import cuda_available

        full_env = stock_env(full_env, stock_plugins, cuda_available())
    tries_left = START_ATTEMPTS
    while True:
        try:
            return _start_on_a_port(cmd, full_env, log_dir, name, admin_key)
        except _PortTaken:
            tries_left -= 1
            if not tries_left:
                raise


def _start_on_a_port(cmd: List[str], env: dict, log_dir: Path, name: str, admin_key: Optional[str]) -> Server:
    port = free_port()
    # SGLang's own pick for the NCCL (TCPStore) port is the kernel's, in the ephemeral range, bound seconds
    # later: two servers starting at once, or any outgoing connection, can take it first (seen in CI)
    ports = ["--port", str(port)] if "--nccl-port" in cmd else ["--port", str(port), "--nccl-port", str(free_port())]
    log_path = log_dir / f"{name}-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*cmd, "--host", "127.0.0.1", *ports], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", proc, log_path, admin_key)
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        exited = proc.poll() is not None
        if not exited and _healthy(server):
            return server
        if any(line in server.log_tail(200) for line in PORT_TAKEN_LINES):
            server.stop()
            raise _PortTaken(f"{name}: a port it was given ({' '.join(ports)}) was taken")
        if exited:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{server.log_tail()}")
        time.sleep(0.5)  # polling a process we do not control, bounded by the deadline above
    server.stop()
    raise RuntimeError(f"{name} not healthy within {START_DEADLINE_S:.0f}s:\n{server.log_tail()}")


def _healthy(server: Server) -> bool:
    try:
        with urllib.request.urlopen(server.url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


class PeerProcess:
    """The peer block server as a child process that can be killed, frozen and restarted on its port."""

    def __init__(self, log_dir: Path, capacity_gb: float = 0.25):
        self.log_dir, self.capacity_gb, self.port, self.starts = log_dir, capacity_gb, 0, 0
        self.proc: Optional[subprocess.Popen] = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "PeerProcess":
        """Start, or restart on the same port; a fresh log per start, so readiness is this start's line."""
        self.starts += 1
        self.port = self.port or free_port()  # not the kernel's pick: a restart would race outgoing connections
        log = self.log_dir / f"peer-{self.starts}.log"
        cmd = [sys.executable, "-m", "sglang_ext.peer_server", "--host", "127.0.0.1", "--port", str(self.port),
               "--capacity-gb", str(self.capacity_gb)]
        env = dict(os.environ, UCX_NET_DEVICES="lo", NIXL_LOG_LEVEL="WARN", PYTHONUNBUFFERED="1")
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + PEER_START_DEADLINE_S
        while True:
            text = log.read_text(errors="replace")
            ready = [line for line in text.splitlines() if line.startswith("PEER_SERVER_READY")]
            if ready:
                self.port = int(ready[0].split("port=")[1].split()[0])
                return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"peer server did not start (rc={self.proc.poll()}):\n{text[-2000:]}")
            time.sleep(0.1)  # polling a child's log for readiness, bounded by the deadline above

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
            except ProcessLookupError:
                pass
            self.proc.wait(10)


def peer_stats(port: int, deadline_s: float = 5.0) -> dict:
    """A peer block server's own counters (`{"op": "stats"}` on its control port), within a deadline."""
    import socket

    from transfer.base import TransferError
    from transfer.control import recv_message, send_message

    deadline = time.monotonic() + deadline_s
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=deadline_s) as sock:
            send_message(sock, {"op": "stats"}, deadline)
            return recv_message(sock, deadline)[0]["stats"]
    except TransferError as e:
        raise RuntimeError(f"peer on port {port} did not answer: {e}") from None


def wait_for_peer_pages(port: int, at_least: int, deadline_s: float = 60.0) -> None:
    """Write-back to a peer is asynchronous: poll the peer's own page count until it holds `at_least` pages;
    AssertionError at the deadline."""
    deadline = time.monotonic() + deadline_s
    while peer_stats(port)["used_pages"] < at_least:
        assert time.monotonic() < deadline, f"peer holds {peer_stats(port)['used_pages']} < {at_least} pages"
        time.sleep(0.2)  # polling another process's counter, bounded by the deadline above


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (SGLang's scheduler and detokenizer are children)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total
