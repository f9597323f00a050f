"""GPU calibration of the cost model: one prepared script for a machine with a CUDA GPU (an H200 in the plan).

It measures there what `benchmarks/profiles/llama3-8b-h200.yaml` estimates from public specs:
- prefill seconds per token of a Llama-3-8B-shaped layer stack in bf16 (random weights; hidden 4096, 32 query
  heads and 8 KV heads of 128, MLP 14336; `--layers` of the 32 are run and the time scaled to 32), and from it
  the achievable prefill FLOP/s the profile's `achievable_prefill_flops` stands for;
- host <-> device copy bandwidth: one contiguous 1 GiB copy from pinned and from pageable memory (the link's
  ceiling), and KV pages of 16 and 64 tokens (a page of one layer's K and V, 8 KV heads x 128 x bf16: 4 KiB
  per token) from pinned memory, copied one page per call and as one batched gather, the way HiCache's
  layer-first direct I/O and its kernel I/O move them;
- with NIXL importable (carry the `nixl-cu13` wheel), a VRAM <-> DRAM NIXL transfer of the same pages
  (`transfer.vram_probe`; transfer/ is the only code that imports nixl).

Torch only; no model download. Prints one JSON object, and with `--profile-out PATH` a copy of the 8B profile
with the measured figures and the date and command in its comments. Runs in about 2 minutes on an H200; each
phase has its own repeat count, nothing waits without a bound. On a machine without CUDA it says so and exits 2.

    python -m benchmarks.gpu_calibration --json [--profile-out benchmarks/profiles/llama3-8b-h200-measured.yaml]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from typing import Dict, List

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP, LAYERS = 4096, 32, 8, 128, 14336, 32
KV_BYTES_PER_TOKEN_PER_LAYER = 2 * KV_HEADS * HEAD_DIM * 2  # K and V, bf16
FLOPS_PER_TOKEN = 1.6e10  # the profile's linear-part estimate for Llama-3-8B (~2 x 8.03e9 parameters)


def _layer(torch, device):
    """Random bf16 weights of one decoder layer (the linear parts and the norms)."""
    def w(*shape):
        return torch.randn(*shape, device=device, dtype=torch.bfloat16) * 0.02

    return {
        "qkv": w((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN),
        "o": w(HIDDEN, HEADS * HEAD_DIM),
        "gate_up": w(2 * MLP, HIDDEN),
        "down": w(HIDDEN, MLP),
    }


def _forward(torch, x, layer):
    """One layer's prefill over x [tokens, hidden]: attention (causal, grouped KV heads) and the SwiGLU MLP."""
    F = torch.nn.functional
    n = x.shape[0]
    h = F.rms_norm(x, (HIDDEN,))
    qkv = h @ layer["qkv"].t()
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    q = q.view(n, HEADS, HEAD_DIM).transpose(0, 1)
    k = k.view(n, KV_HEADS, HEAD_DIM).transpose(0, 1).repeat_interleave(HEADS // KV_HEADS, dim=0)
    v = v.view(n, KV_HEADS, HEAD_DIM).transpose(0, 1).repeat_interleave(HEADS // KV_HEADS, dim=0)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(n, HIDDEN)
    x = x + a @ layer["o"].t()
    g, u = (F.rms_norm(x, (HIDDEN,)) @ layer["gate_up"].t()).chunk(2, dim=-1)
    return x + (F.silu(g) * u) @ layer["down"].t()


def _timed(torch, fn, repeats: int) -> float:
    """Median seconds of `fn` over `repeats` runs after one warm-up, CUDA-synchronised."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def measure_prefill(torch, layers: int, lengths: List[int], repeats: int) -> Dict[str, object]:
    device = "cuda"
    stack = [_layer(torch, device) for _ in range(layers)]
    per_token = {}
    with torch.inference_mode():
        for n in lengths:
            x = torch.randn(n, HIDDEN, device=device, dtype=torch.bfloat16)

            def run():
                y = x
                for layer in stack:
                    y = _forward(torch, y, layer)
                return y

            per_token[str(n)] = _timed(torch, run, repeats) * LAYERS / layers / n
    best = min(per_token.values())
    return {"seconds_per_token_by_length": per_token, "seconds_per_token": best,
            "achievable_prefill_flops": FLOPS_PER_TOKEN / best, "layers_run": layers}


def measure_copies(torch, page_tokens: int, pages: int, repeats: int) -> Dict[str, float]:
    """Pinned host <-> device GB/s for `pages` KV pages of one layer, one page per copy and as one gather."""
    page_bytes = page_tokens * KV_BYTES_PER_TOKEN_PER_LAYER
    elems = page_bytes // 2
    dev = torch.empty(pages * 2, elems, device="cuda", dtype=torch.bfloat16)  # pages scattered in a bigger pool
    host = torch.empty(pages, elems, dtype=torch.bfloat16, pin_memory=True)
    picked = torch.arange(0, 2 * pages, 2, device="cuda")
    total = pages * page_bytes

    def d2h_each():
        for i in range(pages):
            host[i].copy_(dev[2 * i], non_blocking=True)

    def h2d_each():
        for i in range(pages):
            dev[2 * i].copy_(host[i], non_blocking=True)

    def d2h_batched():
        host.copy_(dev.index_select(0, picked), non_blocking=True)

    def h2d_batched():
        dev.index_copy_(0, picked, host.to("cuda", non_blocking=True))

    out = {}
    for name, fn in (("d2h_per_page", d2h_each), ("h2d_per_page", h2d_each),
                     ("d2h_batched", d2h_batched), ("h2d_batched", h2d_batched)):
        out[f"{name}_gbps"] = total / _timed(torch, fn, repeats) / 1e9
    out["page_bytes"] = page_bytes
    out["pages"] = pages
    return out


def measure_contiguous(torch, mib: int, repeats: int) -> Dict[str, float]:
    """GB/s of one contiguous copy each way, from pinned and from pageable host memory."""
    n = mib << 20
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    out = {}
    for kind, pinned in (("pinned", True), ("pageable", False)):
        host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
        out[f"h2d_{kind}_gbps"] = n / _timed(torch, lambda: dev.copy_(host, non_blocking=True), repeats) / 1e9
        out[f"d2h_{kind}_gbps"] = n / _timed(torch, lambda: host.copy_(dev, non_blocking=True), repeats) / 1e9
    return out


def profile_text(result: dict, command: str) -> str:
    """The 8B profile with the measured compute and host-link figures (the peer link stays the estimate)."""
    pre = result["prefill"]
    best_h2d = max(v for k, v in result["copies"]["64"].items() if k.startswith("h2d") and k.endswith("gbps"))
    day = datetime.date.today().isoformat()
    return "\n".join([
        f"# Llama-3-8B, bf16 KV, one H200: compute and host link MEASURED on {day} with",
        f"#   {command}",
        f"# ({pre['layers_run']} of 32 layers run, random bf16 weights; host link = best pinned h2d of 64-token pages)",
        "name: llama3-8b-h200-measured",
        "model: meta-llama/Meta-Llama-3-8B",
        "kv_bytes_per_token: 131072",
        f"prefill_flops_per_token: {FLOPS_PER_TOKEN:.3g}",
        f"achievable_prefill_flops: {pre['achievable_prefill_flops']:.4g}",
        "bandwidth:",
        f"  pcie: {best_h2d * 1e9:.4g}",
        "  nvlink: 4.5e11",
        "  rdma: 4.5e10",
        "tiers:",
        "  host: pcie",
        "  peer: rdma",
        "",
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_calibration", description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4, help="layers of the 32 actually run (time is scaled)")
    ap.add_argument("--lengths", default="1024,4096,8192", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--pages", type=int, default=1024, help="KV pages per copy measurement")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-nixl", action="store_true", help="skip the NIXL VRAM<->DRAM measurement")
    ap.add_argument("--profile-out", default=None, help="write a measured cost profile (YAML) here")
    ap.add_argument("--json", action="store_true", help="print one JSON object (default: the same, indented)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_calibration: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "prefill": measure_prefill(torch, args.layers, [int(n) for n in args.lengths.split(",")],
                                         args.repeats),
              "contiguous": measure_contiguous(torch, 1024, args.repeats),
              "copies": {str(t): measure_copies(torch, t, args.pages, args.repeats) for t in (16, 64)}}
    if not args.no_nixl:
        try:
            from transfer.vram_probe import vram_dram_gbps
        except ImportError as e:
            result["nixl"] = {"skipped": f"nixl not importable: {e}"}
        else:
            result["nixl"] = {str(t): vram_dram_gbps(torch, t * KV_BYTES_PER_TOKEN_PER_LAYER, args.pages,
                                                     args.repeats) for t in (16, 64)}
    command = "python -m benchmarks.gpu_calibration " + " ".join(argv if argv is not None else sys.argv[1:])
    result["command"] = command
    if args.profile_out:
        with open(args.profile_out, "w") as f:
            f.write(profile_text(result, command))
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
