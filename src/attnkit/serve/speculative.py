"""Speculative decoding in the batching scheduler (`attnkit serve RUN --draft DRAFT_RUN`, as vLLM serves with a
draft model): the rule of `generate/speculative.py` (Leviathan et al. 2023), over rows that join and leave between
rounds as `serve/batching.py`'s rows do.

The rows that speculate have a batch of their own (`Batch`: buffers with room, rows left-padded, every row's newest
token in one column), and beside it a second `Batch` over the draft's cache, holding the same rows and columns and
moved, grown and shrunk with it. Each scheduler iteration runs one step of the plain batch and one round of this
one (`Scheduler._loop`), so a request's drafting costs the others one round, never its whole text.

    before a round   every row's newest token (`newest`, kept aside as the plain batch keeps its chosen tokens
                     until a step) goes into column L, in neither model's cache yet
    draft            K small steps over its batch                          d1 ... dK     (q1 ... qK)
    target           one forward over columns L ... L + K                  p1 ... pK+1
    keep             each row its own n + 1 tokens, n the drafts it kept (the fewest any open choice of its job
                     kept, `_advances`), then the token after them (`token_after_kept`, the library's rule): a row
                     whose drafts were accepted never waits for one whose were not
    after            the batches advance by m + 1 columns, m the most any row kept; a row that kept fewer moves
                     right by the difference (`Batch.realign`: its left padding grows, as a shorter prompt's),
                     so every row's newest token is in column L + m + 1 again; both caches cut there

A job joins as in the plain batch: its prompt is prefilled in both models beside the others that join, and its first
token is chosen from the target's prefill logits as the plain batch chooses it (`Scheduler._sample`). Each round
gives every row 1 to K + 1 tokens, K cut so that no draft's position passes the context, and a row keeps no more
than its max_tokens leaves room for.

Which requests speculate (`takes`): greedy ones (the text is the target's own, token for token) and sampled ones
without a seed (drawn from the target's distribution), whose text fits both models' context; the others are served
by the plain batch, beside, and get what the server without a draft gives them. A seeded sampled request goes there
because how many drafts a round proposes depends on the other rows (their max_tokens, their context), so its draws
would follow who shares its rounds; penalties, grammars (structured output) and
log-probabilities because the draft rule holds none of them (`run_settings.NOT_BESIDE_DRAFT`). Nothing is refused
for having a draft.

Both caches keep every position (`rolling=False`, so a sliding window's rows merge and rewind); nothing is kept in
the prefix cache, which holds the target's keys only.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor, nn

from attnkit.generate.decoder import Window, left_pad, logits_of_new, prefill
from attnkit.generate.sampling import Groups, check_drawn, draw
from attnkit.generate.speculative import Shaper, Speculation, accept_greedy, accept_sampled, token_after_kept
from attnkit.run_settings import check_draft_tokens
from attnkit.serve.batching import Batch, GenerationJob, Scheduler


class SpeculativeScheduler(Scheduler):
    """The rows that speculate (see the module docstring). It has no thread of its own: the plain scheduler, which
    hands it the jobs it `takes`, runs its iterations on its thread. `speculation` counts the rounds, drafted and
    accepted tokens (GET /metrics)."""

    def __init__(self, model: nn.Module, draft: nn.Module, *, draft_tokens: int, context_len: int, pad_id: int,
                 max_rows: int = 32, max_waiting: int = 64, writable: int | None = None) -> None:
        super().__init__(model, context_len=context_len, pad_id=pad_id, max_rows=max_rows, max_waiting=max_waiting,
                         writable=writable)
        self.draft = draft
        self.draft_tokens = check_draft_tokens(draft_tokens)
        self.vocab = writable or model.lm_head.out_features  # the ids both models may choose
        self.most_positions = 2 * context_len  # every position is kept (rolling=False): buffers may exceed a window
        self.drafts: Batch | None = None  # the draft's batch: the rows and columns of `batch`
        self.newest: Tensor | None = None  # (B,): each row's newest token, written into column `length` by a round
        self.speculation = Speculation(draft_tokens)
        self.shapers: dict[GenerationJob, Shaper] = {}  # each running job's logits processing (`Shaper`)

    def takes(self, job: GenerationJob) -> bool:
        """Whether `job` speculates (see the module docstring): no penalties, grammar or log-probabilities, greedy
        or unseeded, and its prompt and max_tokens within both models' context (`context_len`, the smaller)."""
        plain = job.sampling.penalises or job.grammar is not None or job.top_logprobs is not None
        fits = len(job.prompt) + job.max_new_tokens <= self.context_len
        return fits and not plain and (job.sampling.greedy or job.seed is None)

    def _allocate(self, batch_size: int, positions: int):
        return self.model.allocate_cache(batch_size, positions, rolling=False)

    def _allocate_draft(self, batch_size: int, positions: int):
        return self.draft.allocate_cache(batch_size, positions, rolling=False)

    # joining and moving: both batches alike -------------------------------------------------------------------
    def _prefill(self, joining: list[GenerationJob]) -> None:
        """Prefill `joining` in the draft (its cache only: the target chooses their first tokens), then in the target
        (`Scheduler._prefill`), and add their rows to both batches; both are unchanged when a pass fails."""
        rows = [(job, choice) for job in joining for choice in range(job.n)]
        window = left_pad([job.prompt for job, _ in rows], pad_id=self.pad_id, device=self.device)  # (k, T)
        count, width = window.ids.shape
        cache = self._allocate_draft(count, width)
        prefill(self.draft, window, cache)
        fresh = self.batch is None
        super()._prefill(joining)
        if fresh:  # an empty draft batch of the target's room and length, for the rows to be placed in
            capacity, positions = self.batch.room
            self.drafts = Batch(self._allocate_draft(capacity, positions), torch.zeros_like(self.batch.ids),
                                torch.zeros_like(self.batch.attention_mask), 0, [])
            self.drafts.length = width
            self.newest = window.ids.new_zeros(0)
        self.drafts.place(window, cache, rows)

    def _fit(self, *, rows: int = 0, width: int = 0, columns: int = 1) -> None:
        """`Scheduler._fit`, the draft's batch moved with the target's."""
        before = self.batch
        super()._fit(rows=rows, width=width, columns=columns)
        if self.batch is not before:
            capacity, positions = self.batch.room
            self.drafts = self.drafts.moved(capacity, positions, self.batch.length - before.length,
                                            self._allocate_draft)

    def _finish(self, job: GenerationJob) -> None:
        self.shapers.pop(job, None)
        super()._finish(job)

    def _let_go(self) -> None:
        """`Scheduler._let_go`, the draft's batch with the target's (a failed round, a close)."""
        super()._let_go()
        self.drafts = self.newest = None

    # an iteration ---------------------------------------------------------------------------------------------
    def _decode(self) -> int:
        """Choose the first token of the jobs that joined, drop the rows that ended, and run a round over the rest
        (`Scheduler._iteration` admits the waiting jobs before); returns the rows the round chose for."""
        self._cancel_expired(self.batch.jobs)
        self._first_tokens()
        if not self._drop_ended():
            return 0
        rows = len(self.batch.rows)
        self._round()
        self._drop_ended()
        return rows

    def _first_tokens(self) -> None:
        """Choose the first token of the rows prefilled since the last round (the batch's last rows, whose logits
        `logits` holds) as the plain batch does: their `newest`."""
        fresh = self.logits.shape[0]
        if not fresh:
            return
        rows_of = self.batch.rows_of_jobs(len(self.batch.rows) - fresh)  # counted as `logits` counts its rows
        chosen = torch.full((fresh,), self.pad_id, dtype=torch.long, device=self.device)
        self._sample_alike([job for job in rows_of if None in job.reasons], rows_of, chosen)  # the live jobs
        self.newest = torch.cat((self.newest, chosen.clamp(min=0)))  # a failed row's padding: it is dropped
        self.logits = self.logits[:0]

    def _drop_ended(self) -> bool:
        """End the jobs whose choices have all ended and drop their rows from both batches. Returns whether any row
        is left."""
        batch = self.batch
        ended = [row for row, (job, _) in enumerate(batch.rows) if None not in job.reasons]
        for job in batch.jobs:
            if None not in job.reasons:
                self._finish(job)
        if len(ended) == len(batch.rows):
            self._let_go()
            return False
        if ended:
            self.newest = self.newest[batch.drop(ended)]
            self.drafts.drop(ended)
        return True

    def _round(self) -> None:
        """One round of speculative decoding over every row (see the module docstring), each job's tokens passed on
        as the plain batch passes them (`_deliver`)."""
        started = time.monotonic()
        jobs = self.batch.jobs
        room = min(self.context_len - len(job.prompt) - job.produced for job in jobs)  # the drafts' positions fit
        k = max(0, min(self.draft_tokens, room, max(job.max_new_tokens - job.produced - 1 for job in jobs)))
        self._fit(columns=k + 2)  # the target caches columns L ... L + k, and L + m + 1 takes the newest token
        batch, drafts = self.batch, self.drafts
        batch.write(self.newest)
        drafts.write(self.newest)
        listed = batch.rows_of_jobs()
        rows_of = {job: torch.tensor(rows, device=self.device) for job, rows in listed.items()}  # in choice order
        for job in jobs:
            if job not in self.shapers:
                self.shapers[job] = Shaper(job.sampling, vocab=self.vocab, stop_ids=job.stop_ids,
                                           writable=self.writable, min_new_tokens=job.min_tokens, device=self.device)
        window = batch.window()  # (B, L + 1 - first)
        drafted, q = self._draft(window, drafts.cache, k, rows_of)  # (B, k), (B, k, V)
        scored = logits_of_new(self.model, window.extend(drafted), batch.cache, k + 1)  # (B, k + 1, V')
        kept, after = self._accept(scored, drafted, q, rows_of)  # (B,), (B,)
        kept_by_row = kept.tolist()
        live = [row for row, (job, choice) in enumerate(batch.rows) if job.reasons[choice] is None]
        advance = _advances(listed, kept_by_row)  # B ints: the drafts each row keeps
        self._count(k, [kept_by_row[row] for row in live], [advance[row] for row in live])
        last = token_after_kept(torch.tensor(advance, device=kept.device), kept, after, drafted)  # (B,)
        by_row, last_by_row = drafted.tolist(), last.tolist()
        for job, rows in listed.items():
            try:
                gained = advance[rows[0]]
                for column in range(gained + 1):
                    if None not in job.reasons:
                        break
                    self._deliver(job, check_drawn([by_row[row][column] if column < gained else last_by_row[row]
                                                    for row in rows]))
            except Exception as error:  # its own logits gave no distribution, or its own callback failed
                self._fail(job, error)
        self._write(drafted, last.clamp(min=0), advance, k)
        self.step_seconds = time.monotonic() - started  # how long joining jobs wait for company (`Scheduler._due`)

    def _accept(self, scored: Tensor, drafted: Tensor, q: Tensor | None, rows_of: dict[GenerationJob, Tensor]
                ) -> tuple[Tensor, Tensor]:
        """The target's verdict on each row's k drafts (B, k), each job's rows shaped by its settings: how many drafts
        the row keeps (B,) and the token after them (B,) (`accept_greedy`, or Leviathan et al.'s `accept_sampled`
        over the draft's distributions q (B, k, V)). `scored`: the target's logits over the k + 1 columns
        (B, k + 1, V')."""
        k = drafted.shape[1]
        kept = torch.empty(drafted.shape[0], dtype=torch.long, device=self.device)  # (B,)
        after = torch.empty_like(kept)  # (B,)
        for job, rows in rows_of.items():
            shaper, groups = self.shapers[job], _groups(job)
            if job.sampling.greedy:
                chosen = torch.stack([shaper.choose(scored[rows, i], job.produced + i, groups)
                                      for i in range(k + 1)], dim=1)  # (b, k + 1)
                kept[rows], after[rows] = accept_greedy(chosen, drafted[rows])
            else:
                p = torch.stack([shaper.probs(scored[rows, i], job.produced + i) for i in range(k + 1)], dim=1)
                kept[rows], after[rows] = accept_sampled(p, q[rows], drafted[rows], groups)
        return kept, after

    def _draft(self, window: Window, cache, k: int, rows_of: dict[GenerationJob, Tensor]
               ) -> tuple[Tensor, Tensor | None]:
        """The draft's k proposals (B, k) after the window, each job's rows shaped by its settings, and their
        distributions (B, k, V) (None when every job is greedy; zeros in a greedy job's rows)."""
        batch = window.ids.shape[0]
        sampled = any(not job.sampling.greedy for job in rows_of)
        q = torch.zeros(batch, k, self.vocab, device=self.device) if sampled else None
        tokens = []
        for i in range(k):
            logits = prefill(self.draft, window, cache)  # (B, V'): the columns the cache lacks, the last one's logits
            token = torch.empty(batch, dtype=torch.long, device=self.device)
            for job, rows in rows_of.items():
                shaper, groups = self.shapers[job], _groups(job)
                if job.sampling.greedy:
                    token[rows] = shaper.choose(logits[rows], job.produced + i, groups)
                else:
                    q[rows, i] = shaper.probs(logits[rows], job.produced + i)
                    token[rows] = draw(q[rows, i], groups)
            tokens.append(token.clamp(min=0))  # NO_TOKEN (a broken draft) is rejected by the target, never kept
            window = window.append(tokens[-1])
        drafted = torch.stack(tokens, dim=1) if tokens else window.ids.new_zeros(batch, 0)  # (B, k)
        return drafted, q

    def _write(self, drafted: Tensor, last: Tensor, advance: list[int], k: int) -> None:
        """Keep each row's round: its first advance[row] drafts (of `drafted`, (B, k)) after column L, in both
        batches, and `last` (B,), the token after them, as its `newest`. The batches advance by m + 1 columns, m the
        most drafts a row kept, and each row that kept fewer moves right by the difference (`Batch.realign`), so that
        every row's newest token is in column L + m + 1 and no row waits for another; both caches are cut to that
        length, and the draft is fed the column it lacks where a row kept all k drafts."""
        m = max(advance)
        length = self.batch.length + m + 1
        shifts = [m - gained for gained in advance]  # B ints: how far right each row moves
        for part in (self.batch, self.drafts):
            rows = len(part.rows)
            part.ids[:rows, part.length + 1:length] = drafted[:, :m]  # (B, m): a row's unkept drafts go in realign
            part.attention_mask[:rows, part.length + 1:length] = True
            part.length = length
            part.realign(shifts)  # the caches in use now end at column `length` (`Batch._in_use`)
        self.newest = last
        drafts = self.drafts
        if m == k:  # the draft never took column L + k (its last draft) in the rows that kept all k: feed it
            drafts.cache.rewind(length - 1 - drafts.first)
            rows = len(drafts.rows)
            prefill(self.draft, Window(drafts.ids[:rows, drafts.first:length],
                                       drafts.attention_mask[:rows, drafts.first:length], drafts.padded), drafts.cache)
        self.steps += 1

    def _count(self, k: int, kept: list[int], advance: list[int]) -> None:
        """Add a round to `speculation`: a draft of k tokens per live row, `kept` of each accepted, `advance` of them
        kept by each (its job's fewest, within max_tokens); `advanced` counts the most tokens a live row gained."""
        stats = self.speculation
        stats.rounds += 1
        stats.drafts += len(kept) if k else 0
        stats.drafted += k * len(kept)
        stats.accepted += sum(kept)
        stats.advanced += max(advance) + 1


def _advances(listed: dict[GenerationJob, list[int]], kept: list[int]) -> list[int]:
    """The drafts each row keeps (B,): the fewest any open choice of its job kept (a job's choices share its count of
    tokens, `GenerationJob.produced`), at most what its max_tokens leaves room for after the one token that follows
    them. Keeping fewer drafts than the target accepted keeps the text exact: greedy, the drafts kept are the
    target's choices; sampled, each accepted draft is drawn from the target's distribution (Leviathan et al.) and
    where the row stops depends on no token after it."""
    advance = [0] * len(kept)
    for job, rows in listed.items():
        open_rows = [row for choice, row in enumerate(rows) if job.reasons[choice] is None] or rows
        gained = min(min(kept[row] for row in open_rows), job.max_new_tokens - job.produced - 1)
        for row in rows:
            advance[row] = max(0, gained)
    return advance


def _groups(job: GenerationJob) -> Groups:
    """A job's rows as the sampling functions take them: a group of one row per choice, drawn from its generator."""
    return [(1, generator) for generator in job.generators]
