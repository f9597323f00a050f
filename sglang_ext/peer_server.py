"""`python -m sglang_ext.peer_server`: the documented entry point of the peer block server.

The server itself lives in `tiers.peer` (protocol, store, server, client), which imports neither sglang nor
torch, so a host that only lends DRAM runs it with numpy, xxhash, psutil and nixl alone (`python -m tiers.peer.server`).
"""

import sys

from tiers.peer.server import main

if __name__ == "__main__":
    sys.exit(main())
