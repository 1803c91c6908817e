"""The shell commands the README and the docs pages tell a reader to type still work.

Every `attnkit ...` line of a shell block (```, ```bash, ```sh, ```console; behind a pipe, an environment, torchrun or
`python -m`, with the variables the page sets), and every whole command the learner's
pages and the tutorials name in their text, is parsed by attnkit's own parser, as the command line would parse it,
without running it (a training command's settings are checked as `attnkit train` checks them before it starts): a
flag renamed or removed, a choice or a setting no longer offered, an option the command requires left out, or a
command gone fails here, naming the page and the line. A console block that shows a command refused shows the
message it prints. Lines that need nothing but attnkit (the course index, the experiments' list, presets,
recipes, `--help`) are run, and must succeed and print. Each `make TARGET` (in a shell block or in the text) names a
target of the Makefile, and the files the setup commands name exist. Commands that train, download or serve are
parsed only; the tutorials run in tests/test_tutorials.py.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from unittest import mock

import pytest

from attnkit import cli, experiments, lectures
from attnkit.errors import AttnkitError
from attnkit.train.job import check_request

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_BLOCKS = ("", "bash", "sh", "shell", "console")
# What a page may leave to its reader: their own files (--config run.yaml, --init-from path/to/model) and the data
# sets beside the repository.
READERS_FILES = re.compile(r"no such file|is no folder|does not exist")
# Commands that need no run, no data and no network, and finish in a second or two: these are run, not only parsed.
RUNNABLE = re.compile(r"^attnkit (lectures\b|presets\b|recipes\b|experiment --list$|.*--help$)")


def shell_lines(page: Path) -> list[tuple[str, list[str]]]:
    """The commands of a page's shell blocks, each with the output the page shows under it (a console block's lines
    after a `$ ` prompt): continuation lines joined, comments dropped."""
    lines, language, pending = [], None, ""  # language: None outside a block
    for line in page.read_text().splitlines():
        fence = line.strip()
        if fence.startswith("```"):
            language = fence[3:].strip().split(" ")[0] if language is None else None
            continue
        if language not in SHELL_BLOCKS:
            continue
        if language == "console" and not line.startswith("$ "):
            if lines and not pending:
                lines[-1][1].append(line)  # what the page says the command printed
            continue
        command = re.split(r"(?:^|\s)#\s", line.removeprefix("$ "))[0].strip()
        if command.endswith("\\"):
            pending += command[:-1]
            continue
        if pending + command:
            lines.append((" ".join((pending + command).split()), []))
        pending = ""
    return lines


def as_typed(line: str, variables: dict[str, str]) -> str:
    """The command a shell line runs: the variables its page set put in, and where it runs attnkit, the attnkit
    command alone: the environment it sets (OMP_NUM_THREADS=1 attnkit ...) and what a pipe feeds it (echo ... |
    attnkit ...) left to the shell, `python -m attnkit` and `torchrun ... -m attnkit` read as attnkit."""
    line = re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda name: variables.get(name[1], name[0]), line)
    for segment in line.split(" | "):
        command = re.sub(r"^(?:\w+=\S*\s+)+", "", segment.strip())
        command = re.sub(r"^(?:python3? -m|torchrun(?: \S+)*? -m) attnkit\b", "attnkit", command)
        if re.match(r"attnkit\b", command):
            return command
    return line


def commands(prefix: str, pages: list[Path] = PAGES) -> list[tuple[str, str, list[str]]]:
    """(page, command line, output shown) for every command of the pages' shell blocks that starts with prefix, as
    typed (`as_typed`); a line that elides (...) or reads a variable its page does not set is left out."""
    found = []
    for page in pages:
        variables = {}
        for line, shown in shell_lines(page):
            if assignment := re.fullmatch(r"(?:export )?([A-Za-z_]\w*)=(\"[^\"]*\"|'[^']*'|\S*)", line):  # ARGS="..."
                variables[assignment[1]] = " ".join(shlex.split(assignment[2]))
                continue
            typed = as_typed(line, variables)
            unknown = re.search(r"\$\{?[A-Za-z_]|(?:^|\s)\.\.\.(?:\s|$)", typed)
            if typed.startswith(prefix) and not (unknown and typed.startswith("attnkit")):
                found.append((str(page.relative_to(ROOT) if page.is_relative_to(ROOT) else page), typed, shown))
    return found


def refusal(shown: list[str]) -> str | None:
    """The error message a page shows a command printing, if it shows one."""
    return next((m[1] for line in shown if (m := re.match(r"attnkit[\w -]*: error: (.*)", line))), None)


class FlagsInFull(cli.Parser):
    """attnkit's parser, taking each flag only as spelled in full. argparse takes a flag's prefix (--max-new-tok) where
    no other flag shares it: a page that abbreviates breaks when a longer flag is added, and a flag renamed to a
    longer name (--eval-every-steps) would still take the page's old one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)


def check(argv: list[str]) -> None:
    """What `attnkit ARGV` checks before it starts: the command line, each flag spelled in full, for train the run it
    would start (the model config, data and training settings), without reading data or writing anything, and for
    experiment its name."""
    with mock.patch.object(cli, "Parser", FlagsInFull):  # the commands' parsers are made as their parent is
        invocation = cli.parse(argv)
    if argv[0] == "train":
        check_request(cli.train_request(invocation.settings, *invocation.sections))
    if argv[0] == "experiment" and invocation.settings.name is not None:
        experiments.get(invocation.settings.name)  # the name is looked up only as the experiment starts


def named(cases: list[tuple[str, str, list[str]]]) -> dict:
    return {"argvalues": [(page, line, shown) for page, line, shown in cases],
            "ids": [f"{page}: {line}" for page, line, _ in cases]}


def inline_commands() -> list[tuple[str, str, list[str]]]:
    """The whole commands the learner's pages name in running text (`attnkit lectures --gaps`, a tutorial's
    `attnkit experiment scaled-dot`, a course-index topic's `attnkit train --task chat --data FILE`): a command and at
    least one argument, with RUN and FILE standing for the reader's run and file; a span with another placeholder
    (NAME, ...) or a bare command name is left out."""
    found = []
    for name, text in LEARNERS_TEXTS:
        for span in sorted(set(re.findall(r"`(attnkit [^`]+)`", text))):
            line = span.replace("RUN", "runs/x").replace("FILE", "notes.txt")
            words = line.split()[2 if line.startswith("attnkit tokenizer ") else 1:]  # after the command's name
            if len(words) > 1 and "..." not in line and not re.search(r"\b[A-Z]{3,}\b", line):
                found.append((name, line, []))
    return found


LEARNERS_PAGES = [ROOT / "docs" / name for name in ("index.md", "course-index.md", "concepts.md",
                                                    "tutorials/README.md")]
LEARNERS_PAGES += sorted((ROOT / "docs" / "tutorials").glob("[0-9][0-9]_*.py"))
LEARNERS_TEXTS = [(str(page.relative_to(ROOT)), page.read_text()) for page in LEARNERS_PAGES]
COURSE_INDEX = "the course index's topics (attnkit.lectures)"  # rendered into docs/course-index.md at build time
LEARNERS_TEXTS.append((COURSE_INDEX, lectures.course_index_markdown()))
ATTNKIT = commands("attnkit ") + inline_commands()
ACCEPTED = [case for case in ATTNKIT if refusal(case[2]) is None]
REFUSED = [case for case in ATTNKIT if refusal(case[2]) is not None]


def test_the_pages_have_commands_to_check():
    pages = {page for page, _, _ in ACCEPTED}
    assert {"README.md", "docs/experiments.md", "docs/user-guide/looking-inside.md", COURSE_INDEX} <= pages, \
        sorted(pages)
    assert REFUSED, "no page shows a refusal any more: drop this assert, or the refusal test reads nothing"


def test_shell_lines_join_continuations_drop_comments_and_keep_what_a_console_block_shows(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n```bash\nattnkit viz --run runs/x \\\n    --text hi   # a comment\n# only a comment\n```\n"
                    "```python\nattnkit.load('x')\n```\n```\nmake run\n```\n"
                    "```console\n$ attnkit train --set n_layer=2\nattnkit: error: no such setting\n```\n")
    assert shell_lines(page) == [("attnkit viz --run runs/x --text hi", []), ("make run", []),
                                 ("attnkit train --set n_layer=2", ["attnkit: error: no such setting"])]


def test_a_flag_a_page_abbreviates_is_refused():
    """argparse would take --max-new-tok for --max-new-tokens; a page spells the flag as the command names it."""
    check(["generate", "--run", "runs/x", "--prompt", "hi", "--max-new-tokens", "5"])
    with pytest.raises(SystemExit):
        check(["generate", "--run", "runs/x", "--prompt", "hi", "--max-new-tok", "5"])


def test_an_experiment_a_page_names_is_looked_up_as_the_command_starts():
    """The experiment's name is a free word to the parser; an experiment renamed or gone fails the check."""
    check(["experiment", "scaled-dot", "--budget", "tiny"])
    with pytest.raises(AttnkitError, match="unknown experiment 'scaled-dots'"):
        check(["experiment", "scaled-dots", "--budget", "tiny"])


def test_commands_set_up_piped_or_launched_are_read_as_the_attnkit_command_they_run(tmp_path):
    page = tmp_path / "page.md"
    page.write_text('```bash\nARGS="--data synthetic:copy --max-steps 40"   # shared\n'
                    "OMP_NUM_THREADS=1 attnkit train --out runs/one $ARGS\n"
                    "torchrun --standalone --nproc-per-node 2 -m attnkit train --out runs/ddp $ARGS --shard\n"
                    'echo "import sys" | attnkit generate --run runs/x --prompt -\n'
                    "python -m attnkit --version\nattnkit presets | head -1\n"
                    "torchrun --nproc-per-node 8 -m attnkit train ...\nattnkit viz --run $RUN\n```\n")
    assert [line for _, line, _ in commands("attnkit", [page])] == [
        "attnkit train --out runs/one --data synthetic:copy --max-steps 40",
        "attnkit train --out runs/ddp --data synthetic:copy --max-steps 40 --shard",
        "attnkit generate --run runs/x --prompt -", "attnkit --version", "attnkit presets"]


@pytest.mark.parametrize(("page", "line", "shown"), **named(ACCEPTED))
def test_every_attnkit_command_on_the_pages_parses(page, line, shown, monkeypatch):
    monkeypatch.chdir(ROOT)  # the pages' paths (docs/experiments/..., ../shared/data) are from the repository root
    argv = shlex.split(line.split(" | ")[0])[1:]  # what a pipe feeds is the shell's business
    try:
        check(argv)
    except SystemExit as stop:  # argparse's usage error (printed above): an unknown flag, a choice it lacks
        assert stop.code == 0, f"{page}: `{line}` is refused by the command line (exit {stop.code})"
    except AttnkitError as err:
        if not READERS_FILES.search(str(err)):
            raise AssertionError(f"{page}: `{line}`: {err}") from err


@pytest.mark.parametrize(("page", "line", "shown"), **named(REFUSED))
def test_every_refusal_a_page_shows_is_the_one_the_command_prints(page, line, shown, monkeypatch, capsys):
    """A page that shows a command refused (a console block's `attnkit ...: error: ...` line) shows what it prints.
    Parsed only: a command that is no longer refused fails here instead of starting to train."""
    monkeypatch.chdir(ROOT)
    try:
        check(shlex.split(line)[1:])
    except SystemExit as stop:
        assert stop.code, f"{page}: `{line}` exits 0 where the page shows it refused"
        printed = capsys.readouterr().err
    except AttnkitError as err:
        printed = str(err)
    else:
        raise AssertionError(f"{page}: `{line}` is accepted where the page shows it refused")
    assert refusal(shown) in printed, f"{page}: `{line}` prints {printed!r}, the page shows {refusal(shown)!r}"


RUNS = [case for case in ACCEPTED if RUNNABLE.match(case[1])]


@pytest.mark.parametrize(("page", "line", "shown"), **named(RUNS))
def test_the_commands_that_need_nothing_run_and_print(page, line, shown, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    try:
        status = cli.main(shlex.split(line)[1:])
    except SystemExit as stop:  # --help exits 0 after printing
        status = stop.code
    out, err = capsys.readouterr()
    assert status == 0, f"{page}: `{line}` exited {status}: {err[-2000:]}"
    assert out.strip(), f"{page}: `{line}` printed nothing"


MAKE = sorted({line.split()[1] for _, line, _ in commands("make ")}
              | {target for page in PAGES for target in re.findall(r"`make ([\w./-]+)[^`]*`", page.read_text())})


def make_rules(folder: Path = ROOT) -> dict[str, str]:
    """The rules of the Makefile in `folder` as make reads them (variables expanded): target -> its prerequisites and
    recipe. A name only listed in .PHONY, or a folder (docs/), has neither, where `make -n` answers 0 for both."""
    database = subprocess.run(["make", "-pRrq"], cwd=folder, capture_output=True, text=True, timeout=60).stdout
    entries = re.finditer(r"^([^#\s][^:=\n]*):(?!=)(.*)\n((?:#.*\n|\t.*\n)*)", database, re.M)
    return {entry[1]: entry[2].strip() + (entry[3] if "recipe to execute" in entry[3] else "") for entry in entries}


@pytest.mark.parametrize("target", MAKE)
def test_every_make_target_the_pages_name_exists(target):
    assert make_rules().get(target), f"`make {target}`, which the pages name, is not a target of the Makefile"


def test_a_name_only_listed_as_phony_or_a_folder_is_no_make_target(tmp_path):
    (tmp_path / "Makefile").write_text(".PHONY: kept renamed docs\nkept: tool\n\techo kept\ntool:\n\ttouch tool\n")
    (tmp_path / "docs").mkdir()
    rules = make_rules(tmp_path)
    assert rules.get("kept") and rules.get("tool"), rules
    assert not rules.get("renamed") and not rules.get("docs"), rules


def test_the_files_the_setup_commands_name_exist():
    """`.venv/bin/...` lines: the tutorial they open exists (a notebook is made from its .py by the line before)."""
    files = [(page, word) for page, line, _ in commands(".venv/bin/") for word in shlex.split(line)
             if word.endswith((".py", ".ipynb"))]
    assert files, "no setup command names a file; the tutorials' page should say how to open one"
    missing = [(page, word) for page, word in files if not (ROOT / word).with_suffix(".py").exists()]
    assert not missing, f"setup commands name files that do not exist: {missing}"
