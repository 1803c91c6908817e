"""The command line generated from the settings: every option explained with the settings' own default, every
command line of the README and the documentation pages still parsed, --config files under the command line,
--version, `python -m attnkit`, `attnkit presets NAME`, one set of --dtype choices for weights, and errors of one
line whose every --flag is one of their command's options."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import pytest
from cli_helpers import subparsers, tiny_runs
from shared_data import shared

from attnkit import cli, options, presets
from attnkit.errors import InputError
from attnkit.generate.pipeline import DTYPES
from attnkit.run_settings import WeightDType
from attnkit.train.job import DataConfig
from attnkit.train.trainer import TrainConfig
from attnkit.version import installed_version

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]  # the README and the site's pages


def _fields(command: cli.Command) -> dict[str, tuple[type, dataclasses.Field]]:
    classes = command.classes()
    return {name: (cls, f) for cls in classes for name, f in options.fields_of(cls).items()}


def test_every_command_is_in_the_parser_and_every_option_is_explained_with_the_settings_default():
    parsers = subparsers(cli.build_parser())
    assert sorted(parsers) == sorted(c.name for c in cli.COMMANDS)
    for command in cli.COMMANDS:
        fields = _fields(command)
        seen = set()
        for action in parsers[command.name]._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            where = f"{command.name} {action.option_strings or action.dest}"
            assert action.help and len(action.help) > 10, f"{where} has no help"
            shown = re.findall(r"\(default: ([^)]*)\)", action.help)
            if action.dest not in fields:
                assert not shown, f"{where} shows a default but is no settings field"
                continue
            seen.add(action.dest)
            default = options.field_default(fields[action.dest][1])
            if default is None or default is dataclasses.MISSING:
                assert not shown, f"{where} shows a default the settings do not have"
            else:
                assert shown == [options.show_default(default)], f"{where}: {shown} is not the settings' {default!r}"
            assert action.default is None, f"{where}: a given option must be told from a default"
        assert seen == set(fields), f"{command.name}: fields without an option: {set(fields) - seen}"


def test_the_train_help_shows_the_training_config_defaults():
    parser = subparsers(cli.build_parser())["train"]
    text = parser.format_help()
    for f in dataclasses.fields(TrainConfig):
        assert f"--{f.name.replace('_', '-')}" in text
    steps = next(a for a in parser._actions if "--max-steps" in a.option_strings)
    assert f"(default: {TrainConfig().max_steps})" in steps.help


def test_every_option_that_takes_weights_dtype_offers_the_same_choices():
    takers = [(name, action) for name, parser in subparsers(cli.build_parser()).items() if name != "train"
              for action in parser._actions if "--dtype" in action.option_strings]
    assert len(takers) >= 4  # generate, translate, classify, convert
    for name, action in takers:
        assert tuple(action.choices) == get_args(WeightDType), name
    assert set(get_args(WeightDType)) <= set(DTYPES)


SHELL = {">", ">>", "<", "2>", "&&", ";", "||"}  # where a shell line's `attnkit` words end


def _documented_command_lines() -> list[list[str]]:
    """The arguments of every `attnkit ...` and `python -m attnkit ...` command in the code blocks of the README
    and the documentation pages, but for ```console transcripts (continuation lines joined; what a pipe feeds in,
    redirections and comments dropped)."""
    commands = []
    fenced = re.compile(r"^ *```([^\n]*)\n(.*?)^ *```", flags=re.S | re.M)
    blocks = [block for path in DOCUMENTS for info, block in fenced.findall(path.read_text(encoding="utf-8"))
              if info.strip() != "console"]  # a console block is a transcript: mistakes and what they print
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            text = line.split("|")[-1].strip().removeprefix("python -m ")
            words = shlex.split(text, comments=True) if text.startswith("attnkit ") else []  # not printed output
            if words[:1] == ["attnkit"]:
                cut = next((i for i, w in enumerate(words) if w in SHELL), len(words))
                commands.append(words[1:cut])
    return commands


DOCUMENTED_COMMANDS = _documented_command_lines()


def test_the_documentation_has_command_lines_to_check():
    assert len(DOCUMENTED_COMMANDS) >= 15
    assert sum(argv[0] == "train" for argv in DOCUMENTED_COMMANDS) >= 5


@pytest.mark.parametrize("argv", DOCUMENTED_COMMANDS, ids=" ".join)
def test_every_documented_command_line_parses(argv, capsys):
    if "--help" in argv or "--version" in argv:
        with pytest.raises(SystemExit) as stop:
            cli.parse(argv)
        assert stop.value.code == 0
        return
    args = cli.build_parser().parse_args(argv)  # argparse exits on anything it does not take
    assert args.command_spec.name.split()[0] == argv[0]
    if getattr(args, "data_root", None):  # a recipe reads its data there when the settings are built
        shared()
    if args.config_file is None:  # (the documents' --config files are examples, not files here)
        cli.invocation(args)  # the settings build from what was given
    assert capsys.readouterr().err == ""


def _console_transcripts() -> list[tuple[str, list[str], list[str]]]:
    """Each `$ attnkit ...` command of the ```console blocks of the README and the pages: where it is, its
    arguments, and the lines the page shows it printing (up to the next `$` line or the end of the block)."""
    fenced = re.compile(r"^ *```console\n(.*?)^ *```", flags=re.S | re.M)
    found = []
    for path in DOCUMENTS:
        for block in fenced.findall(path.read_text(encoding="utf-8")):
            for command in re.split(r"^\$ ", block, flags=re.M)[1:]:
                line, *printed = command.splitlines()
                found.append((str(path.relative_to(ROOT)), shlex.split(line)[1:], printed))
    return found


CONSOLE_TRANSCRIPTS = _console_transcripts()


@pytest.mark.parametrize(("page", "argv", "printed"), CONSOLE_TRANSCRIPTS,
                         ids=[" ".join(argv) for _, argv, _ in CONSOLE_TRANSCRIPTS])
def test_every_console_transcript_prints_what_the_page_shows(page, argv, printed, capsys, tmp_path, monkeypatch):
    """A page's transcript of a refused command line (```console) is what attnkit prints for it, line for line."""
    monkeypatch.chdir(tmp_path)  # a command the transcript shows refused must write nothing, least of all here
    status = cli.main(argv)
    out = capsys.readouterr()
    assert status != 0, f"{page}: attnkit {' '.join(argv)} was not refused"
    shown = [line.rstrip() for line in (out.out + out.err).splitlines()]  # a page keeps no trailing blanks
    assert shown == printed, f"{page} shows another output for attnkit {' '.join(argv)}"
    assert list(tmp_path.iterdir()) == []


def test_the_documentation_has_console_transcripts_to_check():
    assert len(CONSOLE_TRANSCRIPTS) >= 5 and all(printed for _, _, printed in CONSOLE_TRANSCRIPTS)


def _flags_named_with_a_command() -> list[tuple[str, str, str]]:
    """Each `--flag` written after `attnkit COMMAND` in the pages' prose (their code spans; the code blocks are
    parsed whole above) and in the program's own messages and help: where, the command, the flag."""
    names = "|".join(re.escape(c.name) for c in sorted(cli.COMMANDS, key=lambda c: -len(c.name)))
    fenced = re.compile(r"^ *```.*?^ *```", flags=re.S | re.M)
    texts = [(str(path.relative_to(ROOT)), " ".join(re.findall(r"`[^`\n]*`", fenced.sub("", path.read_text()))))
             for path in DOCUMENTS]
    texts += [(str(path.relative_to(ROOT)), path.read_text()) for path in sorted((ROOT / "src").rglob("*.py"))]
    return [(where, command, flag) for where, text in texts
            for command, rest in re.findall(rf"attnkit ({names})\b([^`\n\"']*)", text)
            for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", rest.split("#")[0])]


def test_every_flag_named_with_a_command_is_one_of_its_options():
    """A sentence such as `attnkit eval runs/sst2 --data dev.txt --int8-dynamic`, or a message that says what to run
    next, names only options its command takes."""
    named = _flags_named_with_a_command()
    assert len(named) >= 50
    takes = {name: {flag for action in parser._actions for flag in action.option_strings}
             for name, parser in subparsers(cli.build_parser()).items()}
    wrong = sorted({f"{where}: attnkit {command} {flag}" for where, command, flag in named
                    if flag not in takes[command]})
    assert not wrong, f"options their command does not take: {wrong}"


def test_the_command_line_page_names_every_command():
    """docs/user-guide/command-line.md opens with the program's commands: all of them."""
    page = (ROOT / "docs" / "user-guide" / "command-line.md").read_text(encoding="utf-8")
    listed = page.split("are the same program:", 1)[1].split(". ", 1)[0]
    missing = sorted({command.name.split()[0] for command in cli.COMMANDS} - set(re.findall(r"`([a-z-]+)", listed)))
    assert not missing, f"the command-line page's list of commands lacks {missing}"


def test_readme_train_flags_reach_the_request_unchanged():
    invocation = cli.parse(["train", "--data", "input.txt", "--tokenizer", "char", "--seq-len", "64", "--max-steps",
                            "2000", "--max-time", "5m", "--out", "runs/shakespeare", "--set", "n_layers=6",
                            "--set", "dropout=0.1", "--resume", "--no-progress", "--lora-targets", "q_proj,v_proj"])
    run, data, training, *own = invocation.settings, *invocation.sections
    assert own == [{} for _ in own]  # no task's own option (--tag-column) given
    assert (run.out, run.resume, run.progress, run.set) == ("runs/shakespeare", True, False,
                                                            ("n_layers=6", "dropout=0.1"))
    assert data == {"data": ("input.txt",), "tokenizer": "char", "seq_len": 64}
    assert training == {"max_steps": 2000, "max_time": 300.0, "lora_targets": ("q_proj", "v_proj")}
    DataConfig.from_dict(data), TrainConfig.from_dict(training)  # what the job builds from them


def test_options_not_given_stay_out_so_a_resumed_run_keeps_its_own():
    run, data, training, *_ = (lambda i: (i.settings, *i.sections))(cli.parse(["train", "--resume", "runs/x/best"]))
    assert run.resume == "runs/x/best" and data == {} and training == {}


def test_a_config_file_is_read_and_the_command_line_wins(tmp_path):
    path = tmp_path / "generate.json"
    path.write_text(json.dumps({"run": "runs/a", "prompt": "def ", "max-new-tokens": 7, "stop": ["\n\n"],
                                "temperature": 0.5}))
    settings = cli.parse(["generate", "--config", str(path), "--temperature", "0"]).settings
    assert (settings.run, settings.prompt, settings.max_new_tokens, settings.stop) == ("runs/a", "def ", 7, ("\n\n",))
    assert settings.temperature == 0.0
    assert settings.top_k is None  # neither given: the settings' default


def test_a_yaml_run_file_for_train_splits_into_options_model_fields_and_settings(tmp_path):
    pytest.importorskip("yaml")
    path = tmp_path / "run.yaml"
    path.write_text("out: runs/y\ntask: translate\nn_layers: 3\nposition: rope\nmax_time: 90s\nlr: 0.002\n"
                    "set: [dropout=0.1]\n")
    invocation = cli.parse(["train", "--config", str(path), "--lr", "0.003", "--set", "d_model=64"])
    run, data, training, *_ = invocation.settings, *invocation.sections
    assert run.out == "runs/y" and run.model_config is None
    assert run.set == ("n_layers=3", 'position="rope"', "dropout=0.1", "d_model=64")  # file first, command line last
    assert data == {"task": "translate"} and training == {"max_time": 90.0, "lr": 0.003}


def test_a_yaml_run_file_may_give_a_list_option_one_item_and_set_as_a_mapping(tmp_path):
    """`data: input.txt` is the one-item list (not refused as a str), `lora_targets: q_proj,k_proj` splits as its flag
    does, and `set:` may be a mapping of fields (not refused as 'd_model' lacking '=')."""
    pytest.importorskip("yaml")
    path = tmp_path / "run.yaml"
    path.write_text("data: input.txt\nlora_targets: q_proj,k_proj\nset:\n  d_model: 64\n  position: rope\n")
    invocation = cli.parse(["train", "--config", str(path)])
    run, data, training, *_ = invocation.settings, *invocation.sections
    assert data == {"data": ("input.txt",)} and training == {"lora_targets": ("q_proj", "k_proj")}
    assert run.set == ("d_model=64", 'position="rope"')


def test_a_file_of_model_fields_alone_is_the_model_to_start_from(tmp_path):
    path = tmp_path / "config.json"
    presets.get("gpt2-tiny").to_json(path)
    run = cli.parse(["train", "--config", str(path), "--out", str(tmp_path / "run")]).settings
    assert run.model_config == str(path) and run.set == ()


def test_a_config_file_with_an_unknown_key_is_refused(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"run": "runs/a", "prompt": "x", "colour": "red"}))
    assert cli.main(["generate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "colour" in err and "Traceback" not in err


@pytest.mark.parametrize("kind, expected", [("directory", "is a directory; give a JSON or YAML file"),
                                             ("fifo", "is a FIFO, not a regular file; give a JSON or YAML file"),
                                             ("latin-1", "is not UTF-8 text"), ("missing", "no such file")])
def test_a_config_path_that_is_no_settings_file_names_the_cause(tmp_path, capsys, kind, expected):
    path = tmp_path / "settings.json"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "latin-1":
        path.write_bytes('{"prompt": "Grüße"}'.encode("latin-1"))
    assert cli.main(["generate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_a_missing_required_option_is_named(capsys):
    assert cli.main(["generate", "--prompt", "x"]) == 2
    assert "missing RUN (or --run)" in capsys.readouterr().err


def test_a_usage_error_returns_2_and_shows_the_usage(capsys):
    assert cli.main(["generate", "--run", "r", "--prompt", "x", "--dtype", "fp64"]) == 2
    assert "invalid choice: 'fp64'" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"attnkit {installed_version()}"


def test_the_version_where_attnkit_is_not_installed_is_said_alike_by_the_command_and_a_stored_run(monkeypatch, capsys):
    """One installed_version serves `attnkit --version` and an experiment's code_version (each had its own text)."""
    from importlib import metadata

    from attnkit.experiments import base

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out.strip() == "attnkit unknown (not installed)"
    assert base.code_version().startswith("attnkit unknown (not installed)")


def test_only_the_chosen_command_gets_its_options():
    parsers = subparsers(cli.build_parser(["generate", "--run", "r", "--prompt", "x"]))
    assert any("--prompt" in a.option_strings for a in parsers["generate"]._actions)
    assert not any("--max-steps" in a.option_strings for a in parsers["train"]._actions)
    assert cli._chosen(["-v", "tokenizer", "train", "--out", "t"]) == "tokenizer train"


def test_python_dash_m_attnkit_runs_the_command_line():
    done = subprocess.run([sys.executable, "-m", "attnkit", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("attnkit "), done.stderr


def test_presets_name_prints_the_whole_config(capsys):
    name = presets.names()[0]
    assert cli.main(["presets", name]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(presets.get(name).to_json())
    assert cli.main(["presets", "no-such-preset"]) == 2


# The generator itself, on a dataclass of every kind of field --------------------------------------------------
@dataclass(frozen=True)
class Example:
    path: str  # a required path
    kind: Literal["a", "b"] = "a"  # one of two kinds
    flag: bool = False  # a switch
    sizes: tuple[int, ...] = ()  # several numbers
    names: tuple[str, ...] = field(default=("x",), metadata={"sep": ","})  # names, with commas too
    level: int | None = None  # a number or nothing
    mode: str | bool = field(default=False, metadata={"const": True})  # bare: True; or a word
    """given bare: True; or a word; this help comes from the attribute docstring"""


def _example(argv: list[str]) -> Example:
    parser = argparse.ArgumentParser()
    options.add_fields(parser, Example)
    return options.build(Example, options.given(parser.parse_args(argv), Example))


def test_fields_become_options_of_their_type():
    got = _example(["--path", "p", "--kind", "b", "--flag", "--sizes", "1", "2", "--names", "a,b", "c",
                    "--names", "d", "--level", "3", "--mode"])
    assert got == Example(path="p", kind="b", flag=True, sizes=(1, 2), names=("a", "b", "c", "d"), level=3,
                          mode=True)
    assert _example(["--path", "p", "--no-flag", "--mode", "word"]) == Example(path="p", mode="word")
    with pytest.raises(SystemExit):
        _example(["--path", "p", "--kind", "c"])


def test_help_comes_from_the_comment_or_the_attribute_docstring():
    helps = options.field_help(Example)
    assert helps["kind"] == "one of two kinds"
    assert helps["mode"].startswith("given bare: True; or a word; this help comes from")
    assert options.help_text(Example, "names") == "names, with commas too (default: x)"
    assert options.help_text(Example, "path") == "a required path (required)"


def test_a_required_field_not_given_is_an_input_error():
    with pytest.raises(InputError, match="missing --path"):
        _example([])


# Every fix an error names exists on its command ----------------------------------------------------------------
def _labelled_lines(n: int, bad: dict[int, str]) -> str:
    lines = [f"{i % 2} a sentence number {i}" for i in range(n)]
    for line, text in bad.items():
        lines[line - 1] = text
    return "\n".join(lines) + "\n"


def test_every_flag_an_error_suggests_exists_on_its_command(tmp_path, capsys):
    """Bad invocations of each kind the CLI meets: each ends in one error line, saying what it should, and every
    --flag it names as a fix is one of that command's options."""
    runs = tiny_runs(tmp_path)
    files = {
        "nohead.tsv": "1\tgood film\n0\tbad film\n",
        "unlabelled.txt": _labelled_lines(40, {7: "the film forgot its label", 21: "the other one too"}),
        "labelled.txt": _labelled_lines(40, {}),
        "oneline.txt": "one line of text\n",
        "short.txt": "a line of text\n" * 10,
        "plain.txt": "a fine film\nnot good at all\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo.json")
    out, t = str(tmp_path / "out"), str(tmp_path)
    lm, clf = str(runs["lm"]), str(runs["clf"])
    tiny = ["--set", "d_model=16", "--set", "n_layers=1", "--set", "n_heads=2", "--set", "d_ff=32", "--set",
            "max_seq_len=24", "--no-progress", "--out", out]
    cases = [  # (argv, what the error says)
        (["train", "--task", "classify", "--data", f"{t}/nohead.tsv", *tiny], "has no text column"),
        (["train", "--task", "classify", "--data", f"{t}/unlabelled.txt", *tiny], "unlabelled.txt, line 7"),
        (["train", "--task", "classify", "--data", f"{t}/labelled.txt", "--val-data", f"{t}/unlabelled.txt", *tiny],
         "unlabelled.txt, line 7: the label 'the' is not among the known labels"),
        (["train", "--data", f"{t}/oneline.txt", "--tokenizer", "char", *tiny], "training split of"),
        (["train", "--data", f"{t}/short.txt", "--tokenizer", "char", *tiny], "validation split of"),
        (["train", "--sample-tokens", "-5", *tiny], "sample_tokens=-5"),
        (["train", "--resume", "--overwrite", *tiny], "--overwrite would replace"),
        (["train", "--model-config", f"{t}/dir", "--data", "synthetic:copy", *tiny], "is a directory"),
        (["train", "--task", "translate", *tiny], "needs --data"),
        (["train", "--task", "mlm", "--data", "synthetic:copy", "--set", f"val_data={t}/plain.txt", *tiny],
         "--val-data does not apply to --task mlm"),
        (["generate", "--run", lm, "--prompt", "ab", "--top-k", "0"], "top_k=0"),
        (["generate", "--run", lm, "--prompt", "ab", "--stop", ""], "stop string is empty"),
        (["generate", "--run", f"{t}/nosuch", "--prompt", "ab"], "does not exist"),
        (["generate", "--config", f"{t}/fifo.json"], "is a FIFO, not a regular file"),
        (["generate", "--run", lm, "--prompt", "ab", "--int8", "--int4"], "forms of quantized weights; give one"),
        (["generate", "--run", lm, "--prompt", "ab", "--int8-dynamic", "--compile"], "runs eagerly"),
        (["generate", "--run", lm, "--prompt", "ab", "--int8-dynamic", "--device", "meta"], "CPU only"),
        (["eval", "--run", lm, "--data", f"{t}/plain.txt", "--int8-dynamic", "--int4"],
         "forms of quantized weights; give one"),
        (["eval", "--run", clf, "--data", f"{t}/unlabelled.txt"], "unlabelled.txt, line 7"),
        (["eval", "--run", clf, "--data", f"{t}/plain.txt"], "not among the known labels"),
        (["eval", "--run", clf, "--data", f"{t}/nohead.tsv"], "has no text column"),
        (["eval", "--run", lm, "--data", f"{t}/plain.txt", "--window", "0"], "window=0"),
        (["classify", "--run", clf], "--text TEXT"),
        (["classify", "--run", lm, "--text", "ab"], "its family is 'decoder'"),
        (["classify", "--run", clf, "--text", "ab", "--batch-size", "0"], "batch_size=0"),
        (["convert", "--run", lm, "--from-hf", t], "one of the two"),
        (["experiment"], "--list"),
    ]
    parsers = subparsers(cli.build_parser())
    for argv, expected in cases:
        assert cli.main(argv) == 2, argv
        printed = capsys.readouterr()
        errors = [line for line in printed.err.splitlines() if line.startswith("attnkit: error: ")]
        assert len(errors) == 1 and expected in errors[0] and printed.out == "", (argv, printed)
        flags = {s for action in parsers[cli._chosen(argv)]._actions for s in action.option_strings}
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", errors[0]):
            assert flag in flags, f"attnkit {' '.join(argv)}: the error names {flag}, which the command lacks: " \
                                  f"{errors[0]}"
