"""The load check: 8 client processes x 10 calls over the socket against 16 contexts, every reply equal to
one process making the same calls (`workbench bench llms --tables load` runs 8 x 200)."""
from dataclasses import replace

import pytest

from workbench.errors import WorkbenchError
from workbench.kvcache.loadtest import (budget_bytes, check_replies, plan_calls, reference_replies, run_load,
                                        served)
from workbench.models.decoder import load_decoder

CLIENTS, CALLS, CONTEXTS, MEMORY_MB = 8, 10, 16, 2.0          # 2 MB holds a few contexts: calls evict and reload
pytestmark = pytest.mark.xdist_group("kvcache-loadtest")     # one worker runs the module's load check, once


@pytest.fixture(scope="module")
def load(tmp_path_factory):
    plans = plan_calls(CLIENTS, CALLS, CONTEXTS, prompt_words=6)
    reports = []
    with served(tmp_path_factory.mktemp("swap"), MEMORY_MB) as address:
        result = run_load(address, plans, max_new_tokens=2, progress=lambda done, total: reports.append((done, total)))
    reference = reference_replies(plans, result, memory_budget_bytes=budget_bytes(MEMORY_MB), model=load_decoder())
    return plans, result, reference, reports


@pytest.mark.integration
def test_eight_clients_lose_and_mix_up_nothing(load):
    plans, result, reference, reports = load
    assert check_replies(plans, result, reference) == []
    assert reports and all(total == CLIENTS * CALLS for _, total in reports)          # progress every 5 s
    assert [d for d, _ in reports] == sorted(d for d, _ in reports) and reports[-1][0] <= CLIENTS * CALLS
    assert len(result.replies) == CLIENTS * CALLS and result.errors == ()
    assert sorted(r.tick for r in result.replies) == list(range(1, CLIENTS * CALLS + 1))
    assert {(r.client, r.context) for r in result.replies} == {(c, k) for c in range(CLIENTS) for k in range(2)}
    assert sum(r.switch_s > 0 for r in result.replies) and result.calls_per_s > 0
    served_order = [r.client for r in result.replies]                # calls queued fairly: clients take turns
    assert min(len(set(served_order[i:i + CLIENTS])) for i in range(len(served_order) - CLIENTS + 1)) >= CLIENTS // 2


@pytest.mark.integration
def test_the_check_catches_a_mixed_up_reply_and_a_lost_one(load):
    plans, result, reference, _ = load
    other = next(r for r in result.replies if r.client != 0 and r.text != reference[(0, 0)])
    mixed = replace(result, replies=tuple(replace(r, text=other.text) if (r.client, r.index) == (0, 0) else r
                                          for r in result.replies))
    problems = check_replies(plans, mixed, reference)
    assert len(problems) == 1 and problems[0].startswith("client 0 call 0 (context ")
    assert "one process making the same calls got" in problems[0]
    lost = replace(result, replies=tuple(r for r in result.replies if (r.client, r.index) != (3, 4)))
    assert check_replies(plans, lost, reference) == ["client 3 call 4 got no reply"]
    wrong_context = replace(result, replies=tuple(replace(r, context=1 - r.context) if (r.client, r.index) == (5, 0)
                                                  else r for r in result.replies))
    assert any("came back for context" in p for p in check_replies(plans, wrong_context, reference))


def test_a_load_plan_gives_every_client_contexts_of_its_own():
    plans = plan_calls(3, 5, 7, texts={s: ["one two three four five six seven"]
                                       for s in ("review", "headline", "summary")})
    assert [1 + max(c.context for c in p) for p in plans] == [3, 2, 2]
    with pytest.raises(WorkbenchError, match="every client holds a context of its own"):
        plan_calls(4, 5, 3)
