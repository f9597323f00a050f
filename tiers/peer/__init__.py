"""Peer block server: a DRAM pool of KV pages that other hosts read and write over NIXL.

    python -m sglang_ext.peer_server --host 127.0.0.1 --port P --capacity-gb X [--policy lru]

Modules: `protocol` (constants, keys, checksums), `store` (PageStore: index, slots, eviction), `server`
(PeerServer and the command line), `client` (PeerClient), `overlap` (checksums computed while the next
chunk of pages moves). None imports sglang or torch: a DRAM host runs the peer with numpy, nixl, xxhash
and psutil alone.

Design
- The pool is one registered byte array cut into fixed-size slots, one page per slot. The slot size is
  set by `--page-bytes` or by the first client's hello ("formatted on first use"); a client with another
  page size is refused, and treats the peer as unavailable.
- A page is stored under a scoped key (namespace, key). Keys are opaque strings built by the client
  (SGLang's page hashes, already seeded with the tenant's cache_salt/extra_key); the namespace names the
  model, dtype, page layout and rank. The index is keyed by the pair, so a lookup in one namespace never
  finds a page written in another.
- Integrity: a page's checksum is XXH3-128 of (scoped key || page bytes), seeded by the scoped key
  (protocol.page_checksum). The writer computes it; the server recomputes it at commit and drops the page
  on mismatch; the reader recomputes it after its READ and reports a mismatch, upon which the server
  re-verifies and drops a page that really is corrupt. Because the key is inside the checksum, bytes
  served from the wrong slot (a race with eviction, a late write, a bug) fail too.
- Eviction: a `tiers` policy in flat mode (entries = slot numbers, size 1, parent None). Slots being
  written, and slots a reader looked up moments ago (a short read lease), are protected. When the policy
  offers no victim or refuses admission, the page is not stored: "full" is an answer, not an error.
- Data plane: one-sided NIXL READ/WRITE by the client into/out of the pool; the server only polls NIXL
  progress (fast for a few seconds after each request, slowly when idle; no spinning progress thread).

Control protocol (transfer.control frames: JSON object + optional blob; one response per request)
  request {"op": ..., ...}                     -> response {"ok": true, ...} or {"ok": false, "error": msg}
  hello   {"version", "page_bytes", "client"}  -> {"agent", "pool_addr", "pool_bytes", "page_bytes",
                                                   "capacity_pages"}, blob = the server's NIXL metadata
  alloc   {"ns", "keys"}                       -> {"slots": [{"state": "alloc", "offset": o} | {"state":
                                                   "exists"} | {"state": "busy"} | {"state": "full"}]}
          then the client WRITEs page i to pool_addr + offset_i, within the write lease
  commit  {"ns", "keys", "checksums"}          -> {"stored": [bool]}   (false: checksum mismatch / lost slot)
  lookup  {"ns", "keys", "pin"}                -> {"offsets": [o | null], "checksums": [c | null]}
          (pin=true grants a read lease) then the client READs and checks each checksum. Each key is
          counted once: pin=false (the client's exists) counts only misses; the pin=true read that
          follows counts the hit and refreshes recency. Two lists, item i for key i: 512 objects took
          4x as long to encode as the two lists
  report  {"ns", "keys"}                       -> {"dropped": [bool]}  (client saw a checksum mismatch)
  stats   {}                                   -> {"stats": {...}, "server": {connections, refused, ...}}
  corrupt {"ns", "key"}                        -> {}   test hook, only with --enable-test-hooks
Offsets are relative to pool_addr. Every socket operation has a deadline on both sides.

Every field is type- and range-checked (`requests`), page sizes are bounded (`store.page_size_problem`),
connections are capped and time out when idle (`server`): the limits are in those modules' notes.

Threading: one thread accepts, one tracked thread per connection serves requests, one polls NIXL progress.
`PageStore` holds all index state under one non-reentrant lock; hashing page bytes happens outside it
(the slots involved are protected by their lease meanwhile).
"""
