"""The waiting queue takes turns between requests: a request of many prompts (each one job) cannot keep a request
that came after it waiting until all of its prompts have run."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from attnkit.serve.waiting import QueueFull, WaitingQueue


@dataclass(eq=False)
class Job:
    name: str
    owner: object = None
    cancelled: threading.Event = field(default_factory=threading.Event)


def drained(queue: WaitingQueue) -> list[str]:
    names = []
    while (job := queue.pop_if(lambda job: True)) is not None:
        names.append(job.name)
    return names


def test_requests_take_turns_and_each_keeps_its_own_order():
    queue, big, small, other = WaitingQueue(16), object(), object(), object()
    for i in range(4):
        queue.put(Job(f"big{i}", big))
    queue.put(Job("small0", small))
    queue.put(Job("alone"))  # a job of no request in particular is a request of its own
    queue.put(Job("small1", small))
    queue.put(Job("other0", other))
    assert drained(queue) == ["big0", "small0", "alone", "other0", "big1", "small1", "big2", "big3"]


def test_a_request_that_arrives_while_another_runs_waits_one_turn():
    queue, big, small = WaitingQueue(16), object(), object()
    for i in range(4):
        queue.put(Job(f"big{i}", big))
    assert queue.pop_if(lambda job: True).name == "big0"
    queue.put(Job("small0", small))
    assert drained(queue) == ["small0", "big1", "big2", "big3"]


def test_a_head_that_does_not_fit_stays_first_and_cancelled_jobs_are_set_aside():
    queue, big, small = WaitingQueue(4), object(), object()
    jobs = [Job("big0", big), Job("big1", big), Job("small0", small), Job("alone")]
    for job in jobs:
        queue.put(job)  # 4 places: big's two, small's and alone's
    assert queue.pop_if(lambda job: False) is None and queue.head().name == "big0"
    jobs[0].cancelled.set()
    assert queue.head().name == "big1"  # big0 is set aside; big's turn is not taken until one of its jobs joins
    queue.put(Job("small1", small))  # big0's place, freed
    with pytest.raises(QueueFull):
        queue.put(Job("late"))
    assert [job.name for job in queue.take_set_aside()] == ["big0"]
    assert [job.name for job in queue.take_all()] == ["big1", "small0", "small1", "alone"] and len(queue) == 0


def test_a_request_of_many_prompts_holds_half_the_places_and_others_take_the_rest():
    """A request of as many prompts as the queue holds is taken whole, but its prompts hold half the places (`share`);
    the rest wait behind them holding none, so other requests still find the other half. A place is freed only when
    a job that holds one leaves without one behind it to take it over."""
    queue, a, b, c = WaitingQueue(8), object(), object(), object()
    assert queue.share == 4
    for i in range(8):
        queue.put(Job(f"a{i}", a))  # each taken: before, the queue was full and every other request got 429
    queue.put(Job("b0", b))
    for i in range(3):
        queue.put(Job(f"c{i}", c))
    for late in (Job("d0"), Job("c3", c)):  # 4 + 1 + 3 places held: a job that needs one is refused
        with pytest.raises(QueueFull):
            queue.put(late)
    assert len(queue) == 12
    assert queue.pop_if(lambda job: True).name == "a0"  # a4 takes over its place: still none free
    with pytest.raises(QueueFull):
        queue.put(Job("d0"))
    assert queue.pop_if(lambda job: True).name == "b0"  # b's place is freed
    queue.put(Job("d0"))
    assert drained(queue) == ["c0", "a1", "d0", "c1", "a2", "c2", "a3", "a4", "a5", "a6", "a7"]
    assert [WaitingQueue(limit).share for limit in (1, 2, 3, 64)] == [1, 1, 1, 32]


def test_a_request_of_many_prompts_does_not_hold_a_later_one_until_it_ends(tmp_path):
    """Served: six prompts of three choices each, on a server that decodes four rows at once (one request takes at most
    three), then a one-prompt request of two choices, which fits beside none of them: it is answered while the first
    still runs (before, it waited for all six prompts)."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
    from serve_helpers import running_server, tiny_run

    ended: list[str] = []
    with running_server(tiny_run(tmp_path), max_batch=4, timeout=120) as (url, app):
        def ask(name: str, body: dict) -> None:
            reply = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
            ended.append(f"{name} {reply.status_code}")

        many = threading.Thread(target=ask, args=("many", {"prompt": ["ab"] * 6, "n": 3, "max_tokens": 40,
                                                           "ignore_eos": True}))
        many.start()
        while app.state.scheduler.batch is None and many.is_alive():  # the first prompt has joined
            threading.Event().wait(0.01)
        ask("one", {"prompt": "ab", "n": 2, "max_tokens": 2})
        many.join(120)
    assert ended == ["one 200", "many 200"]


def test_a_request_given_the_id_of_one_served_and_gone_keeps_its_turn():
    queue, first = WaitingQueue(16), object()
    stale = id(first)
    queue.put(Job("first0", first))
    del first
    assert queue.pop_if(lambda job: True).name == "first0"  # first took the last turn and is gone with its job
    owners = [object()]
    while id(owners[-1]) != stale and len(owners) < 10_000:  # CPython gives a freed object's id to a later one
        owners.append(object())
    if id(owners[-1]) != stale:
        pytest.skip("this interpreter gave the freed request's id to no later object")
    queue.put(Job("later0", owners[-1]))
    queue.put(Job("next0", object()))
    assert drained(queue) == ["later0", "next0"]


def test_a_request_passed_over_keeps_its_turn_and_a_later_head_that_does_not_fit_ends_the_look():
    """`pop_if(passes=)` (a request whose prompts hold its share of the rows): that request is passed over, keeping
    its place, and the next request's head joins, a cancelled head met on the way set aside; a head after it that
    does not fit ends the look, as the first request's would."""
    queue, big, small, other = WaitingQueue(16), object(), object(), object()
    for i in range(3):
        queue.put(Job(f"big{i}", big))
    gone = Job("small0", small)
    for job in (gone, Job("small1", small), Job("other0", other)):
        queue.put(job)
    gone.cancelled.set()

    def at_share(job: Job) -> bool:
        return job.owner is big

    assert queue.pop_if(lambda job: True, passes=at_share).name == "small1"
    assert [job.name for job in queue.take_set_aside()] == ["small0"]
    assert queue.pop_if(lambda job: job.name != "other0", passes=at_share) is None
    assert queue.head().name == "big0"
    assert drained(queue) == ["big0", "other0", "big1", "big2"]


def test_a_request_of_as_many_prompts_as_the_queue_holds_leaves_other_clients_room(tmp_path):
    """Served with --max-queue 8 while the batch takes nobody (the model is held): a request of 8 prompts is queued
    holding 4 places, and two other clients' requests of 1 and 3 prompts take the other 4 (before, the 8 prompts filled
    the queue and every other client got 429 until they had joined the batch). A request that then needs a place gets
    429 with Retry-After; one of more prompts than --max-queue, 400 naming the limit. Every queued one is answered."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
    from serve_helpers import running_server, tiny_run

    answers: dict[str, object] = {}
    with running_server(tiny_run(tmp_path), max_queue=8, max_batch=4, timeout=60) as (url, app):
        scheduler = app.state.scheduler

        def ask(name: str, prompts: list[str]) -> None:
            answers[name] = httpx.post(f"{url}/v1/completions", json={"prompt": prompts, "max_tokens": 2}, timeout=60)

        def waiting(count: int) -> int:  # the prompts waiting, once `count` do (or 30 s have passed)
            for _ in range(1500):
                if scheduler.queue_length >= count:
                    break
                threading.Event().wait(0.02)
            return scheduler.queue_length

        clients = [threading.Thread(target=ask, args=(name, ["ab"] * size)) for name, size in
                   (("big", 8), ("one", 1), ("three", 3))]
        scheduler.lock.acquire()  # no prompt joins the batch while it is held
        try:
            clients[0].start()
            assert waiting(8) == 8
            for client in clients[1:]:
                client.start()
            assert waiting(12) == 12, {name: answer.status_code for name, answer in answers.items()}
            ask("late", ["ab"])
        finally:
            scheduler.lock.release()
        for client in clients:
            client.join(60)
        ask("too many", ["ab"] * 9)
    late, too_many = answers.pop("late"), answers.pop("too many")
    assert late.status_code == 429 and late.headers["retry-after"] == "1", late.text
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "prompt"
    assert "--max-queue" in too_many.json()["error"]["message"]
    assert {name: (answer.status_code, len(answer.json()["choices"])) for name, answer in answers.items()} == {
        "big": (200, 8), "one": (200, 1), "three": (200, 3)}
