"""A session turn that SGLang's scheduler refuses leaves the session as it was.

SGLang 0.5.20 adds a turn to its session (`Session.create_req`: a node under the request's id, a child of the turn
it continues) before the scheduler's own checks run, and a check that then refuses the request (a prompt that, with
the session's history, is longer than the context; ...) only marks it aborted, its prompt replaced by one dummy
token. The client gets a 400, but the node stays: a later turn continuing from the refused request's id was served,
its history silently that one token (an audit, 2026-12-07). `forget_refused_turn`, an AROUND hook on
`Scheduler.handle_generate_request`, removes that node once SGLang has handled the request, so continuing from the
refused id is the 400 of an id the session never had, as for any unknown request id. The request itself still
finishes as SGLang finishes it (aborted); the session's close and reaping iterate its nodes and never look one up by
id, so a node gone early is never missed. Left as it is: a refused turn with `replace` has already dropped the
turns it was to replace (SGLang clears them first), and a streaming session, which keeps only its last finished
turn, adds a node only when a turn finishes.

Threading: runs on the scheduler's thread, like the method it wraps.
"""

from __future__ import annotations

TARGET = "sglang.srt.managers.scheduler.Scheduler.handle_generate_request"


def forget_refused_turn(original, scheduler, recv_req, **kwargs):
    result = original(scheduler, recv_req, **kwargs)
    params = getattr(recv_req, "session_params", None)
    session_id = getattr(params, "id", None)
    sessions = scheduler.session_controller
    if session_id is None or session_id not in sessions:
        return result
    session = sessions.get(session_id)
    node = session.req_nodes.get(recv_req.rid)
    if node is not None and refused(node.req):
        del session.req_nodes[recv_req.rid]
        if node.parent is not None and node in node.parent.children:
            node.parent.children.remove(node)
    return result


def refused(req) -> bool:
    """Whether the scheduler refused `req` as it arrived (marked to finish, or finished, with an abort)."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    return isinstance(req.finished_reason, FINISH_ABORT) or isinstance(getattr(req, "to_finish", None), FINISH_ABORT)
