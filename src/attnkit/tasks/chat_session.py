"""`attnkit chat RUN`: a multi-turn chat with a decoder run from the command line, as `litgpt chat` and `ollama run`
hold one.

The user's turns come from standard input, one a line (a terminal, with line editing, or a pipe; a line that is not
UTF-8, or longer than `LONGEST_LINE`, is refused with a warning, the chat going on). Each reply is drawn by
`Pipeline.chat_reply` over the whole history (the system turn, every earlier turn and reply, the new turn), so the
model reads the chat as the run's template renders it (`ChatTemplate.chat_ids`: as chat fine-tuning read its
conversations and `attnkit serve` reads a chat), and is streamed to standard output as it comes, ended at the
template's end of turn (its stop strings, its turn-end token, EOS).

    \"\"\"      begins a turn of several lines, up to a line that ends with \"\"\" (as `ollama run` reads one; a
             terminal prompts `... ` for each further line)
    /reset   forget the history (the system turn stays)
    /exit    end the chat (as end of input does: Ctrl-D, or the end of a pipe)
    Ctrl-C   during a reply: stop it there (what it wrote stays its reply); before it begins (the history being
             fitted to the window): drop that turn, the history kept as it was; at the prompt: a fresh line (a turn
             of several lines being typed is dropped)

The window: before each reply the history must leave the reply room in the model's window (`max_seq_len`):
`max_new_tokens`, or half the window where that asks for more. The oldest exchanges (a user's turn and the replies
after it; never the system turn) are left out until it does, with one line on standard error saying how many turns
went; a turn that does not fit even alone beside the system turn is refused, and the history kept as it was. A reply
never makes the window slide (`Pipeline.generate` would drop the chat's head, system turn and all): it ends where the
window is full.

Standard output holds the replies alone, one after each turn (after the `>>> ` prompt where standard input is a
terminal); what the chat says about itself is logged (standard error).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from attnkit.errors import InputError
from attnkit.tasks.lm import SamplingSettings, chat_prompt
from attnkit.tokenize import not_utf8

log = logging.getLogger(__name__)

PROMPT = ">>> "  # shown before each turn where standard input is a terminal
MORE = "... "  # shown before each further line of a turn of several lines (as `ollama run` and Python show it)
RESET, EXIT = "/reset", "/exit"
FENCE = '"""'  # begins and ends a turn of several lines
LONGEST_LINE = 1 << 20  # bytes of a piped line read at most: a longer one (no turn: it outgrows a window) is skipped


@dataclass(frozen=True, kw_only=True)
class ChatSettings(SamplingSettings):
    """`attnkit chat`: the run, how it is loaded and how its replies are drawn."""

    system: str | None = None  # a system turn that begins the chat (a system prompt); /reset keeps it


class TurnTooLong(InputError):
    """A user's turn that does not fit in the model's window, even alone beside the system turn, with room to reply."""


@dataclass(frozen=True)
class Reply:
    """One reply: its text, how many of the oldest turns were left out to make room for it, and whether Ctrl-C
    stopped it."""

    text: str
    left_out: int = 0
    stopped: bool = False


class ChatSession:
    """A chat with one run: the history and the replies to it (module docstring). `pipeline` is the run's
    `attnkit.load`; `sampling`: `Pipeline.generate`'s options for each reply (max_new_tokens, temperature, seed...)."""

    def __init__(self, pipeline: Any, *, system: str | None = None, sampling: Mapping[str, Any] | None = None,
                 stop: tuple[str, ...] = ()) -> None:
        self.pipeline = pipeline
        self.system = [{"role": "system", "content": system}] if system is not None else []
        self.turns: list[dict] = []  # the user's turns and the replies, oldest first (the system turn apart)
        self.sampling = dict(sampling or {})
        self.most = self.sampling.get("max_new_tokens", SamplingSettings.max_new_tokens)  # a reply's tokens at most
        self.stop = stop

    @property
    def messages(self) -> list[dict]:
        """The chat so far, as the model reads it: the system turn, then the turns and replies."""
        return [*self.system, *self.turns]

    def reset(self) -> None:
        self.turns.clear()

    def ids(self, turns: list[dict]) -> list[int]:
        """The token ids of the system turn and `turns`, a reply's prompt (`ChatTemplate.chat_ids`)."""
        return self.pipeline.chat_template.chat_ids(self.pipeline.tokenizer, [*self.system, *turns])

    def fitted(self, turn: dict) -> tuple[list[dict], list[int]]:
        """The turns with `turn` after them, the oldest exchanges left out until a reply has room in the window; and
        the prompt's token ids (`ids`), which the reply is drawn after. Raises TurnTooLong where `turn` leaves no room
        even alone."""
        window = self.pipeline.config.max_seq_len
        room = min(self.most, window // 2)
        turns = [*self.turns, turn]
        while len(ids := self.ids(turns)) + room > window:
            if len(turns) == 1:
                raise TurnTooLong(
                    f"this turn{' and the system turn take' if self.system else ' takes'} {len(ids)} tokens; the model "
                    f"reads {window} at once and a reply needs {room} of them: write a shorter turn (or give a "
                    "smaller --max-new-tokens)")
            # rendered afresh, not cut from `ids`: a template may move the system turn into the first user turn
            # left (Llama 2's) and reads its text whole, so the rest's tokens need not be a tail of these
            turns = turns[next(i for i, m in enumerate(turns[1:], start=1) if m["role"] == "user"):]
        return turns, ids

    def reply(self, text: str, on_text: Callable[[str], None] | None = None) -> Reply:
        """The model's reply to the user's `text` after the history, which both then join; `on_text(piece)`
        receives the reply as it settles. Turns left out to make room are logged before the reply. Ctrl-C
        (KeyboardInterrupt) while it is drawn stops it: what was written is the reply. Raises TurnTooLong (history
        unchanged) for a turn that does not fit (`fitted`); otherwise as `Pipeline.chat_reply`."""
        turns, ids = self.fitted({"role": "user", "content": text})
        left_out = len(self.turns) + 1 - len(turns)
        if left_out:
            log.warning("(the %d oldest turn(s) were left out to fit the model's window of %d tokens; %s starts "
                        "afresh)", left_out, self.pipeline.config.max_seq_len, RESET)
        most = min(self.most, self.pipeline.config.max_seq_len - len(ids))
        options = {**self.sampling, "max_new_tokens": most,
                   "min_new_tokens": min(self.sampling.get("min_new_tokens", 0), most)}
        shown: list[str] = []  # the reply's content so far

        def heard(piece: str) -> None:
            shown.append(piece)
            if on_text is not None:
                on_text(piece)

        stopped = False
        try:
            answer = self.pipeline.chat_reply(ids, stop=list(self.stop),  # the history read once, by `fitted`
                                              on_text=self.pipeline.chat_template.content_stream(heard), **options)
        except KeyboardInterrupt:
            answer, stopped = "".join(shown), True
        self.turns = [*turns, {"role": "assistant", "content": answer}]
        return Reply(answer, left_out, stopped)


def turns_of(stdin: TextIO) -> Iterator[str]:
    """The user's turns, a line each, until the end of input; a turn that begins with `\"\"\"` runs on over the lines
    up to one that ends with `\"\"\"` (as `ollama run` takes a turn of several lines), the quotes left out, and with
    them the line break after an opening and before a closing `\"\"\"` on a line of its own. Ctrl-C in a terminal
    drops the turn being typed, as in `ollama run` and Python's prompt."""
    lines = lines_of(stdin)
    for line in lines:
        if line is None:  # Ctrl-C at the prompt
            continue
        if not line.startswith(FENCE):
            yield line
            continue
        parts = [line.removeprefix(FENCE)]
        while parts and not parts[-1].endswith(FENCE):
            try:
                more = lines.send(MORE)  # the next line, read after the prompt for more
            except StopIteration:
                break
            parts = [*parts, more] if more is not None else []
        if parts:
            yield "\n".join(parts).removesuffix(FENCE).removeprefix("\n").removesuffix("\n")


def lines_of(stdin: TextIO) -> Generator[str | None, str | None, None]:
    """The lines of the input, until its end: a terminal's with the `>>> ` prompt (or the prompt sent for the next
    line, `MORE`) and line editing (Ctrl-C there gives None and a fresh line); a pipe's or a file's read as bytes,
    at most LONGEST_LINE of them a line (a longer line is skipped with a warning), and decoded as UTF-8 (a byte that
    is not UTF-8 kept as a lone surrogate, which `run_chat` refuses)."""
    if stdin is sys.stdin and stdin.isatty():
        try:
            import readline  # noqa: F401  (line editing and recall for input(), where Python has it)
        except ImportError:
            pass
        prompt = PROMPT
        while True:
            try:
                line = input(prompt)
            except KeyboardInterrupt:
                print()
                log.info("(%s or Ctrl-D ends the chat)", EXIT)
                line = None
            except EOFError:
                print()
                return
            prompt = (yield line) or PROMPT
    source = getattr(stdin, "buffer", stdin)  # its bytes: a line that is not UTF-8 is refused by run_chat in any locale
    while line := source.readline(LONGEST_LINE + 1):  # never read without bound (a file of no line breaks)
        if len(line) > LONGEST_LINE:
            while line[-1:] not in ("\n", b"\n") and (line := source.readline(LONGEST_LINE + 1)):
                pass  # the rest of the line, skipped
            log.warning("a line of more than %d bytes was left out: no model's window holds such a turn", LONGEST_LINE)
            continue
        text = line.decode("utf-8", "surrogateescape") if isinstance(line, bytes) else line
        yield text.rstrip("\r\n")


def run_chat(settings: ChatSettings, load: Callable[[Any], Any], *, stdin: TextIO | None = None,
             stdout: TextIO | None = None) -> int:
    """`attnkit chat`; `load(settings)` loads the run (the command line passes `attnkit.cli.load_pipeline`);
    `stdin` and `stdout`: where turns come from and replies go (default: the process's). Raises InputError, before
    a turn is read, for a run that does not generate, has no tokenizer, or whose chat template refuses the --system
    turn."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    pipeline = load(settings)
    if "generate" not in pipeline.methods:
        raise InputError(f"attnkit chat talks with a decoder that generates (a run of task lm or chat); {settings.run} "
                         f"serves {' or '.join(pipeline.methods) or 'no text method'}")
    session = ChatSession(pipeline, system=settings.system, sampling=settings.sampling(), stop=settings.stop)
    # a chat the run cannot read (no tokenizer/, a --system turn its template refuses) is refused before a turn is typed
    chat_prompt(pipeline.chat_template, pipeline.tokenizer, "Hi", system=settings.system)
    terminal = stdin is sys.stdin and stdin.isatty()

    def write(piece: str) -> None:
        stdout.write(piece)
        stdout.flush()

    for text in turns_of(stdin):
        if text.strip() == EXIT:
            break
        if text.strip() == RESET:
            session.reset()
            log.info("(the history is cleared%s)", "; the system turn stays" if session.system else "")
            continue
        if not text.strip():
            continue
        if (bad := not_utf8([text], fix="write the turn in UTF-8")) is not None:
            log.warning("%s", bad)
            continue
        try:
            reply = session.reply(text, on_text=write)
        except TurnTooLong as error:
            log.warning("%s", error)
            continue
        except KeyboardInterrupt:  # before the reply began (the history being fitted): that turn goes, not the chat
            log.info("(the turn was dropped before its reply began; the history is as it was)")
            continue
        write("\n\n" if terminal else "\n")
        if reply.stopped:
            log.info("(the reply was stopped; it stays in the history as written)")
    return 0
