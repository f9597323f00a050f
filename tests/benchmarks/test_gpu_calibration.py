"""The GPU calibration script: its profile output loads as a cost profile, it refuses a machine without CUDA,
and (on a GPU machine only) it measures."""

import pytest
import torch

from benchmarks import gpu_calibration
from benchmarks.cost import load_profile


def test_the_measured_profile_loads_and_carries_the_measured_figures(tmp_path):
    """Guards: a calibration whose YAML the cost model cannot load, or that drops what it measured."""
    result = {
        "prefill": {"layers_run": 4, "achievable_prefill_flops": 3.1e14},
        "copies": {"64": {"h2d_per_page_gbps": 21.0, "h2d_batched_gbps": 48.5, "d2h_batched_gbps": 50.0}},
    }
    path = tmp_path / "measured.yaml"
    path.write_text(gpu_calibration.profile_text(result, "python -m benchmarks.gpu_calibration --json"))
    profile = load_profile(str(path))
    assert profile.achievable_prefill_flops == pytest.approx(3.1e14, rel=1e-3)
    assert profile.tier_bandwidth("host") == pytest.approx(48.5e9, rel=1e-3)  # the best h2d, not d2h


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_says_so_and_exits_2(capsys):
    assert gpu_calibration.main(["--json"]) == 2
    assert "no CUDA" in capsys.readouterr().err


@pytest.mark.gpu
def test_on_a_gpu_it_measures_every_phase():
    result = gpu_calibration.measure_prefill(torch, layers=1, lengths=[256], repeats=1)
    assert result["achievable_prefill_flops"] > 0
    copies = gpu_calibration.measure_copies(torch, page_tokens=16, pages=8, repeats=1)
    copies.update(gpu_calibration.measure_contiguous(torch, mib=8, repeats=1))
    assert all(v > 0 for k, v in copies.items() if k.endswith("gbps"))
