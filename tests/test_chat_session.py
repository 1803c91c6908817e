"""`attnkit chat` (a multi-turn chat read from standard input) and `Pipeline.chat`, on the tiny chat runs of
tests/test_chat_finetune.py: each reply's prompt is `ChatTemplate.chat_ids` of the whole history, the oldest turns
are left out (never the system turn) where the window would overflow, /reset and /exit, Ctrl-C stops a reply and not
the chat, and `Pipeline.chat` answers as `attnkit generate --chat` does."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import test_chat_finetune as finetuned

from attnkit import cli, load
from attnkit.chat_format import ChatTemplate
from attnkit.errors import InputError
from attnkit.generate import Pipeline
from attnkit.run_settings import DecodeSettings
from attnkit.tasks import chat_session
from attnkit.tasks.chat_session import ChatSession, ChatSettings, run_chat, turns_of
from attnkit.tasks.lm import GenerateSettings, SamplingSettings, chat_prompt, run_generate
from attnkit.train import prepare

SECRETS, TINY, chat_request = finetuned.SECRETS, finetuned.TINY, finetuned.chat_request
secrets, chatml_run = finetuned.secrets, finetuned.chatml_run  # the fixtures: the data and a run in ChatML
QUESTIONS = list(SECRETS)
WINDOW = 192  # wide_run's max_seq_len


@pytest.fixture(scope="module")
def wide_run(secrets, tmp_path_factory):
    """A tiny run that learns SECRETS (as test_chat_finetune's secret_run, trained straight through) with a window of
    192 tokens, which holds a chat of both questions: the one run of the plain format these tests share."""
    out = tmp_path_factory.mktemp("wide") / "run"
    request = chat_request(out, secrets)
    prepare(dataclasses.replace(request, overrides=[*TINY[:-1], f"max_seq_len={WINDOW}"])).fit()
    return out


def fed_prompts(monkeypatch) -> list[list[int]]:
    """The token ids each reply is generated after, as `Pipeline.generate` receives them."""
    fed, generate = [], Pipeline.generate
    monkeypatch.setattr(Pipeline, "generate", lambda self, prompts, **kw: fed.append(list(prompts)) or
                        generate(self, prompts, **kw))
    return fed


def chat(run, lines: str, **settings) -> list[str]:
    """`attnkit chat RUN` over `lines` as standard input: standard output's lines."""
    out = io.StringIO()
    settings = {"temperature": 0.0, "max_new_tokens": 16, **settings}
    assert run_chat(ChatSettings(run=str(run), **settings), cli.load_pipeline, stdin=io.StringIO(lines),
                    stdout=out) == 0
    return out.getvalue().splitlines()


def test_each_reply_reads_the_whole_history_as_chat_ids_and_exit_ends_the_chat(wide_run, monkeypatch):
    fed = fed_prompts(monkeypatch)
    said = chat(wide_run, f"{QUESTIONS[0]}\n\n{QUESTIONS[1]}\n/exit\n{QUESTIONS[0]}\n")
    assert said == [SECRETS[q] for q in QUESTIONS]  # the replies alone, the blank line no turn, nothing after /exit
    pipeline = load(wide_run)
    history = [{"role": "user", "content": QUESTIONS[0]}, {"role": "assistant", "content": said[0]},
               {"role": "user", "content": QUESTIONS[1]}]
    assert fed == [pipeline.chat_template.chat_ids(pipeline.tokenizer, history[:1]),
                   pipeline.chat_template.chat_ids(pipeline.tokenizer, history)]
    eos = pipeline.tokenizer.eos_id
    assert fed[1].count(eos) == 1 and fed[1][: len(fed[0])] == fed[0]  # the reply, then EOS, as trained


def test_reset_clears_the_history_and_keeps_the_system_turn(wide_run, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="attnkit")
    fed = fed_prompts(monkeypatch)
    chat(wide_run, f"{QUESTIONS[0]}\n/reset\n{QUESTIONS[1]}\n", system="Be brief.")
    pipeline = load(wide_run)
    alone = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTIONS[1]}]
    assert fed[1] == pipeline.chat_template.chat_ids(pipeline.tokenizer, alone)
    assert "the history is cleared; the system turn stays" in caplog.text


def test_a_turn_in_triple_quotes_runs_over_several_lines(wide_run, monkeypatch):
    fed = fed_prompts(monkeypatch)
    chat(wide_run, '"""\nWhat is\nthe secret word?"""\n"""Name the capital of France."""\n', max_new_tokens=2)
    pipeline = load(wide_run)
    first = {"role": "user", "content": "What is\nthe secret word?"}
    assert fed[0] == pipeline.chat_template.chat_ids(pipeline.tokenizer, [first])
    second = pipeline.chat_template.chat_ids(pipeline.tokenizer, [{"role": "user", "content": QUESTIONS[1]}])
    assert len(fed) == 2 and fed[1][-len(second):] == second  # a quoted line is a turn, its quotes left out


def test_a_fence_on_a_line_of_its_own_adds_no_line_break_to_the_turn():
    typed = '"""\nWhat is\n\nthe word?\n"""\n"""One line."""\n"""Begun here\nand ended here"""\nHi\n"""\nopen\n'
    assert list(turns_of(io.StringIO(typed))) == ["What is\n\nthe word?", "One line.", "Begun here\nand ended here",
                                                  "Hi", "open"]  # the last, unclosed, ends with the input


def test_a_terminal_prompts_for_more_within_a_turn_of_several_lines_and_ctrl_c_drops_it(monkeypatch):
    typed = iter(['"""', "Dropped", KeyboardInterrupt, KeyboardInterrupt, '"""What is', 'the word?"""', "Hi"])
    prompts = []

    def read(prompt: str) -> str:
        """input(): the next line typed (Ctrl-C raises KeyboardInterrupt there), EOFError at the end (Ctrl-D)."""
        prompts.append(prompt)
        line = next(typed, EOFError)
        if not isinstance(line, str):
            raise line
        return line

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    monkeypatch.setattr("builtins.input", read)
    assert list(turns_of(sys.stdin)) == ["What is\nthe word?", "Hi"]  # Ctrl-C dropped the turn being typed
    assert prompts == [">>> ", "... ", "... ", ">>> ", ">>> ", "... ", ">>> ", ">>> "]


def test_the_oldest_turns_are_left_out_to_fit_the_window_with_a_warning_the_system_turn_kept(wide_run, monkeypatch,
                                                                                             caplog):
    fed = fed_prompts(monkeypatch)
    pipeline = load(wide_run)
    template, tok, window = pipeline.chat_template, pipeline.tokenizer, pipeline.config.max_seq_len
    system = [{"role": "system", "content": "Terse."}]
    session = ChatSession(pipeline, system="Terse.", sampling={"temperature": 0.0, "max_new_tokens": 8})
    history, dropped = [], 0
    for i, text in enumerate(["Hi! " * 20, "Name the capital. " * 5, "Hello there. " * 7, "Bye. " * 16]):
        history.append({"role": "user", "content": text})
        fits = [start for start in range(len(history)) if history[start]["role"] == "user"
                and len(template.chat_ids(tok, [*system, *history[start:]])) + 8 <= window]
        history = history[fits[0]:]  # the longest run of whole exchanges that leaves the reply its 8 tokens
        reply = session.reply(text)
        assert fed[i] == template.chat_ids(tok, [*system, *history])
        assert reply.left_out == (fits[0] > 0) * fits[0]
        dropped += fits[0] > 0
        history.append({"role": "assistant", "content": reply.text})
    assert dropped >= 2  # the window made the chat leave turns out, more than once
    assert caplog.text.count(f"oldest turn(s) were left out to fit the model's window of {WINDOW} tokens") == dropped
    assert session.messages == [*system, *history]


def test_a_turn_that_is_not_utf8_is_refused_and_the_chat_goes_on(wide_run, caplog):
    piped = f"{QUESTIONS[0]}\n".encode() + b"caf\xe9?\n" + f"{QUESTIONS[1]}\n".encode()  # Latin-1 in the middle
    out = io.StringIO()
    stdin = io.TextIOWrapper(io.BytesIO(piped), encoding="utf-8", errors="strict")  # as a UTF-8 locale reads a pipe
    settings = ChatSettings(run=str(wide_run), temperature=0.0, max_new_tokens=16)
    assert run_chat(settings, cli.load_pipeline, stdin=stdin, stdout=out) == 0
    assert out.getvalue().splitlines() == [SECRETS[q] for q in QUESTIONS]
    assert "is not UTF-8 (byte 0xe9 at character 3): write the turn in UTF-8" in caplog.text


def test_a_piped_line_too_long_for_any_window_is_skipped_unread_and_the_chat_goes_on(wide_run, monkeypatch, caplog):
    monkeypatch.setattr(chat_session, "LONGEST_LINE", 100)  # bytes: a line is read in pieces of at most 101
    fed = fed_prompts(monkeypatch)
    said = chat(wide_run, f"{'x' * 250}\n{QUESTIONS[0]}\n{'y' * 99}\n")
    assert said[0] == SECRETS[QUESTIONS[0]] and len(fed) == 2  # the line of 99 is a turn, the line of 250 none
    assert caplog.text.count("a line of more than 100 bytes was left out") == 1


def test_a_reply_ends_where_the_window_is_full_and_never_slides_it(wide_run, monkeypatch):
    asked, generate = [], Pipeline.generate
    monkeypatch.setattr(Pipeline, "generate", lambda self, prompts, **kw: asked.append((len(prompts), kw)) or
                        generate(self, prompts, **kw))
    endless = {"max_new_tokens": 4 * WINDOW, "min_new_tokens": 4 * WINDOW, "seed": 0}  # more than the window holds
    ChatSession(load(wide_run), sampling=endless).reply(QUESTIONS[0])
    [(length, options)] = asked
    assert length + options["max_new_tokens"] == WINDOW  # the prompt and the reply fill the window, and no more
    assert options["min_new_tokens"] == options["max_new_tokens"]


def test_a_turn_too_long_for_the_window_is_refused_and_the_chat_goes_on(wide_run, monkeypatch, caplog):
    fed = fed_prompts(monkeypatch)
    said = chat(wide_run, f"{'a' * WINDOW}\n{QUESTIONS[0]}\n")
    assert said == [SECRETS[QUESTIONS[0]]] and len(fed) == 1
    assert "this turn takes" in caplog.text and "write a shorter turn" in caplog.text
    pipeline = load(wide_run)
    assert fed[0] == pipeline.chat_template.chat_ids(pipeline.tokenizer, [{"role": "user", "content": QUESTIONS[0]}])


def test_ctrl_c_during_a_reply_stops_that_reply_not_the_chat(wide_run, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="attnkit")
    fed, generate = [], Pipeline.generate

    def interrupted_once(self, prompts, *, on_text, **kw):
        """The first reply is interrupted after its first three pieces, as Ctrl-C would interrupt it."""
        fed.append(list(prompts))
        if len(fed) > 1:
            return generate(self, prompts, on_text=on_text, **kw)
        pieces = []

        def heard(row, piece):
            pieces.append(piece)
            on_text(row, piece)
            if len(pieces) == 3:
                raise KeyboardInterrupt

        return generate(self, prompts, on_text=heard, **kw)

    monkeypatch.setattr(Pipeline, "generate", interrupted_once)
    said = chat(wide_run, f"{QUESTIONS[0]}\n{QUESTIONS[1]}\n")
    whole = SECRETS[QUESTIONS[0]]
    assert said[0] != whole and whole.startswith(said[0]) and said[0]  # cut short, the text so far shown
    assert said[1] == SECRETS[QUESTIONS[1]]  # the chat goes on
    pipeline = load(wide_run)
    history = [{"role": "user", "content": QUESTIONS[0]}, {"role": "assistant", "content": said[0]},
               {"role": "user", "content": QUESTIONS[1]}]
    assert fed[1] == pipeline.chat_template.chat_ids(pipeline.tokenizer, history)  # the stopped reply as written
    assert "the reply was stopped" in caplog.text


@pytest.mark.slow  # a fresh interpreter imports torch: over ten seconds on two busy cores
def test_attnkit_chat_runs_through_a_pipe_and_stops_at_its_end(wide_run):
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root / "src")}
    done = subprocess.run([sys.executable, "-m", "attnkit", "chat", str(wide_run), "--temperature", "0",
                           "--max-new-tokens", "16"], input=f"{QUESTIONS[1]}\n{QUESTIONS[0]}\n", text=True,
                          capture_output=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [SECRETS[QUESTIONS[1]], SECRETS[QUESTIONS[0]]]


@pytest.mark.slow  # a fresh interpreter, and a reply thousands of tokens long to interrupt
def test_sigint_during_a_reply_stops_it_and_the_chat_reads_on(secrets, tmp_path):
    """A real SIGINT, as Ctrl-C sends it, to `attnkit chat` reading a pipe: the long reply stops, and the chat reads
    the next line (/reset) and ends at the end of input."""
    import signal

    out = tmp_path / "run"
    request = chat_request(out, secrets, max_steps=1, eval_every=1)
    prepare(dataclasses.replace(request, overrides=[*TINY[:-1], "max_seq_len=8192"])).fit()  # rope: no table
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root / "src")}
    chat = subprocess.Popen([sys.executable, "-m", "attnkit", "chat", str(out), "--max-new-tokens", "8000",
                             "--min-new-tokens", "8000", "--seed", "0"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        chat.stdin.write("Hi\n")
        chat.stdin.flush()
        assert chat.stdout.read(1)  # the first reply is streaming
        chat.send_signal(signal.SIGINT)
        _, stderr = chat.communicate("/reset\n", timeout=120)  # the next line, then the end of input
    finally:
        chat.kill()
    assert chat.returncode == 0, stderr
    assert "the reply was stopped" in stderr and "interrupted" not in stderr
    assert stderr.index("the history is cleared") > stderr.index("the reply was stopped")


def test_every_sampling_setting_is_an_option_of_generate():
    own = {f.name for f in dataclasses.fields(SamplingSettings)} - {f.name for f in dataclasses.fields(DecodeSettings)}
    given = ChatSettings(run="runs/chat", top_k=3, seed=5).sampling()
    assert set(given) == own - {"stop"} and (given["top_k"], given["seed"]) == (3, 5)  # stop: the caller adds its own
    assert set(given) <= set(inspect.signature(Pipeline.generate).parameters)


def test_a_system_turn_the_template_refuses_is_named_before_a_turn_is_read(wide_run):
    pipeline = load(wide_run)
    pipeline.chat_template = ChatTemplate(  # as Gemma's template refuses a system turn
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        "{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    typed = io.StringIO(f"{QUESTIONS[0]}\n")
    refused = "--system: the chat template cannot render this chat .*System role not supported.*leave --system out"
    with pytest.raises(InputError, match=refused):
        run_chat(ChatSettings(run=str(wide_run), system="Be brief."), lambda _: pipeline, stdin=typed,
                 stdout=io.StringIO())
    assert typed.read() == f"{QUESTIONS[0]}\n"  # before the first turn was read
    with pytest.raises(InputError, match=refused):  # attnkit generate --chat --system
        chat_prompt(pipeline.chat_template, pipeline.tokenizer, QUESTIONS[0], system="Be brief.")


def test_a_run_without_its_tokenizer_is_refused_by_attnkit_chat_and_generate_chat(wide_run):
    bare = load(wide_run)
    bare.tokenizer = None  # as `attnkit.load` reads a run without tokenizer/
    no_tokenizer = "there is no tokenizer to read the chat as tokens: save the one the model was trained with"
    typed = io.StringIO("Hi\n")
    with pytest.raises(InputError, match=no_tokenizer):
        run_chat(ChatSettings(run=str(wide_run)), lambda _: bare, stdin=typed, stdout=io.StringIO())
    assert typed.read() == "Hi\n"  # before the first turn was read
    with pytest.raises(InputError, match=no_tokenizer):
        run_generate(GenerateSettings(run=str(wide_run), prompt="Hi", chat=True), lambda _: bare)


def test_a_run_without_its_tokenizer_is_refused_for_it_and_not_for_a_system_turn_beside(wide_run):
    bare = load(wide_run)
    bare.tokenizer = None  # as `attnkit.load` reads a run without tokenizer/
    no_tokenizer = "^there is no tokenizer to read the chat as tokens"  # not '--system: ...; leave --system out'
    with pytest.raises(InputError, match=no_tokenizer):
        run_chat(ChatSettings(run=str(wide_run), system="Be brief."), lambda _: bare, stdin=io.StringIO("Hi\n"),
                 stdout=io.StringIO())
    with pytest.raises(InputError, match=no_tokenizer):
        run_generate(GenerateSettings(run=str(wide_run), prompt="Hi", chat=True, system="Be brief."), lambda _: bare)


def test_attnkit_chat_refuses_a_run_that_does_not_generate(tmp_path):
    class Classifier:
        methods = ("classify",)

    with pytest.raises(InputError, match="attnkit chat talks with a decoder that generates"):
        run_chat(ChatSettings(run="runs/clf"), lambda _: Classifier(), stdin=io.StringIO("Hi\n"))


@pytest.mark.parametrize("run", ["wide_run", "chatml_run"])
def test_pipeline_chat_answers_as_generate_chat_does(run, request, capsys):
    folder = request.getfixturevalue(run)
    sampled = dict(temperature=0.9, seed=7, max_new_tokens=12)
    assert cli.main(["generate", str(folder), "--chat", "--system", "Be brief.", "--prompt", QUESTIONS[0],
                     *(f"--{k.replace('_', '-')}={v}" for k, v in sampled.items())]) == 0
    printed = capsys.readouterr().out.removesuffix("\n")
    pipeline = load(folder)
    reply = pipeline.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTIONS[0]}],
                          **sampled)
    assert reply == printed  # the reply's content alone, as attnkit chat prints it too
    if pipeline.chat_template.source is None:  # the plain format's own space after "Assistant:" is not printed
        assert not printed.startswith(" ")
    assert reply == load(folder).chat([{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": QUESTIONS[0]}], **sampled)  # the seed decides
    assert reply == pipeline.chat(({"role": "system", "content": "Be brief."},  # any sequence of messages
                                   {"role": "user", "content": QUESTIONS[0]}), **sampled)


def test_pipeline_chat_refuses_messages_not_laid_out_and_several_replies(wide_run):
    pipeline = load(wide_run)
    with pytest.raises(InputError, match=r'"messages"\[0\] must be an object with a role'):
        pipeline.chat([{"role": "robot", "content": "Hi"}])
    with pytest.raises(InputError, match="chat gives one reply; num_samples=2"):
        pipeline.chat([{"role": "user", "content": "Hi"}], num_samples=2)
    with pytest.raises(InputError, match=rf"the chat renders as \d+ tokens; the model reads at most {WINDOW} .*oldest"):
        pipeline.chat([{"role": "user", "content": "a" * WINDOW}])


def test_ctrl_c_while_the_history_is_fitted_drops_that_turn_not_the_chat(wide_run, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="attnkit")
    fed = fed_prompts(monkeypatch)
    ids, calls = ChatSession.ids, []

    def interrupted_once(self, turns):
        """The first turn's fitting is interrupted, as Ctrl-C would interrupt a long history's tokenizing."""
        calls.append(len(turns))
        if len(calls) == 1:
            raise KeyboardInterrupt
        return ids(self, turns)

    monkeypatch.setattr(ChatSession, "ids", interrupted_once)
    said = chat(wide_run, f"{QUESTIONS[0]}\n{QUESTIONS[1]}\n")
    assert said == [SECRETS[QUESTIONS[1]]]  # the first turn dropped, the second answered as a chat's first turn
    pipeline = load(wide_run)
    assert fed == [pipeline.chat_template.chat_ids(pipeline.tokenizer, [{"role": "user", "content": QUESTIONS[1]}])]
    assert "the turn was dropped" in caplog.text


def test_attnkit_chat_reads_the_history_as_tokens_once_a_turn(wide_run, monkeypatch):
    read, chat_ids = [], ChatTemplate.chat_ids
    monkeypatch.setattr(ChatTemplate, "chat_ids", lambda self, *a, **kw: read.append(1) or chat_ids(self, *a, **kw))
    said = chat(wide_run, f"{QUESTIONS[0]}\n{QUESTIONS[1]}\n")
    # one reading a turn (the window fitting it), after the one that tries the template before a turn is read
    assert said == [SECRETS[q] for q in QUESTIONS] and len(read) == 1 + 2


def test_pipeline_chat_finds_the_templates_end_of_turn_once(chatml_run, monkeypatch):
    found, turn_end_ids = [], ChatTemplate.turn_end_ids
    monkeypatch.setattr(ChatTemplate, "turn_end_ids", lambda self, t: found.append(1) or turn_end_ids(self, t))
    pipeline = load(chatml_run)
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    first = pipeline.chat(messages, temperature=0.0, max_new_tokens=8)
    assert pipeline.chat(messages, temperature=0.0, max_new_tokens=8) == first and len(found) == 1
    assert pipeline.chat_end_ids() == sorted(turn_end_ids(pipeline.chat_template, pipeline.tokenizer))
    assert pipeline.chat_end_ids(), "ChatML ends a turn at a special token"
    pipeline.chat_template = dataclasses.replace(pipeline.chat_template, eos_token="")  # another template: read again
    pipeline.chat(messages, temperature=0.0, max_new_tokens=8)
    assert len(found) == 2
    pipeline.tokenizer = copy.deepcopy(pipeline.tokenizer)  # another tokenizer, even one equal to it: read again
    pipeline.chat_end_ids().append(-1)  # a caller's change to the list it was given
    assert len(found) == 3 and -1 not in pipeline.chat_end_ids()
