"""Synthetic workloads with real prefix structure, written as Mooncake rows plus `session`, `ttl_s`, `tenant`.

A prompt is a list of content pieces `(piece_id, tokens)`. Block i of a prompt is identified by its parent
block and by exactly which piece ranges it covers, so two prompts share block i only if they share every
token up to the end of that block: the prefix chaining Mooncake's `hash_ids` have. The tenant is part of every
block's identity, so tenants never share a hash id even when their content is the same.

Kinds
- chat: sessions of turns; each turn resends system prompt + history + the new user message; think times
  between turns; rows carry the session's cache_control TTL.
- agent: loops that resend a growing transcript (tool output + model output per step), short gaps.
- rag: a shared system prompt + k documents drawn by Zipf popularity + a question; no sessions.
- tenants: many tenants picked by Zipf popularity, each with its own system prompts; one-shot requests.
- tenant-chat: chat sessions of a few tenants whose sizes follow Zipf (by default 12 tenants, one system prompt
  each): a fleet's load balance and its cache affinity pull against each other, since routing every session of
  the biggest tenant to the replica holding its system prompt overloads that replica. The builder is chat's; the
  kind is its defaults (`KIND_DEFAULTS`).
- coding-agent: agent's tool loops, where some steps delegate to sub-agents, as coding agents do (Claude Code's
  Agent tool): one to three sub-agents start at once, each with a fresh context (its type's fixed system prompt
  and tools, then a brief written for it), run their own short tool loops, and report back; the parent resumes
  with their reports as one tool result once the last one is done. The parent's transcript is idle meanwhile
  and comes back after a longer, predictable pause: what matters is *when* a chain returns.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

from benchmarks.arrivals import LengthSampler, arrival_times

Piece = Tuple[Hashable, int]
KINDS = ("chat", "agent", "rag", "tenants", "tenant-chat", "coding-agent")
# what a kind sets unless the command line does: tenants, and system prompts per tenant
KIND_DEFAULTS = {"chat": {"tenants": 1}, "agent": {"tenants": 1}, "rag": {"tenants": 1},
                 "tenants": {"tenants": 100}, "tenant-chat": {"tenants": 12, "system_prompts": 1},
                 "coding-agent": {"tenants": 1}}
SUBAGENT_TYPES = 3  # fixed sub-agent system prompts per tenant (Claude Code ships Explore, Plan, general-purpose)
DELEGATION_P = 0.1  # chance that a coding agent's step hands work to sub-agents


class BlockIds:
    """Interns (tenant, parent id, block content) -> a new integer id, in first-seen order."""

    def __init__(self, block_tokens: int = 512):
        self.block_tokens = block_tokens
        self._ids: Dict[Hashable, int] = {}

    def hash_ids(self, tenant: str, pieces: Sequence[Piece]) -> List[int]:
        bt = self.block_tokens
        out: List[int] = []
        parent: Optional[int] = None
        sig: List[Tuple[Hashable, int, int]] = []
        room = bt
        for piece_id, n in pieces:
            start = 0
            while start < n:
                take = min(room, n - start)
                sig.append((piece_id, start, start + take))
                start += take
                room -= take
                if room == 0:
                    parent = self._intern(tenant, parent, sig)
                    out.append(parent)
                    sig, room = [], bt
        if sig:
            out.append(self._intern(tenant, parent, sig))
        return out

    def _intern(self, tenant, parent, sig) -> int:
        return self._ids.setdefault((tenant, parent, tuple(sig)), len(self._ids))


@dataclass(frozen=True)
class GenConfig:
    seed: int = 0
    sessions: int = 200  # chat, agent
    requests: int = 2000  # rag, tenants
    tenants: int = 1
    zipf: float = 1.0
    system_prompts: int = 4  # per tenant
    arrivals: str = "poisson"
    rate: float = 0.5  # new sessions (or requests) per second, for poisson
    time_scale: float = 1.0  # multiplies Azure gaps
    lengths: str = ""  # "" (log-normal) or an Azure trace name for user/output lengths
    think_s: float = 60.0  # mean pause between turns (chat) / steps (agent: a tenth of it)
    ttl_s: Optional[float] = 300.0
    docs: int = 500  # rag
    docs_per_request: int = 3
    block_tokens: int = 512


def _zipf_weights(n: int, a: float) -> List[float]:
    return [1.0 / (k ** a) for k in range(1, n + 1)]


class _Gen:
    def __init__(self, cfg: GenConfig):
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.lengths = LengthSampler(self.rng, cfg.lengths)
        self.ids = BlockIds(cfg.block_tokens)
        self.rows: List[Tuple[float, int, dict]] = []
        self._tenant_w = _zipf_weights(cfg.tenants, cfg.zipf)
        self._fixed_len = {}

    def tenant(self) -> str:
        return f"t{self.rng.choices(range(self.cfg.tenants), weights=self._tenant_w)[0]}"

    def system_piece(self, tenant: str) -> Piece:
        return self.fixed_piece(("sys", tenant, self.rng.randrange(self.cfg.system_prompts)), 500, 4000)

    def fixed_piece(self, key: Hashable, low: int, high: int) -> Piece:
        """A prompt that is the same every time it is sent: its length is drawn once."""
        if key not in self._fixed_len:
            self._fixed_len[key] = self.rng.randint(low, high)
        return key, self._fixed_len[key]

    def step_gap(self) -> float:
        """An agent's pause between two steps: a tool runs (seconds; a tenth of the think time on average)."""
        return 0.5 + self.rng.expovariate(10 / self.cfg.think_s)

    def emit(self, t_s: float, tenant: str, pieces: Sequence[Piece], out_tokens: int, session=None, ttl=None):
        n_in = sum(n for _, n in pieces)
        row = {
            "timestamp": int(round(t_s * 1000)),
            "input_length": n_in,
            "output_length": out_tokens,
            "hash_ids": self.ids.hash_ids(tenant, pieces),
            "session": session,
            "ttl_s": ttl,
            "tenant": tenant,
        }
        self.rows.append((row["timestamp"], len(self.rows), row))

    def starts(self, n: int) -> List[float]:
        return arrival_times(self.cfg.arrivals, n, self.rng, self.cfg.rate, self.cfg.time_scale)

    def sorted_rows(self) -> List[dict]:
        return [r for _, _, r in sorted(self.rows, key=lambda x: (x[0], x[1]))]


def _chat(g: _Gen) -> None:
    for s, start in enumerate(g.starts(g.cfg.sessions)):
        tenant, sid = g.tenant(), f"chat-{s}"
        pieces = [g.system_piece(tenant)]
        t = start
        turns = min(20, 1 + int(g.rng.expovariate(1 / 4.0)))
        for turn in range(turns):
            pieces.append((("user", sid, turn), g.lengths.user_tokens(cap=2000)))
            out = g.lengths.output_tokens()
            g.emit(t, tenant, pieces, out, session=sid, ttl=g.cfg.ttl_s)
            pieces.append((("asst", sid, turn), out))
            t += g.rng.expovariate(1 / g.cfg.think_s)


def _agent(g: _Gen, delegation_p: float = 0.0) -> None:
    """Tool loops; with `delegation_p`, the chance that a step hands its work to sub-agents (coding-agent)."""
    for s, start in enumerate(g.starts(g.cfg.sessions)):
        tenant, sid = g.tenant(), f"agent-{s}"
        pieces = [g.system_piece(tenant), (("tools", tenant), 3000), (("task", sid), g.lengths.user_tokens(1500))]
        t = start
        for step in range(g.rng.randint(5, 40)):
            out = g.rng.randint(30, 400)
            g.emit(t, tenant, pieces, out, session=sid, ttl=g.cfg.ttl_s)
            pieces.append((("call", sid, step), out))
            # sub-agents start together and the parent waits; no draw at 0, so agent traces keep their bytes
            if delegation_p and g.rng.random() < delegation_p:
                begin = t + g.step_gap()
                runs = [_subagent(g, tenant, f"{sid}/{step}.{j}", begin) for j in range(g.rng.randint(1, 3))]
                pieces.append((("reports", sid, step), sum(report for _, report in runs)))
                t = max(end for end, _ in runs)
            else:
                pieces.append((("result", sid, step), g.rng.randint(100, 4000)))
            t += g.step_gap()


def _subagent(g: _Gen, tenant: str, sid: str, t: float) -> Tuple[float, int]:
    """One sub-agent's tool loop from `t`: (when it reports, its report's tokens)."""
    kind = g.rng.randrange(SUBAGENT_TYPES)
    pieces = [g.fixed_piece(("subagent", tenant, kind), 800, 3000), (("subtools", tenant, kind), 2000),
              (("brief", sid), g.rng.randint(100, 1500))]
    for step in range(g.rng.randint(3, 12)):
        out = g.rng.randint(30, 300)
        g.emit(t, tenant, pieces, out, session=sid, ttl=g.cfg.ttl_s)
        pieces.append((("call", sid, step), out))
        pieces.append((("result", sid, step), g.rng.randint(100, 3000)))
        t += g.step_gap()
    return t, g.rng.randint(200, 2000)


def _rag(g: _Gen) -> None:
    weights = _zipf_weights(g.cfg.docs, g.cfg.zipf)
    doc_len = {}
    for r, t in enumerate(g.starts(g.cfg.requests)):
        tenant = g.tenant()
        pieces = [g.system_piece(tenant)]
        chosen: List[int] = []
        while len(chosen) < min(g.cfg.docs_per_request, g.cfg.docs):
            d = g.rng.choices(range(g.cfg.docs), weights=weights)[0]
            if d not in chosen:
                chosen.append(d)
        for d in chosen:  # ordered by relevance: the most popular match tends to come first
            doc_len.setdefault(d, g.rng.randint(300, 3000))
            pieces.append((("doc", d), doc_len[d]))
        pieces.append((("question", r), g.rng.randint(20, 300)))
        g.emit(t, tenant, pieces, g.lengths.output_tokens(), session=None, ttl=None)


def _tenants(g: _Gen) -> None:
    for r, t in enumerate(g.starts(g.cfg.requests)):
        tenant = g.tenant()
        pieces = [g.system_piece(tenant), (("query", r), g.lengths.user_tokens(cap=3000))]
        g.emit(t, tenant, pieces, g.lengths.output_tokens(), session=None, ttl=g.cfg.ttl_s)


_BUILDERS = {"chat": _chat, "agent": _agent, "rag": _rag, "tenants": _tenants, "tenant-chat": _chat,
             "coding-agent": lambda g: _agent(g, DELEGATION_P)}


def generate_rows(kind: str, cfg: GenConfig) -> List[dict]:
    if kind not in _BUILDERS:
        raise ValueError(f"unknown workload {kind!r}; choose one of {', '.join(KINDS)}")
    if cfg.tenants < 1 or cfg.system_prompts < 1 or cfg.docs < 1:
        raise ValueError("tenants, system_prompts and docs must be at least 1")
    g = _Gen(cfg)
    _BUILDERS[kind](g)
    return g.sorted_rows()
