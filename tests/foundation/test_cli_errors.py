"""Bad flags: a clear message naming the flag, a non-zero exit, and no traceback."""

import subprocess
import sys

import pytest

from tests.support import ROOT


def launch(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "sglang_ext.launch_server", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


@pytest.mark.parametrize("args, named", [
    (["--no-such-flag"], "--no-such-flag"),
    (["--page-size", "16"], "--page-size"),
    (["--attention-backend", "flashinfer"], "--attention-backend"),
    (["--tier-policy", "nonsense"], "--tier-policy"),
    (["--tier-session-ttl", "-5"], "--tier-session-ttl"),
    (["--tier-retention-budget", "3"], "--tier-retention-budget"),
    (["--enable-hierarchical-cache", "--tier-policy", "mypkg.policies:Custom"], "--tier-policy"),
    (["--enable-hierarchical-cache", "--hicache-size", "100000"], "--hicache-size"),
    (["--tier-peers", "127.0.0.1:1", "--hicache-storage-backend", "file"], "--hicache-storage-backend"),
    # its HTTP workers load no plugin: every request check would be skipped (a request stopped such a server)
    (["--tokenizer-worker-num", "2"], "--tokenizer-worker-num"),
    (["--grpc-port", "40123"], "--grpc-port"),  # gRPC skips the HTTP middleware's checks too
])
def test_bad_flag_fails_naming_the_flag(args, named):
    run = launch(*args)
    assert run.returncode != 0
    assert named in run.stderr, run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-2000:]


def test_bad_tier_key_in_sglang_config_file_is_named(tmp_path):
    config = tmp_path / "server.yaml"
    config.write_text("tier-policy: nonsense\nmax-total-tokens: 2048\n")
    run = launch("--config", str(config))
    assert run.returncode != 0
    assert "--tier-policy" in run.stderr and "Traceback" not in run.stderr, run.stderr[-2000:]


def test_tier_keys_in_config_file_reach_the_tier_config(tmp_path):
    from sglang_ext.launch_server import split_tier_args

    config = tmp_path / "server.yaml"
    config.write_text("tier-policy: lru\ntier-session-ttl: 300\nmax-total-tokens: 2048\n")
    tier, rest = split_tier_args(["--config", str(config)])
    assert (tier.policy, tier.session_ttl_s) == ("lru", 300.0)
    assert "--max-total-tokens" in rest and not any(a.startswith("--tier-") for a in rest)


@pytest.mark.parametrize("line, flag", [("tier-peers: ['h:1', 'h:2']", "--tier-peers"),
                                        ("tier-shadow-settings: [gated, lru]", "--tier-shadow-settings")])
def test_a_list_for_a_one_value_tier_key_in_a_config_file_is_named(tmp_path, line, flag):
    """SGLang's config merger splices a YAML list in as several words: the first would be the flag's value and the
    rest SGLang's "unrecognized arguments", naming no flag (and the peers after the first silently dropped)."""
    from sglang_ext.launch_server import LaunchError, split_tier_args

    config = tmp_path / "server.yaml"
    config.write_text(f"{line}\nmax-total-tokens: 2048\n")
    with pytest.raises(LaunchError, match=f"^{flag}: takes one value"):
        split_tier_args(["--config", str(config)])
