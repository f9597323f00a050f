"""GPU check for a lent H200 (`python -m benchmarks.gpu_check`, under 8 minutes, needs only torch there).

1. Host<->device KV page transfer bandwidth: one large contiguous copy and many scattered pages gathered into
   one copy, from pinned and from pageable host memory, against the PCIe peak of the card's link.
2. The live stock-vs-tiered comparison (`python -m benchmarks live`) if SGLang is importable on that machine
   (the device machine has no network: it runs only with what its image and the carried tree hold).
Prints markdown tables; CI never runs it.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time

PCIE_GEN5_X16_GBPS = 63.0  # per direction, theoretical (32 GT/s x 16 lanes, 128b/130b)


def bandwidth(copy, nbytes: int, repeats: int) -> float:
    import torch

    copy()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        copy()
    end.record()
    torch.cuda.synchronize()
    return nbytes * repeats / (start.elapsed_time(end) / 1000) / 1e9


def transfer_table(total_mib: int, page_kib: int) -> str:
    import torch

    n = total_mib * 2**20
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    rows = ["| copy | host memory | GB/s | / PCIe Gen5 x16 peak |", "|---|---|---|---|"]
    for pinned in (True, False):
        host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
        for name, fn in (("H2D contiguous", lambda: dev.copy_(host, non_blocking=True)),
                         ("D2H contiguous", lambda: host.copy_(dev, non_blocking=True))):
            gbps = bandwidth(fn, n, 5)
            rows.append(f"| {name} | {'pinned' if pinned else 'pageable'} | {gbps:.1f} | {gbps / PCIE_GEN5_X16_GBPS:.2f} |")
    page = page_kib * 1024
    pages = n // page
    host = torch.empty((pages, page), dtype=torch.uint8, pin_memory=True)
    dev_pages = dev.view(pages, page)
    idx = torch.randperm(pages)[: pages // 2]
    staging = torch.empty((len(idx), page), dtype=torch.uint8, pin_memory=True)

    def scattered_h2d():
        torch.index_select(host, 0, idx, out=staging)  # gather on the host, then one copy (HiCache's direct path)
        dev_pages[: len(idx)].copy_(staging, non_blocking=True)

    gbps = bandwidth(scattered_h2d, len(idx) * page, 3)
    rows.append(f"| H2D {len(idx)} scattered {page_kib} KiB pages (gather + 1 copy) | pinned | {gbps:.1f} | "
                f"{gbps / PCIE_GEN5_X16_GBPS:.2f} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__)
    parser.add_argument("--total-mib", type=int, default=1024)
    parser.add_argument("--page-kib", type=int, default=64)
    parser.add_argument("--live-timeout", type=int, default=300)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}\n")
    t0 = time.perf_counter()
    print(transfer_table(args.total_mib, args.page_kib))
    print(f"\n(transfer checks took {time.perf_counter() - t0:.1f} s)\n")
    if importlib.util.find_spec("sglang") is None:
        print("live comparison skipped: sglang is not installed on this machine")
        return 0
    run = subprocess.run([sys.executable, "-m", "benchmarks", "live", "--sessions", "8", "--turns", "4"],
                         capture_output=True, text=True, timeout=args.live_timeout)
    print(run.stdout or run.stderr[-3000:])
    return run.returncode


if __name__ == "__main__":
    raise SystemExit(main())
