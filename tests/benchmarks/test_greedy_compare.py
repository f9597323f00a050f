"""greedy_compare: a split at a numerical tie is told apart from a different answer."""

from benchmarks.greedy_compare import TIE_NATS, compare, request_fields


def answer(ids, tops):
    """A /generate answer: `tops[j]` is {token: logprob} at output position j."""
    return {"output_ids": ids,
            "meta_info": {"output_top_logprobs": [[[lp, t, None] for t, lp in top.items()] for top in tops]}}


SAME = [{5: -0.1, 6: -2.0}, {7: -0.2, 8: -3.0}]


def test_equal_answers_are_equal():
    assert compare(answer([5, 7], SAME), answer([5, 7], SAME)).verdict == "equal"


def test_a_split_where_both_sides_rank_both_tokens_within_rounding_is_a_tie():
    mine = answer([5, 7, 9], SAME[:1] + [{7: -0.70, 8: -0.71}, {9: -0.1}])
    ref = answer([5, 8, 4], SAME[:1] + [{8: -0.69, 7: -0.72}, {4: -0.1}])
    c = compare(mine, ref)
    assert (c.verdict, c.position) == ("tie", 1) and c.gap_nats <= TIE_NATS


def test_a_split_far_from_a_tie_differs():
    mine = answer([5, 7], SAME)
    ref = answer([5, 8], SAME[:1] + [{8: -0.1, 7: -2.5}])
    c = compare(mine, ref)
    assert (c.verdict, c.position) == ("differs", 1) and c.gap_nats > TIE_NATS


def test_a_split_whose_other_token_is_outside_the_top_differs():
    mine = answer([5, 7], SAME)
    ref = answer([5, 9], SAME[:1] + [{9: -0.69, 7: -0.70}])  # the reference ties, but 9 is not in mine's top 2
    assert compare(mine, ref).verdict == "differs"


def test_answers_without_logprobs_or_of_other_lengths_differ():
    assert compare({"output_ids": [5, 7]}, {"output_ids": [5, 8]}).verdict == "differs"
    assert compare(answer([5, 7], SAME), answer([5], SAME[:1])).verdict == "differs"
    assert compare({"output_ids": [5, 7]}, {}).verdict == "differs"


def test_the_fields_asked_for_give_two_alternatives_per_position():
    assert request_fields() == {"return_logprob": True, "top_logprobs_num": 2}
