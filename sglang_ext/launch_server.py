"""`python -m sglang_ext.launch_server`: SGLang's server with the tiered cache, and sensible CPU defaults.

Accepts every `sglang.launch_server` flag plus the project's `--tier-*` flags (also as keys of SGLang's
`--config FILE.yaml`). Defaults it adds, each only when the user did not set the flag:
- `--radix-cache-backend tiered` (the project's tree cache, registered by the plugin);
- `--model-path` = the embedded tiny model (built offline on first use);
- with no CUDA: SGLang's CPU engine and the settings that work there (see CPU_DEFAULTS), announced in one
  log line. A flag that contradicts the CPU path fails with a message naming it.
An installed SGLang other than the pinned one, or one whose private hooks changed (compat), is refused first.

SGLang spawns its scheduler with the `spawn` start method, which re-imports the main module: nothing may
run at import time here, only under `if __name__ == "__main__"`.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import urllib.request
from typing import List, Optional, Sequence

from sglang_ext.compat import IncompatibleSGLang

CPU_DEFAULTS = {
    "--device": "cpu",
    "--attention-backend": "torch_native",
    "--sampling-backend": "pytorch",
    "--page-size": "1",
    "--mem-fraction-static": "0.05",
    "--max-total-tokens": "8192",
    "--dtype": "bfloat16",
}
CPU_FLAGS = ["--skip-server-warmup"]
# An idle scheduler busy-polls its sockets, a whole core each on this CPU (a test session keeps several servers up);
# with this flag it waits on them, and a request wakes it at once (same latency: benchmarks/RESULTS.md, "Idle
# schedulers sleep on CPU"). HiCache's copies finish on threads that do not wake it: one still in flight when the
# server goes idle is acknowledged (and written on to a peer) at the next poll, at most 1 s later.
CPU_IDLE_FLAGS = ["--sleep-on-idle"]
# oneDNN (torch's bf16 matmuls on an AVX-512/AMX CPU) caches a primitive per input shape, 1024 per cache by
# default, and every batch's token count is a new shape: about 1 MB per new shape, and about half of the
# scheduler's RSS growth per request in the soak (benchmarks/RESULTS.md, memory over time). Bounded here unless
# the user set them; read by the scheduler process (spawned with this environment) at its first matmul.
# TORCH_COMPILE_DISABLE: SGLang compiles a few sampling helpers with torch.compile (repetition_penalty's scaling,
# seeded multinomial sampling); on this CPU the compiler reaches for triton, finds the stand-in, and the scheduler
# dies on the first request that uses them. Eager runs them fine.
CPU_ENV_DEFAULTS = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64", "TORCH_COMPILE_DISABLE": "1"}
# Flags whose other values cannot work without CUDA, and the only value that does.
CPU_REQUIRED = {
    "--device": "cpu",
    "--attention-backend": "torch_native",
    "--sampling-backend": "pytorch",
    "--page-size": "1",
    "--hicache-io-backend": "direct",
    "--hicache-mem-layout": "layer_first",
}
CPU_HICACHE_DEFAULTS = {"--hicache-io-backend": "direct", "--hicache-mem-layout": "layer_first"}


class LaunchError(Exception):
    """A start-up problem the user can fix; printed without a traceback."""


def flag_value(argv: Sequence[str], flag: str) -> Optional[str]:
    """The value of `flag` in argv (`--f v` or `--f=v`), the last one winning; None if absent."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def has_flag(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def model_path_of(argv: List[str]) -> str:
    """The model the server will load: `--model-path` / `--model`, else the embedded default."""
    path = flag_value(argv, "--model-path") or flag_value(argv, "--model")
    if path is None:
        from sglang_ext.embedded_model import ensure_embedded_model

        path = str(ensure_embedded_model())
    return path


def apply_peer_tier(argv: List[str], tier_config) -> List[str]:
    """`--tier-peers` puts the peer tier under HiCache: L3 = the project's `dynamic` PeerStorage backend."""
    if not tier_config.peers:
        return argv
    backend = flag_value(argv, "--hicache-storage-backend")
    if backend is not None:
        raise LaunchError(f"--tier-peers sets the storage backend itself; drop --hicache-storage-backend {backend}")
    if has_flag(argv, "--hicache-storage-backend-extra-config"):
        raise LaunchError("--tier-peers sets the storage config itself; drop --hicache-storage-backend-extra-config")
    from tiers.keys import weights_revision

    argv = list(argv) + tier_config.storage_args(weights_revision(model_path_of(argv)))
    if not has_flag(argv, "--enable-hierarchical-cache"):
        argv.append("--enable-hierarchical-cache")
    return argv


def check_host_memory(argv: List[str]) -> None:
    """A host tier larger than the memory this machine has free fails now, not in the middle of serving."""
    value = flag_value(argv, "--hicache-size")
    if value is None:
        return
    try:
        size_gb = float(value)
    except ValueError:
        raise LaunchError(f"--hicache-size {value}: not a number of GB") from None
    import psutil

    available_gb = psutil.virtual_memory().available / 2**30
    if size_gb > available_gb:
        raise LaunchError(f"--hicache-size {value}: {size_gb:g} GB of host tier does not fit in the "
                          f"{available_gb:.1f} GB of memory available on this machine")


def apply_defaults(argv: List[str], cuda: bool) -> tuple[List[str], List[str]]:
    """Return (argv with the project's defaults added, a description of what was added)."""
    argv, added = list(argv), []
    if not has_flag(argv, "--radix-cache-backend"):
        argv += ["--radix-cache-backend", "tiered"]
    if not has_flag(argv, "--model-path") and not has_flag(argv, "--model"):
        argv += ["--model-path", model_path_of(argv)]
        added.append("embedded tiny model")
    if cuda:
        return argv, added
    for flag, required in CPU_REQUIRED.items():
        value = flag_value(argv, flag)
        if value is not None and value != required:
            raise LaunchError(f"{flag} {value}: not possible without CUDA (this machine has none); use {required}")
    defaults = dict(CPU_DEFAULTS)
    if has_flag(argv, "--enable-hierarchical-cache"):
        defaults.update(CPU_HICACHE_DEFAULTS)
    for flag, value in defaults.items():
        if not has_flag(argv, flag):
            argv += [flag, value]
            added.append(f"{flag} {value}")
    for flag in CPU_FLAGS + CPU_IDLE_FLAGS:
        if not has_flag(argv, flag):
            argv.append(flag)
            added.append(flag)
    return argv, added


def split_tier_args(argv: List[str]):
    """Expand `--config FILE.yaml`, then separate the project's `--tier-*` flags from SGLang's."""
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    from sglang_ext.tier_config import add_tier_args, tier_config_from_args

    combined = argparse.ArgumentParser(prog="python -m sglang_ext.launch_server", add_help=False)
    ServerArgs.add_cli_args(combined)
    add_tier_args(combined)
    if "--config" in argv:
        try:
            argv = ConfigArgumentMerger(combined).merge_config_with_args(argv)
        except (ValueError, OSError) as e:
            raise LaunchError(f"--config: {e}") from None
    # exit_on_error=False: a malformed value ("--tier-session-ttl abc") is a LaunchError naming the flag, like
    # every other bad value, instead of argparse exiting from inside a library call.
    ours = argparse.ArgumentParser(prog="python -m sglang_ext.launch_server", add_help=False, exit_on_error=False)
    add_tier_args(ours)
    _check_one_value_each(argv, ours)
    try:
        tier_args, rest = ours.parse_known_args(argv)
        return tier_config_from_args(tier_args), rest
    except (argparse.ArgumentError, ValueError) as e:
        raise LaunchError(str(e)) from None


def _check_one_value_each(argv: List[str], parser: argparse.ArgumentParser) -> None:
    """A `--tier-*` flag that takes a value takes one. A YAML list in `--config` (`tier-peers: [a, b]`) is spliced
    into argv as several words; argparse would take the first and leave the rest to SGLang, whose "unrecognized
    arguments" names no flag."""
    one_value = {opt for action in parser._actions if action.nargs is None for opt in action.option_strings}
    for i, word in enumerate(argv[:-2]):
        if word in one_value and not argv[i + 2].startswith("-"):
            raise LaunchError(f"{word}: takes one value, got {argv[i + 1]!r} and then {argv[i + 2]!r} (a list in "
                              f"--config? give one comma-separated string)")


def refuse_unchecked_entry_points(server_args) -> None:
    """Entry points that reach the scheduler past the request checks (request_api) are refused. With
    `--tokenizer-worker-num` above 1, SGLang serves HTTP from worker processes that import its app afresh and load
    no plugin: no request check, no `cache_control`, and a client's copy of the internal TTL key would reach the
    scheduler. SGLang's gRPC servers (`--grpc-port`, `--smg-grpc-mode`) skip the HTTP middleware the same way."""
    workers = getattr(server_args, "tokenizer_worker_num", 1)
    if workers != 1:
        raise LaunchError(f"--tokenizer-worker-num {workers} is not supported: SGLang starts those HTTP workers "
                          "without its plugins, so requests would skip sglang_ext's checks; use 1")
    if getattr(server_args, "grpc_port", None) is not None or getattr(server_args, "smg_grpc_mode", False) \
            or getattr(server_args, "grpc_mode", False):
        raise LaunchError("--grpc-port / --smg-grpc-mode (or SGLANG_GRPC_PORT) is not supported: gRPC requests "
                          "skip sglang_ext's request checks; serve HTTP only")


def announce_when_ready(url: str, deadline_s: float = 600.0) -> None:
    """Print one line once /health answers (a daemon thread; gives up silently at the deadline)."""

    def poll():
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        print(f"sglang_ext: ready at {url}", flush=True)
                        return
            except OSError:
                pass
            time.sleep(0.5)

    threading.Thread(target=poll, daemon=True, name="sglang_ext-ready").start()


def set_cpu_env_defaults(environ) -> None:
    """CPU_ENV_DEFAULTS into `environ`, each only where the user set nothing."""
    for name, value in CPU_ENV_DEFAULTS.items():
        environ.setdefault(name, value)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        return print_help()
    cuda = cuda_available()
    if not cuda:
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # read at import time by sglang modules: set it first
        set_cpu_env_defaults(os.environ)
    try:
        from sglang_ext import compat

        compat.check()  # a drifted SGLang is refused here, naming what changed, before anything starts
        from sglang_ext.plugin import register

        register()  # `--radix-cache-backend` accepts only registered names
        tier_config, argv = split_tier_args(argv)
        argv, added = apply_defaults(apply_peer_tier(argv, tier_config), cuda)
        check_host_memory(argv)
        os.environ["SGLANG_EXT_TIER_CONFIG"] = tier_config.to_env()
        from sglang.srt.server_args import prepare_server_args

        server_args = prepare_server_args(argv)
        refuse_unchecked_entry_points(server_args)
    except (LaunchError, IncompatibleSGLang) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, AssertionError) as e:  # SGLang's own argument validation
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not cuda:
        print(f"sglang_ext: no CUDA device; CPU engine with {', '.join(added) or 'the flags given'}", flush=True)
    url = f"http://{server_args.host}:{server_args.port}"
    print(f"sglang_ext: serving on {url} (tier policy {tier_config.policy})", flush=True)
    announce_when_ready(url)
    from sglang.launch_server import run_server

    run_server(server_args)
    return 0


def print_help() -> int:
    from sglang.srt.server_args import ServerArgs

    from sglang_ext.tier_config import add_tier_args

    parser = argparse.ArgumentParser(prog="python -m sglang_ext.launch_server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    ServerArgs.add_cli_args(parser)
    add_tier_args(parser)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
