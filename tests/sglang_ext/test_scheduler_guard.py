"""The last check before the scheduler (scheduler_guard): what SGLang 0.5.20's own validation passes and its scheduler
then stops on is refused, whichever route built the request; what the model takes passes. The server-side
counterpart (each route, a live scheduler) is tests/reliability/test_bad_input_fuzz.py."""

from array import array
from types import SimpleNamespace

import pytest

from sglang.srt.sampling.sampling_params import SamplingParams
from sglang_ext.scheduler_guard import (
    RefusedRequest, batches_checked_whole, check_tokenized, guard, refuse_what_sglang_refuses)

VOCAB = 100


def tokenized(ids=(1, 2, 3), return_logprob=False, top_logprobs_num=0, logprob_start_len=-1, **sampling):
    """A TokenizedGenerateReqInput's fields the guard reads, with SGLang's own SamplingParams, verified as SGLang
    verifies it just before the guard."""
    params = SamplingParams(**sampling)
    params.verify(VOCAB)
    return SimpleNamespace(input_ids=array("q", ids), sampling_params=params, return_logprob=return_logprob,
                           top_logprobs_num=top_logprobs_num, logprob_start_len=logprob_start_len)


@pytest.mark.parametrize("obj", [
    tokenized(ids=(1, VOCAB)), tokenized(ids=(-1, 2)),  # a completion prompt of floats, coerced to these
    tokenized(top_k=2**31), tokenized(top_k=10**12),  # SGLang's sampling tensors are int32
    tokenized(min_new_tokens=2**31, max_new_tokens=None),
    tokenized(max_new_tokens=2, min_new_tokens=1, stop_token_ids=[10**9]),  # indexes a vocabulary-wide tensor
    tokenized(stop_token_ids=[-5]),
    tokenized(sampling_seed=2**63),
    tokenized(return_logprob=True, top_logprobs_num=VOCAB + 1),
    tokenized(return_logprob=True, logprob_start_len=-2),
    tokenized(return_logprob=True, logprob_start_len=4),  # past the prompt: the scheduler's refusal, too late
    tokenized(ids=()),  # /v1/score with an empty query and item: the model's forward raised on no tokens
])
def test_what_the_scheduler_would_stop_on_is_refused(obj):
    with pytest.raises(RefusedRequest):
        check_tokenized(obj, VOCAB)


@pytest.mark.parametrize("obj", [
    tokenized(), tokenized(ids=(0, VOCAB - 1)), tokenized(top_k=-1), tokenized(top_k=2**31 - 1),
    tokenized(max_new_tokens=None), tokenized(stop_token_ids=[0, VOCAB - 1], min_new_tokens=1),
    tokenized(sampling_seed=2**63 - 1), tokenized(return_logprob=True, top_logprobs_num=VOCAB, logprob_start_len=0),
    tokenized(return_logprob=True, logprob_start_len=3),
    tokenized(return_logprob=False, top_logprobs_num=10**9),  # no logprobs asked for: the number is never used
    SimpleNamespace(input_ids=None, sampling_params=None),  # embeddings given as vectors: no ids to judge
])
def test_what_the_model_takes_passes(obj):
    check_tokenized(obj, VOCAB)


def test_no_new_tokens_pass_within_a_session():
    """A request in a session continues the session's tokens: an empty prompt of its own is the scheduler's."""
    obj = tokenized(ids=())
    obj.session_params = {"id": "s"}
    check_tokenized(obj, VOCAB)


def test_the_hook_returns_what_sglang_built_and_refuses_before_it_is_sent():
    manager = SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB))
    good, bad = tokenized(), tokenized(top_k=2**40)
    assert guard(lambda m, *a, **k: good, manager, "obj") is good
    with pytest.raises(RefusedRequest, match="top_k"):
        guard(lambda m, *a, **k: bad, manager, "obj")
    assert issubclass(RefusedRequest, ValueError)  # what SGLang's routes answer with a 400
    untyped = tokenized()
    untyped.sampling_params.sampling_seed = "7"  # an Ollama option SGLang passes on as it came
    with pytest.raises(RefusedRequest, match="wrong type"):
        guard(lambda m, *a, **k: untyped, manager, "obj")


def test_a_generation_to_an_embedding_model_is_refused_and_an_embedding_is_checked_for_its_prompt():
    """SGLang refuses an embedding request to a generative model, not a generation to an embedding model (its
    scheduler stopped on one); an embedding's prompt is checked as a generation's is."""
    embedder = SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB), is_generation=False)
    with pytest.raises(RefusedRequest, match="embedding model"):
        guard(lambda m, *a, **k: tokenized(), embedder, "obj")
    embedding = SimpleNamespace(input_ids=array("q", [1, 2]), sampling_params=SamplingParams())
    assert guard(lambda m, *a, **k: embedding, embedder, "obj") is embedding
    for ids in ((), (1, VOCAB)):
        with pytest.raises(RefusedRequest):
            check_tokenized(SimpleNamespace(input_ids=array("q", ids), sampling_params=SamplingParams()), VOCAB)


@pytest.mark.parametrize("raised", [ValueError("top_k must be -1 (disable) or at least 1, got 0."),
                                    TypeError("Unexpected keyword argument 'seed'")])
def test_what_sglangs_own_checks_raise_is_a_refusal(raised):
    """SGLang's own request checks in the tokenizer manager raise ValueError (answered with a 500 on Ollama's
    routes) or, on a field of the wrong name or type, TypeError (a 500 everywhere): both become RefusedRequest."""
    def sglang(_manager, *_args, **_kwargs):
        raise raised

    manager = SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB))
    for hook in (refuse_what_sglang_refuses, guard):
        with pytest.raises(RefusedRequest, match=str(raised).split()[0]):
            hook(sglang, manager, "obj")
    assert refuse_what_sglang_refuses(lambda m, *a: ("ran", a), manager, "obj") == ("ran", ("obj",))


def test_a_session_replace_without_a_rid_is_refused_and_with_one_passes():
    """SGLang 0.5.20 clears a whole session by deleting from the dict it iterates: the scheduler raised and stopped."""
    from sglang.srt.managers.io_struct import SessionParams

    obj = tokenized()
    obj.session_params = SessionParams(id="s", replace=True)
    with pytest.raises(RefusedRequest, match="rid"):
        check_tokenized(obj, VOCAB)
    obj.session_params = SessionParams(id="s", rid="r1", replace=True)
    check_tokenized(obj, VOCAB)


@pytest.mark.parametrize("name", ["cache_salt", "extra_key"])
def test_a_cache_key_longer_than_a_name_is_refused(name):
    """Both are kept with every entry they key; an 8 MB one was held per 2-token entry (eviction counts tokens)."""
    obj = tokenized()
    setattr(obj, name, "k" * 256)
    check_tokenized(obj, VOCAB)
    setattr(obj, name, "k" * 257)
    with pytest.raises(RefusedRequest, match=name):
        check_tokenized(obj, VOCAB)


def prompt(text="hi", input_ids=None, input_embeds=None, mm=False):
    return SimpleNamespace(text=text, input_ids=input_ids, input_embeds=input_embeds, contains_mm_input=lambda: mm)


@pytest.mark.parametrize("batch, dp_attention, mm_processor, whole", [
    ([prompt(), prompt("there")], False, None, True),
    ([prompt(), prompt(mm=True)], False, None, False),  # SGLang's batch path refuses images
    ([prompt(), prompt(text=None, input_ids=[1])], False, None, False),
    ([prompt(), prompt(text=["a", "b"])], False, None, False),  # a cross-encoder pair
    ([prompt(), prompt()], True, None, False),
    ([prompt(), prompt()], False, object(), False),
])
def test_a_text_batch_is_tokenized_and_checked_whole_before_any_of_it_is_sent(batch, dp_attention, mm_processor,
                                                                               whole):
    """SGLang's default sends a text batch's prompts one at a time, each checked just before it is sent, so a batch
    refused at its second prompt had its first computed and cached; its batch path checks all first."""
    manager = SimpleNamespace(server_args=SimpleNamespace(enable_dp_attention=dp_attention), mm_processor=mm_processor)
    assert batches_checked_whole(lambda *_: False, manager, len(batch), batch) is whole
    assert batches_checked_whole(lambda *_: True, manager, len(batch), batch) is True


def test_the_hook_refuses_a_session_another_salt_owns_whatever_route_built_the_request():
    """The check of session_owners sits where every route's request meets: /vertex_generate reached another
    tenant's session past a check on /generate's body alone (an audit, 2026-12-07)."""
    from sglang.srt.managers.io_struct import SessionParams
    from sglang_ext.session_owners import OWNERS

    manager = SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB))
    OWNERS.opened("guard-session")

    def in_session(salt):
        obj = tokenized()
        obj.session_params, obj.cache_salt = SessionParams(id="guard-session"), salt
        return obj

    first = in_session("tenant-a")
    assert guard(lambda m, *a, **k: first, manager, "obj") is first
    with pytest.raises(RefusedRequest, match="does not exist"):
        guard(lambda m, *a, **k: in_session("tenant-b"), manager, "obj")
    OWNERS.closed("guard-session")
