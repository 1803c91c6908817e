"""attnkit serve --draft: speculative decoding in the batching scheduler. Driven iteration by iteration, rows that
join at any round get the target's own greedy tokens, a request the draft rule cannot serve is decoded by the plain
rows beside (and joins while the speculative rows are full), a plain request ends while a long speculative one is
still running, the rounds are counted, cancelled and expired rows end at the next round, and a round that fails
and a close end their jobs and both batches; through a live server, greedy
texts equal the server's without a draft and `Pipeline.generate`, alone, streamed and from concurrent clients, and
/metrics shows the acceptance rate; a draft of another vocabulary is refused at start-up in one line."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from generate_models import tiny_model

from attnkit.generate import GREEDY, SamplingConfig, generate_tokens
from attnkit.generate.sampling import process_logits
from attnkit.generate.speculative import token_after_kept
from attnkit.serve.batching import Closed, GenerationJob, Scheduler
from attnkit.serve.speculative import SpeculativeScheduler

CONTEXT = 48
PROMPTS = ([1, 2, 3], [4, 5, 6, 7, 8, 9], [2], [5, 5, 5, 5, 5])


class Recorded:
    """A job, the tokens each choice got and the reasons it finished with."""

    def __init__(self, prompt: list[int], max_new: int, *, n: int = 1, sampling: SamplingConfig = GREEDY,
                 seed: int | None = None, stop_ids: frozenset[int] = frozenset()) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.reasons: list[str] | None = None
        self.job = GenerationJob(prompt=prompt, max_new_tokens=max_new, sampling=sampling, n=n, seed=seed,
                                 stop_ids=stop_ids, on_token=self._token, on_finish=self._finish)

    def _token(self, choice: int, token: int) -> bool:
        self.tokens[choice].append(token)
        return False

    def _finish(self, reasons: list[str]) -> None:
        self.reasons = reasons


@pytest.fixture(scope="module")
def models():
    target = tiny_model(max_seq_len=CONTEXT, position="rope", seed=2)[0]
    draft = tiny_model(max_seq_len=CONTEXT, position="rope", seed=3, n_layers=1)[0]
    return target, draft


def schedulers(target, draft, draft_tokens: int = 3, max_rows: int = 8) -> tuple[Scheduler, SpeculativeScheduler]:
    speculative = SpeculativeScheduler(target, draft, draft_tokens=draft_tokens, context_len=CONTEXT, pad_id=0,
                                       max_rows=max_rows)
    return Scheduler(target, context_len=CONTEXT, pad_id=0, max_rows=max_rows, speculative=speculative), speculative


def iterate(scheduler: Scheduler) -> None:
    """One turn of the scheduler's loop: a step of its plain rows, then a round of its speculative ones."""
    with torch.inference_mode():
        for part in scheduler.parts:
            part._iteration()


def drain(scheduler: Scheduler, limit: int = 300) -> None:
    for _ in range(limit):
        if all(part.batch is None and part.waiting.empty() for part in scheduler.parts):
            return
        iterate(scheduler)
    raise AssertionError(f"the jobs did not end within {limit} iterations")


def first_three(target, prompt: list[int], sampling: SamplingConfig) -> torch.Tensor:
    """The exact joint distribution (V ** 3,) of the first three tokens the target draws after `prompt`, the
    tokens (a, b, c) at a * V ** 2 + b * V + c."""
    vocab = target.lm_head.out_features

    def probs(prefixes: list[list[int]]) -> torch.Tensor:  # (N, V): the next token's distribution after each
        return process_logits(target(torch.tensor(prefixes)).logits[:, -1], sampling).softmax(-1).double()

    with torch.no_grad():
        first = probs([prompt])[0]
        second = probs([prompt + [a] for a in range(vocab)])  # (V, V)
        third = probs([prompt + [a, b] for a in range(vocab) for b in range(vocab)]).view(vocab, vocab, vocab)
        return (first[:, None, None] * second[:, :, None] * third).flatten()


@pytest.mark.parametrize("same", [True, False], ids=["draft-is-target", "other-draft"])
def test_rows_joining_at_any_round_get_the_targets_greedy_tokens(models, same):
    target, other = models
    scheduler, speculative = schedulers(target, target if same else other)
    jobs = [Recorded(prompt, 10 + i, n=2 if i == 1 else 1, stop_ids=frozenset({3}) if i == 3 else frozenset())
            for i, prompt in enumerate(PROMPTS)]
    scheduler.submit(jobs[0].job)
    scheduler.submit(jobs[1].job)
    iterate(scheduler)
    scheduler.submit(jobs[2].job)  # joins a running batch, which must grow (its rows were three)
    iterate(scheduler)
    scheduler.submit(jobs[3].job)
    drain(scheduler)
    assert scheduler.batch is None and not scheduler.tokens, "greedy requests were decoded by the plain rows"
    for recorded in jobs:
        job = recorded.job
        alone = generate_tokens(target, [job.prompt] * job.n, max_new_tokens=job.max_new_tokens,
                                context_len=CONTEXT, sampling=GREEDY, stop_ids=job.stop_ids)
        assert recorded.tokens == alone and recorded.reasons is not None and "error" not in recorded.reasons
    stats = speculative.speculation
    assert stats.drafted > 0 and stats.rounds > 0
    if same:  # the target drafting for itself: every draft is its own greedy choice
        assert stats.accepted == stats.drafted and stats.advanced > stats.rounds


def test_requests_the_draft_rule_cannot_serve_decode_in_the_plain_rows_as_without_a_draft(models):
    target, draft = models
    scheduler, speculative = schedulers(target, draft)
    penalised = SamplingConfig(temperature=0.0, presence_penalty=1.5)
    sampled = SamplingConfig(temperature=0.9)
    jobs = [Recorded([1, 2, 3], 8, sampling=penalised), Recorded([4, 5], 8, sampling=sampled, seed=7),
            Recorded([6, 7, 8], 8, sampling=sampled), Recorded([2, 2], 8)]
    for recorded in jobs:
        scheduler.submit(recorded.job)
    assert [speculative.takes(recorded.job) for recorded in jobs] == [False, False, True, True]
    drain(scheduler)
    plain = Scheduler(target, context_len=CONTEXT, pad_id=0, max_rows=8)  # the server without a draft
    again = [Recorded([1, 2, 3], 8, sampling=penalised), Recorded([4, 5], 8, sampling=sampled, seed=7)]
    for recorded in again:
        plain.submit(recorded.job)
    drain(plain)
    assert [r.tokens for r in jobs[:2]] == [r.tokens for r in again]
    assert len(jobs[2].tokens[0]) == 8 and jobs[2].reasons == ["length"]  # sampled, unseeded: drafted
    assert scheduler.tokens == 16 and speculative.tokens == 16  # two requests of 8 tokens each way


def test_sampled_rows_follow_the_targets_distribution_beside_greedy_rows():
    """Unseeded sampled rows speculate: the first two tokens (the second a round's first, with two drafts) are drawn
    as the target alone draws them (Leviathan et al.), while a greedy request in the same rounds gets its own text."""
    from scipy.stats import chisquare

    target = tiny_model(position="rope", vocab_size=6, seed=3)[0]
    draft = tiny_model(position="rope", vocab_size=6, seed=4, n_layers=1)[0]
    scheduler, speculative = schedulers(target, draft, draft_tokens=2, max_rows=72)
    prompt, sampling = [1, 4, 2], SamplingConfig(temperature=0.8)
    with torch.no_grad():  # the target's exact distribution of its first two new tokens, (V, V)
        first = process_logits(target(torch.tensor([prompt])).logits[:, -1], sampling).softmax(-1)[0]
        after = torch.tensor([prompt + [token] for token in range(6)])
        second = process_logits(target(after).logits[:, -1], sampling).softmax(-1)  # (V, V): given the first
        exact = (first[:, None] * second).flatten().double()
    torch.manual_seed(0)  # unseeded rows draw from torch's generator
    counts = torch.zeros(36, dtype=torch.float64)
    greedy = Recorded([5, 1], 6)
    scheduler.submit(greedy.job)
    for _ in range(20):
        sampled = Recorded(prompt, 4, n=64, sampling=sampling)
        scheduler.submit(sampled.job)
        drain(scheduler)
        for tokens in sampled.tokens:
            counts[tokens[0] * 6 + tokens[1]] += 1
    assert greedy.tokens == generate_tokens(target, [[5, 1]], max_new_tokens=6, context_len=CONTEXT)
    stats = speculative.speculation
    assert 0.05 < stats.acceptance_rate < 0.95 and scheduler.tokens == 0
    assert chisquare(counts, exact / exact.sum() * counts.sum()).pvalue > 1e-3


def test_sampled_rows_that_keep_different_drafts_follow_the_targets_distribution_over_three_tokens():
    """Rows of single-choice sampled requests in one batch keep different numbers of drafts in a round: the first
    three tokens of each (the prefill's, then a round of two drafts) are drawn as the target alone draws them."""
    from scipy.stats import chisquare

    vocab = 5
    target = tiny_model(position="rope", vocab_size=vocab, seed=3)[0]
    draft = tiny_model(position="rope", vocab_size=vocab, seed=4, n_layers=1)[0]
    scheduler, speculative = schedulers(target, draft, draft_tokens=2, max_rows=48)
    prompt, sampling = [1, 4, 2], SamplingConfig(temperature=0.8)

    exact = first_three(target, prompt, sampling)
    torch.manual_seed(0)  # unseeded rows draw from torch's generator
    counts = torch.zeros(vocab ** 3, dtype=torch.float64)
    for _ in range(20):
        batch = [Recorded(prompt, 4, sampling=sampling) for _ in range(48)]  # a round of two drafts after the first
        for recorded in batch:
            scheduler.submit(recorded.job)
        drain(scheduler)
        for recorded in batch:
            a, b, c = recorded.tokens[0][:3]
            counts[(a * vocab + b) * vocab + c] += 1
    stats = speculative.speculation
    assert 0.05 < stats.acceptance_rate < 0.95 and scheduler.tokens == 0
    seen = exact > 0
    assert chisquare(counts[seen], exact[seen] / exact[seen].sum() * counts.sum()).pvalue > 1e-3


def test_a_request_beyond_the_drafts_context_decodes_in_the_plain_rows(models):
    target, _ = models
    draft = tiny_model(max_seq_len=16, position="rope", seed=3, n_layers=1)[0]
    speculative = SpeculativeScheduler(target, draft, draft_tokens=3, context_len=16, pad_id=0)
    scheduler = Scheduler(target, context_len=CONTEXT, pad_id=0, speculative=speculative)
    short, long = Recorded([1, 2, 3], 13), Recorded([1, 2, 3], 14)  # 16 positions, and 17
    assert [speculative.takes(r.job) for r in (short, long)] == [True, False]
    scheduler.submit(short.job)
    scheduler.submit(long.job)
    drain(scheduler)
    assert long.tokens == generate_tokens(target, [[1, 2, 3]], max_new_tokens=14, context_len=CONTEXT)
    assert short.tokens == [long.tokens[0][:13]] and scheduler.tokens == 14 and speculative.tokens == 13


def test_no_draft_passes_the_context_beside_a_row_with_many_tokens_left():
    """A round's K follows the row with the most tokens left, so a row that ends at the last position of the context
    beside it must not draft past it: K is cut by the rows' context too. Learned positions have no row for a
    position past the context: a draft there fails the round and ends every row with "error"."""
    target = tiny_model(max_seq_len=CONTEXT, position="learned", seed=2)[0]
    draft = tiny_model(max_seq_len=CONTEXT, position="learned", seed=3, n_layers=1)[0]
    scheduler, _ = schedulers(target, draft, draft_tokens=3)
    full = Recorded(list(range(1, 13)) * 3, CONTEXT - 36)  # 36 prompt tokens and 12 new: the whole context
    scheduler.submit(full.job)
    iterate(scheduler)
    long = Recorded([2, 3], 40)  # joins beside it, with many tokens left when it reaches the end
    scheduler.submit(long.job)
    drain(scheduler)
    assert (full.reasons, long.reasons) == (["length"], ["length"])
    assert full.tokens == generate_tokens(target, [full.job.prompt], max_new_tokens=CONTEXT - 36, context_len=CONTEXT)
    assert long.tokens == generate_tokens(target, [[2, 3]], max_new_tokens=40, context_len=CONTEXT)


def test_a_plain_request_ends_while_a_long_speculative_one_runs(models):
    """Each turn of the loop runs one plain step and one round: drafting for one request holds no other."""
    target, draft = models
    scheduler, speculative = schedulers(target, draft, draft_tokens=2)
    long, short = Recorded([1, 2], 40), Recorded([3, 4], 3, sampling=SamplingConfig(temperature=0.0,
                                                                                   frequency_penalty=1.0))
    scheduler.submit(long.job)
    scheduler.submit(short.job)
    turns = 0
    while short.reasons is None:
        iterate(scheduler)
        turns += 1
    assert short.reasons == ["length"] and turns <= 4
    assert long.reasons is None and len(long.tokens[0]) <= turns * 3  # at most k + 1 tokens a round
    assert scheduler.running_rows == 1 and scheduler.kv_cache_usage > 0  # the speculative rows count on /metrics
    drain(scheduler)
    assert long.reasons == ["length"] and len(long.tokens[0]) == 40


def test_a_plain_request_joins_while_speculative_rows_fill_the_batch(models):
    """--max-batch bounds each batch's rows: a request the draft rule cannot serve joins the plain rows while the
    speculative ones are full (it waited for them to end, behind every greedy request that came after it)."""
    target, draft = models
    scheduler, speculative = schedulers(target, draft, draft_tokens=2, max_rows=2)
    greedy = [Recorded([1, 2], 40), Recorded([3, 1], 40)]
    penalised = Recorded([3, 4], 3, sampling=SamplingConfig(temperature=0.0, frequency_penalty=1.0))
    for recorded in greedy:
        scheduler.submit(recorded.job)
    iterate(scheduler)
    scheduler.submit(penalised.job)
    for _ in range(4):
        iterate(scheduler)
    assert penalised.reasons == ["length"] and all(recorded.reasons is None for recorded in greedy)
    assert scheduler.running_rows == 2 and speculative.running_rows == 2
    drain(scheduler)


def test_a_request_that_ended_in_a_round_that_then_failed_is_answered_and_both_batches_go(models):
    """A round's tokens are delivered before both caches are rewound (`_write`): when that fails, the requests the
    round had ended were never finished (their replies waited for the timeout), and the draft's cache was kept."""
    target, _ = models
    scheduler, speculative = schedulers(target, target)  # every draft kept: the round gives the last two tokens

    def fail(*args) -> None:
        raise RuntimeError("the caches could not be rewound")

    speculative._write = fail
    ended, failed = Recorded([1, 2], 3), Recorded([4, 5], 9)
    for recorded in (ended, failed):
        scheduler.submit(recorded.job)
    scheduler.start()
    try:
        deadline = time.monotonic() + 20
        while (ended.reasons is None or failed.reasons is None) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        scheduler.stop()
    assert ended.reasons == ["length"] and ended.tokens == generate_tokens(target, [[1, 2]], max_new_tokens=3,
                                                                            context_len=CONTEXT)
    assert failed.reasons == ["error"] and isinstance(failed.job.failure, RuntimeError)
    assert speculative.batch is None and speculative.drafts is None and not speculative.shapers


def test_rows_drafting_for_themselves_are_counted_round_by_round_as_vllm_counts_drafts(models):
    """With the target as its own draft every draft is kept: a request of 10 tokens gets its first from the prefill,
    then rounds of K = 3 drafts (4 tokens each) while 4 fit below max_tokens, then a round of no draft for the last:
    3 rounds, 3 drafts a row in each of 2, all accepted, 9 tokens advanced. /metrics counts a draft per row and round
    that drafted, as vLLM's spec_decode_num_drafts does (mean acceptance length: 1 + accepted / drafts); it counted
    the rounds."""
    from attnkit.serve.metrics import Metrics

    target, _ = models
    scheduler, speculative = schedulers(target, target, draft_tokens=3)
    pair = Recorded([1, 2, 3], 10, n=2)
    scheduler.submit(pair.job)
    drain(scheduler)
    stats = speculative.speculation
    assert (stats.rounds, stats.drafts, stats.drafted, stats.accepted, stats.advanced) == (3, 4, 12, 12, 9)
    assert pair.tokens == generate_tokens(target, [[1, 2, 3]] * 2, max_new_tokens=10, context_len=CONTEXT)
    lines = Metrics().text(scheduler).splitlines()
    assert {"attnkit_spec_decode_num_drafts_total 4", "attnkit_spec_decode_num_draft_tokens_total 12"} <= set(lines)


def test_speculative_rows_whose_client_went_or_whose_deadline_passed_end_cancelled_at_the_next_round(models):
    target, draft = models
    scheduler, speculative = schedulers(target, draft)
    gone, late, kept = Recorded([1, 2, 3], 30), Recorded([4, 5], 30, n=2), Recorded([6], 30)
    for recorded in (gone, late, kept):
        scheduler.submit(recorded.job)
    iterate(scheduler)
    gone.job.cancel()
    late.job.deadline = time.monotonic() - 1
    iterate(scheduler)
    assert gone.reasons == ["cancelled"] and late.reasons == ["cancelled", "cancelled"] and kept.reasons is None
    assert len(speculative.batch.rows) == 1 and len(speculative.drafts.rows) == 1 and len(speculative.shapers) == 1
    drain(scheduler)
    assert kept.tokens == generate_tokens(target, [[6]], max_new_tokens=30, context_len=CONTEXT)


def test_a_close_ends_the_speculative_and_plain_rows_in_flight_and_lets_both_caches_go(models):
    target, draft = models
    scheduler, speculative = schedulers(target, draft)
    greedy, penalised = Recorded([1, 2, 3], 40, n=2), Recorded([2], 40, sampling=SamplingConfig(
        temperature=0.0, presence_penalty=1.0))
    for recorded in (greedy, penalised):
        scheduler.submit(recorded.job)
    iterate(scheduler)
    assert speculative.batch is not None and scheduler.batch is not None
    scheduler.start()
    scheduler.stop()
    assert greedy.reasons == ["error", "error"] and penalised.reasons == ["error"]
    assert all(isinstance(r.job.failure, Closed) for r in (greedy, penalised))
    assert speculative.batch is None and speculative.drafts is None and speculative.newest is None


class ByRound(Recorded):
    """A Recorded job that also notes the round each token came in (the scheduler's `speculation.rounds` when it
    was passed on): how many tokens the job gained in each round."""

    def __init__(self, speculative: SpeculativeScheduler, prompt: list[int], max_new: int) -> None:
        super().__init__(prompt, max_new)
        self.speculative, self.rounds = speculative, []

    def _token(self, choice: int, token: int) -> bool:
        self.rounds.append(self.speculative.speculation.rounds)
        return super()._token(choice, token)

    @property
    def gains(self) -> list[int]:
        """Tokens gained per round, in order (the prefill's first token counted as round 0's)."""
        return [self.rounds.count(r) for r in sorted(set(self.rounds))]


@pytest.mark.parametrize("shape", [dict(position="rope"), dict(position="alibi"), dict(position="relative"),
                                   dict(position="rope", attention_window=5, n_kv_heads=2)],
                         ids=["rope", "alibi", "relative", "window-gqa"])
def test_each_row_keeps_the_drafts_it_accepted_whatever_its_neighbours_kept(shape):
    """A row of a batch gains, round by round, what it gains alone (its own accepted drafts plus one), while its
    neighbours keep fewer or more: each row has its own cache length (its left padding grows as it falls behind)
    and its text stays the target's greedy text, whatever reads distances between its keys (ALiBi, Shaw's relative
    positions, a sliding window shorter than the rows, over grouped key heads). Rows that advanced by the fewest
    drafts any row kept got the neighbours' gains instead."""
    target = tiny_model(max_seq_len=CONTEXT, seed=2, **shape)[0]
    draft = tiny_model(max_seq_len=CONTEXT, seed=3, n_layers=1, **shape)[0]
    prompts, max_new = ([1, 2, 3], [4, 5, 6, 7, 8, 9], [2], [5, 5, 5, 5, 5]), 24
    alone = []
    for prompt in prompts:
        scheduler, speculative = schedulers(target, draft, draft_tokens=3)
        recorded = ByRound(speculative, prompt, max_new)
        scheduler.submit(recorded.job)
        drain(scheduler)
        alone.append(recorded)
    scheduler, speculative = schedulers(target, draft, draft_tokens=3)
    together = [ByRound(speculative, prompt, max_new) for prompt in prompts]
    for recorded in together:
        scheduler.submit(recorded.job)
    drain(scheduler)
    assert len({tuple(recorded.gains) for recorded in alone}) > 1, "every row kept the same drafts: nothing tested"
    for one, shared in zip(alone, together, strict=True):
        assert shared.tokens == one.tokens == generate_tokens(target, [one.job.prompt], max_new_tokens=max_new,
                                                              context_len=CONTEXT)
        assert shared.gains == one.gains


def test_metrics_gauges_count_both_batches_and_their_help_says_so(models):
    """With a draft two batches run (plain and speculative rows): the gauges count both, and their help text, which
    spoke of one "running batch", says so."""
    from attnkit.serve.metrics import Metrics

    target, draft = models
    scheduler, speculative = schedulers(target, draft)
    greedy, penalised = Recorded([1, 2], 30), Recorded([3], 30, sampling=SamplingConfig(temperature=0.0,
                                                                                         presence_penalty=1.0))
    for recorded in (greedy, penalised):
        scheduler.submit(recorded.job)
    iterate(scheduler)
    lines = Metrics().text(scheduler).splitlines()
    assert {"attnkit_batch_size 2", "attnkit_num_requests_running 2"} <= set(lines)
    helps = {line.split()[2]: line for line in lines if line.startswith("# HELP")}
    for name in ("batch_size", "num_requests_running", "kv_cache_usage_ratio", "num_requests_waiting"):
        text = helps[f"attnkit_{name}"]
        assert "running batch " not in text and "running batch." not in text and "the batch" not in text, text
    drain(scheduler)


# Through a live server -------------------------------------------------------------------------------------------
pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
httpx = pytest.importorskip("httpx")

from serve_helpers import TEXT_CHARS, running_server, tiny_run  # noqa: E402

import attnkit  # noqa: E402
from attnkit.checkpoint import record_checksums, save_model  # noqa: E402
from attnkit.config import ModelConfig  # noqa: E402
from attnkit.tokenize import CharTokenizer  # noqa: E402

TIMEOUT = 60
TEXTS = ("the cat", "a dog ran", "hello", "z")


def varied_run(directory, *, n_layers: int):
    """A tiny char-level decoder run whose matrices are drawn with std 0.3: its greedy texts vary from token to token
    (a freshly built one's repeat one character), and a draft of one layer disagrees with it often."""
    tokenizer = CharTokenizer(TEXT_CHARS)
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, d_model=32, n_layers=n_layers, n_heads=4,
                         d_ff=64, max_seq_len=96)
    torch.manual_seed(0)
    model = attnkit.build_model(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.3)
    save_model(model, config, directory)
    tokenizer.save(directory / "tokenizer")
    record_checksums(directory)
    return directory


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("speculative")
    return varied_run(root / "target", n_layers=2), varied_run(root / "draft", n_layers=1)


@pytest.fixture(scope="module")
def servers(runs):
    target, draft = runs
    with running_server(target, draft=str(draft), draft_tokens=3) as (speculating, _), \
            running_server(target) as (plain, _):
        yield speculating, plain


def complete(url: str, body: dict) -> dict:
    answer = httpx.post(f"{url}/v1/completions", json={"max_tokens": 16, "temperature": 0, **body}, timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_greedy_texts_equal_the_server_without_a_draft_and_the_pipeline(runs, servers):
    speculating, plain = servers
    expected = attnkit.load(runs[0], device="cpu").generate(list(TEXTS), max_new_tokens=16, temperature=0)
    assert len(set("".join(expected))) > 8, expected  # texts of many tokens, which a draft gets wrong
    for text, want in zip(TEXTS, expected, strict=True):
        drafted, alone = complete(speculating, {"prompt": text}), complete(plain, {"prompt": text})
        assert drafted["choices"][0]["text"] == alone["choices"][0]["text"] == want
        assert drafted["usage"] == alone["usage"]
    with ThreadPoolExecutor(4) as pool:  # concurrent clients share the speculative rows' rounds
        answers = list(pool.map(lambda text: complete(speculating, {"prompt": text, "n": 2}), TEXTS))
    for answer, want in zip(answers, expected, strict=True):
        assert [choice["text"] for choice in answer["choices"]] == [want, want]


def test_a_streamed_request_sends_the_same_text_and_metrics_show_the_acceptance_rate(runs, servers):
    speculating, plain = servers
    body = {"prompt": "the cat", "max_tokens": 20, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{speculating}/v1/completions", json=body, timeout=TIMEOUT) as raw:
        chunks = [json.loads(line[6:]) for line in raw.iter_lines() if line.startswith("data: {")]
    streamed = "".join(choice["text"] for chunk in chunks for choice in chunk["choices"])
    assert streamed == complete(plain, {"prompt": "the cat", "max_tokens": 20})["choices"][0]["text"]
    metrics = {line.split()[0]: float(line.split()[1]) for line in httpx.get(f"{speculating}/metrics").text.splitlines()
               if line.startswith("attnkit_spec_decode")}
    drafted, accepted = (metrics[f"attnkit_spec_decode_num_{name}_tokens_total"] for name in ("draft", "accepted"))
    assert drafted > 0 and metrics["attnkit_spec_decode_num_drafts_total"] > 0
    assert metrics["attnkit_spec_decode_draft_acceptance_rate"] == pytest.approx(accepted / drafted, abs=1e-6)
    assert not any(line.startswith("attnkit_spec_decode") for line in httpx.get(f"{plain}/metrics").text.splitlines())


def test_a_draft_of_another_vocabulary_is_refused_at_start_up_in_one_line(runs, tmp_path, capsys):
    from attnkit.cli import main

    other = tiny_run(tmp_path, tokenizer="bpe", n_layers=1)
    status = main(["serve", str(runs[0]), "--draft", str(other), "--port", "0"])
    error = capsys.readouterr().err.strip().splitlines()
    assert status != 0 and len(error) == 1 and "vocabulary" in error[0] and "Traceback" not in error[0]


def test_a_choice_that_ended_beside_one_that_kept_every_draft_leaves_the_round_whole(monkeypatch):
    """A request of two sampled choices, the first ending at its first token: its row stays in the batch beside the
    open one, and in rounds where the open row keeps all K drafts the ended row, which kept fewer, takes the token
    after them (`token_after_kept`), not a draft past the K-th (which failed the round for every request)."""
    from attnkit.serve import speculative

    class FirstEndsAtOnce(Recorded):
        def _token(self, choice: int, token: int) -> bool:
            super()._token(choice, token)
            return choice == 0

    cut_at_k = []

    def recorded_rule(keep, kept, after, drafted):  # notes rounds with a row cut at all K drafts it did not keep
        cut_at_k.append(bool(((keep == drafted.shape[1]) & (kept < keep)).any()))
        return token_after_kept(keep, kept, after, drafted)

    monkeypatch.setattr(speculative, "token_after_kept", recorded_rule)
    target = tiny_model(max_seq_len=CONTEXT, position="rope", vocab_size=4, seed=2)[0]
    draft = tiny_model(max_seq_len=CONTEXT, position="rope", vocab_size=4, seed=3, n_layers=1)[0]
    scheduler, _ = schedulers(target, draft, draft_tokens=3)
    torch.manual_seed(0)  # unseeded choices draw from torch's generator
    requests = [FirstEndsAtOnce([1, 2, 3], 20, n=2, sampling=SamplingConfig(temperature=1.0)) for _ in range(12)]
    for request in requests:
        scheduler.submit(request.job)
    drain(scheduler)
    assert any(cut_at_k), "no round cut an ended row at all K drafts: nothing tested"
    for request in requests:
        assert request.reasons == ["stop", "length"] and [len(tokens) for tokens in request.tokens] == [1, 20]
        assert all(0 <= token < 4 for token in request.tokens[1])


def test_choices_of_one_request_that_stop_at_different_tokens_each_follow_the_targets_distribution():
    """The choices of one sampled request advance by the fewest drafts any open one kept, and end at different
    tokens (a stop token ends one while the other goes on, its row still in the batch): each choice's first three
    tokens, cut after a stop token, are drawn as the target alone draws them."""
    from scipy.stats import chisquare

    vocab, stop = 5, 0
    target = tiny_model(position="rope", vocab_size=vocab, seed=3)[0]
    draft = tiny_model(position="rope", vocab_size=vocab, seed=4, n_layers=1)[0]
    scheduler, speculative = schedulers(target, draft, draft_tokens=2, max_rows=48)
    prompt, sampling = [1, 4, 2], SamplingConfig(temperature=1.2)

    def cut(tokens) -> tuple[int, ...]:  # a text's first three tokens, ended by the stop token
        tokens = list(tokens)[:3]
        return tuple(tokens[:tokens.index(stop) + 1] if stop in tokens else tokens)

    exact: dict[tuple[int, ...], float] = {}  # the first three tokens' distribution, each cut after a stop token
    for flat, p in enumerate(first_three(target, prompt, sampling).tolist()):
        key = cut([flat // vocab ** 2, flat // vocab % vocab, flat % vocab])
        exact[key] = exact.get(key, 0.0) + p
    torch.manual_seed(0)  # unseeded choices draw from torch's generator
    counts = dict.fromkeys(exact, 0)
    ended_apart = 0
    for _ in range(12):
        batch = [Recorded(prompt, 4, n=2, sampling=sampling, stop_ids=frozenset({stop})) for _ in range(24)]
        for recorded in batch:
            scheduler.submit(recorded.job)
        drain(scheduler)
        for recorded in batch:
            ended_apart += len({len(tokens) for tokens in recorded.tokens}) > 1
            for tokens, reason in zip(recorded.tokens, recorded.reasons, strict=True):
                assert stop not in tokens and reason == ("stop" if len(tokens) < 4 else "length")
                counts[cut(tokens + [stop])] += 1  # the stop token ends a choice unreturned
    assert ended_apart > 60, "too few requests whose choices ended at different tokens: nothing tested"
    stats = speculative.speculation
    assert 0.05 < stats.acceptance_rate < 0.95 and scheduler.tokens == 0
    keys = [key for key in exact if exact[key] > 0]
    expected = torch.tensor([exact[key] for key in keys], dtype=torch.float64)
    observed = torch.tensor([counts[key] for key in keys], dtype=torch.float64)
    assert sum(counts.values()) == observed.sum()  # no choice took a sequence the target never draws
    assert chisquare(observed, expected / expected.sum() * observed.sum()).pvalue > 1e-3
