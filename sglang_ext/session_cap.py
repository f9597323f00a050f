"""A bound on the sessions clients hold open in the scheduler (`--tier-max-open-sessions`).

SGLang's scheduler keeps every session that `/open_session` opened until `/close_session`, or until its idle
`timeout` passes if the client gave one (reaped about once a second); nothing bounds how many are open. A client that
opens sessions and never closes them grows the scheduler's memory without end. `refuse_over_cap` makes an AROUND
hook on `Scheduler.open_session` that answers an open past the cap as SGLang answers an id already in use: a failed
open (the HTTP handler's 400, "Failed to open the session ..."), no session made, and the scheduler logs why. Every
rank holds the same sessions, so every rank refuses alike; the first rank answers, as SGLang's own `open_session`
does (the HTTP handler waits for that answer, with no deadline, so a refusal must still answer).
"""

from __future__ import annotations

import logging
from typing import Callable

logger = logging.getLogger(__name__)


def refuse_over_cap(cap: int) -> Callable:
    """The hook for `Scheduler.open_session` (`fn(original, scheduler, recv_req)`) that refuses past `cap`."""
    from sglang.srt.managers.io_struct import OpenSessionReqOutput

    def open_session(original, scheduler, recv_req):
        if len(scheduler.session_controller.sessions) < cap:
            return original(scheduler, recv_req)
        logger.warning("open_session refused: %d sessions are open, the cap (--tier-max-open-sessions)", cap)
        ps = scheduler.ps
        if ps.pp_rank == 0 and ps.tp_rank == 0 and ps.attn_cp_rank == 0:  # the rank SGLang's own answer comes from
            return OpenSessionReqOutput(session_id=recv_req.session_id, success=False)
        return None

    return open_session
