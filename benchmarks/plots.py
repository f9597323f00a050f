"""PNG plots of sweep results (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_REFERENCE_STYLE = {"opt": dict(color="black", linestyle="--"), "infinite": dict(color="grey", linestyle=":")}


def plot_hit_rates(results: Sequence[dict], path: str, title: str = "") -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy in dict.fromkeys(r["policy"] for r in results):
        pts = sorted((r["capacity_tokens"], r["token_hit_rate"]) for r in results if r["policy"] == policy)
        xs, ys = zip(*pts)
        style = _REFERENCE_STYLE.get(policy, dict(marker="o"))
        label = {"opt": "OPT (Belady, bypass)", "infinite": "infinite cache"}.get(policy, policy)
        ax.plot(xs, ys, label=label, **style)
    ax.set_ylim(bottom=0)
    return _finish_log_x(fig, ax, path, "device capacity (tokens)", "token hit rate", f"Hit rate vs capacity {title}")


def _finish_log_x(fig, ax, path: str, xlabel: str, ylabel: str, title: str) -> str:
    """The layout the curve plots share (log x axis, grid, legend), saved to `path`."""
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title.strip())
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_ttft_cdf(ttfts_ms_by_server: dict, path: str, title: str = "") -> str:
    """Live mode: the distribution of time to first token per server, as a CDF (one step per request)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for server, values in ttfts_ms_by_server.items():
        xs = sorted(values)
        if xs:
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=f"{server} ({len(xs)})")
    ax.set_ylim(0, 1.01)
    return _finish_log_x(fig, ax, path, "time to first token (ms)", "share of requests", f"TTFT CDF {title}")


def plot_tier_traffic(results: Sequence[dict], path: str, title: str = "") -> str:
    """Bytes moved per tier (load + store) per policy and capacity; without lower tiers, the bytes the device
    evicted (what a host tier would have had to absorb)."""
    labels, series = [], {}
    tiers = sorted({t for r in results for t in r["bytes_moved_by_tier"]})
    for r in results:
        labels.append(f"{r['policy']}\n{r['capacity_tokens']:.2g}")
        if tiers:
            for t in tiers:
                moved = r["bytes_moved_by_tier"].get(t, {"load": 0, "store": 0})
                series.setdefault(f"{t} load", []).append(moved["load"] / 1e9)
                series.setdefault(f"{t} store", []).append(moved["store"] / 1e9)
        else:
            evicted = r["evicted_blocks"] * r["block_tokens"] * r["kv_bytes_per_token"] / 1e9
            series.setdefault("device evictions", []).append(evicted)
    fig, ax = plt.subplots(figsize=(max(7, 0.6 * len(labels)), 4.5))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(labels))], values, width=width, label=name)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))])
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("GB moved")
    ax.set_title(f"Tier traffic {title}".strip())
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
