"""NIXL VRAM <-> DRAM bandwidth on a GPU machine, for `benchmarks.gpu_calibration` (transfer/ imports nixl).

Two agents in one process over UCX: one registers KV pages in GPU memory, the other the same number of pages in
pinned host memory; the host side READs every page from the GPU (device -> host, a demotion) and WRITEs them back
(host -> device, a load-back), one prepared transfer of one descriptor per page, as the peer tier batches pages.
Every wait polls against a deadline. Not run on the CPU machines: it needs CUDA and a CUDA build of NIXL.
"""

from __future__ import annotations

import time
from typing import Dict

try:  # the `nixl` meta package re-exports the build-specific one; a carried wheel alone is nixl_cu13/_cu12
    from nixl._api import nixl_agent, nixl_agent_config
except ImportError:  # pragma: no cover - depends on which wheel is carried
    try:
        from nixl_cu13._api import nixl_agent, nixl_agent_config
    except ImportError:
        from nixl_cu12._api import nixl_agent, nixl_agent_config


def _wait(agent, handle, deadline: float) -> None:
    state = agent.transfer(handle)
    while state != "DONE":
        if state == "ERR":
            raise RuntimeError("NIXL transfer failed")
        if time.monotonic() > deadline:
            raise TimeoutError("NIXL transfer did not finish before its deadline")
        state = agent.check_xfer_state(handle)


def vram_dram_gbps(torch, page_bytes: int, pages: int, repeats: int, timeout_s: float = 60.0) -> Dict[str, float]:
    """Median GB/s of a READ (VRAM -> DRAM) and a WRITE (DRAM -> VRAM) of `pages` pages of `page_bytes`."""
    config = nixl_agent_config(enable_prog_thread=False, enable_listen_thread=False, backends=["UCX"])
    gpu_side = nixl_agent("calib-vram", config)
    host_side = nixl_agent("calib-dram", config)
    vram = torch.zeros(pages, page_bytes, dtype=torch.uint8, device="cuda")
    dram = torch.zeros(pages, page_bytes, dtype=torch.uint8, pin_memory=True)
    gpu_side.register_memory(vram)
    host_side.register_memory(dram)
    remote = host_side.add_remote_agent(gpu_side.get_agent_metadata())
    dev = torch.cuda.current_device()
    remote_descs = gpu_side.get_xfer_descs([(vram[i].data_ptr(), page_bytes, dev) for i in range(pages)], "VRAM")
    local_descs = host_side.get_xfer_descs([(dram[i].data_ptr(), page_bytes, 0) for i in range(pages)], "DRAM")
    out = {"page_bytes": page_bytes, "pages": pages}
    for op, key in (("READ", "vram_to_dram_gbps"), ("WRITE", "dram_to_vram_gbps")):
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            handle = host_side.initialize_xfer(op, local_descs, remote_descs, remote)
            t0 = time.perf_counter()
            try:
                _wait(host_side, handle, time.monotonic() + timeout_s)
                gpu_side.get_new_notifs()  # the passive side's progress
            finally:
                host_side.release_xfer_handle(handle)
            times.append(time.perf_counter() - t0)
        out[key] = pages * page_bytes / sorted(times[1:])[len(times[1:]) // 2] / 1e9
    host_side.remove_remote_agent(remote)
    return out
