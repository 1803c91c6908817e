"""Issue 28's frictions of the command line and public helpers, tried again as a new user writes them: each one
now works, or ends in one line that names the fix."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import re
from pathlib import Path

import pytest
from cli_helpers import subparsers, tiny_runs

import attnkit
from attnkit import cli, options
from attnkit.tasks import own_options, task_names, task_spec
from attnkit.train.plan import plan_training


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    return tiny_runs(tmp_path_factory.mktemp("runs"))


def _one_error(capsys, argv: list[str]) -> str:
    """Run `attnkit ARGV`, which must fail with exit status 2 and one error line; return that line."""
    assert cli.main(argv) == 2, argv
    printed = capsys.readouterr()
    errors = [line for line in printed.err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in printed.err and printed.out == "", (argv, printed)
    return errors[0]


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's parser with its options, by name ("generate", "tokenizer train")."""
    found = {}
    for command in cli.COMMANDS:
        parser = argparse.ArgumentParser(prog=f"attnkit {command.name}")
        cli.add_command_options(parser, command)
        found[command.name] = parser
    return found


RUN_COMMANDS = [c for c in cli.COMMANDS if "run" in options.fields_of(c.classes()[0])]


def _required(command: cli.Command) -> list[str]:
    """Placeholder values for the command's required options other than the run (`--prompt x`, `--data x`)."""
    words = []
    for name, f in options.fields_of(command.classes()[0]).items():
        if name != "run" and options.field_default(f) is dataclasses.MISSING:
            words += [options.flag(name), "x"]
    return words


def test_the_commands_that_read_a_run_are_the_expected_ones():
    names = {c.name for c in RUN_COMMANDS}
    assert {"generate", "translate", "classify", "eval", "viz", "average", "convert"} <= names


@pytest.mark.parametrize("command", RUN_COMMANDS, ids=lambda c: c.name)
def test_every_command_takes_the_run_as_a_positional_argument_or_as_run(command):
    positional = cli.parse([command.name, "runs/quick", *_required(command)]).settings
    flagged = cli.parse([command.name, *_required(command), "--run", "runs/quick"]).settings
    assert positional.run == flagged.run == "runs/quick"
    assert positional == flagged


def test_the_run_given_twice_differently_is_a_usage_error(capsys):
    line = _one_error(capsys, ["generate", "runs/a", "--run", "runs/b", "--prompt", "x"])
    assert line.startswith("attnkit generate: error: RUN is given twice")


def test_generate_takes_the_run_positionally_and_continues_the_prompt(runs, capsys):
    assert cli.main(["generate", str(runs["lm"]), "--prompt", "ab", "--max-new-tokens", "3", "--seed", "0"]) == 0
    assert capsys.readouterr().out.startswith("ab")


def test_convert_takes_its_source_run_positionally_and_keeps_run(runs, tmp_path, capsys):
    pytest.importorskip("transformers")
    assert cli.main(["convert", str(runs["lm"]), "--to-hf", str(tmp_path / "new")]) == 0
    assert cli.main(["convert", "--run", str(runs["lm"]), "--to-hf", str(tmp_path / "old")]) == 0
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "new" / name).read_bytes() == (tmp_path / "old" / name).read_bytes()
    capsys.readouterr()
    line = _one_error(capsys, ["convert", str(runs["lm"]), "--out", str(tmp_path / "x")])
    assert "--to-hf DIR" in line


@pytest.mark.parametrize("command", cli.COMMANDS, ids=lambda c: c.name)
def test_usage_lines_show_required_arguments_without_brackets(command):
    parsers = subparsers(cli.build_parser([*command.name.split()]))
    usage = parsers[command.name].format_usage()
    for cls in command.classes():
        for name, f in options.fields_of(cls).items():
            if options.field_default(f) is not dataclasses.MISSING:
                continue
            shown = name.upper() if name in cli.RUN or f.metadata.get("positional") else options.flag(name)
            assert re.search(rf"(?<!\[){re.escape(shown)}\b", usage), f"{command.name}: {shown} not in {usage}"
            assert f"[{shown}" not in usage, f"{command.name}: {shown} shown as optional in {usage}"


@pytest.mark.parametrize("argv, usage", [
    (["generate", "runs/a", "runs/b", "--prompt", "x"], "usage: attnkit generate RUN --prompt PROMPT"),
    (["average", "runs/a", "--lats", "3"], "usage: attnkit average RUN"),
    (["tokenizer", "train", "--out", "t", "--kind", "unigram"], "usage: attnkit tokenizer train --out OUT"),
    (["eval", "runs/a"], "usage: attnkit eval RUN --data DATA"),
    (["generate"], "usage: attnkit generate RUN --prompt PROMPT [options]\nattnkit generate: error: missing RUN (or "
                   "--run), --prompt: give them on the command line or in the --config file"),
])
def test_a_parse_error_prints_the_commands_own_usage(argv, usage, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and "{recipes,presets" not in err, err


@pytest.mark.parametrize("argv, suggestion", [
    (["generate", "runs/a", "--promt", "x"], "--promt (did you mean --prompt?)"),
    (["train", "--max-stpes", "3"], "did you mean --max-steps?"),
    (["train", "--set", "n_layer=2"], "--set n_layer: no such setting; did you mean n_layers?"),
    (["train", "--preset", "gpt2-tinny"], "did you mean 'gpt2-tiny'?"),
    (["train", "--recipe", "shakespeare-chr"], "did you mean 'shakespeare-char'?"),
    (["train", "--task", "clasify"], "did you mean"),
    (["presets", "bert-tinny"], "did you mean 'bert-tiny'?"),
    (["experiment", "scaled-dott"], "did you mean 'scaled-dot'?"),
    (["genrate", "runs/a"], "did you mean 'generate'?"),
    (["generate", "runs/a", "--prompt", "x", "--dtype", "bf61"], "did you mean 'bf16'?"),
])
def test_an_unknown_name_is_answered_with_the_nearest_one(argv, suggestion, tmp_path, capsys):
    if argv[0] == "train":
        argv = [*argv, "--out", str(tmp_path / "run")]
    line = _one_error(capsys, argv)
    assert suggestion in line, line
    assert "d_model" not in line, "a list of every name, not the nearest"
    assert not (tmp_path / "run").exists()


def test_an_unknown_key_in_a_config_file_is_answered_with_the_nearest_one(tmp_path, capsys):
    path = tmp_path / "generate.json"
    path.write_text('{"run": "runs/a", "promt": "x"}')
    assert "'promt' (did you mean 'prompt'?)" in _one_error(capsys, ["generate", "--config", str(path)])


def test_classify_shows_only_the_options_that_apply_to_a_model_that_decodes_nothing(capsys):
    parsers = _parsers()
    flags = {name: {s for a in p._actions for s in a.option_strings} for name, p in parsers.items()}
    decoding = {"--compile", "--int8", "--int8-dynamic"}
    assert decoding <= flags["generate"] and decoding <= flags["chat"] and decoding <= flags["translate"]
    assert not decoding & flags["classify"]
    assert {"--device", "--dtype", "--text", "--input", "--batch-size"} <= flags["classify"]
    for flag in decoding:  # whose option it is, not the nearest of classify's own (--int8: --input)
        line = _one_error(capsys, ["classify", "runs/a", "--text", "x", flag])
        assert f"{flag} (an option of generate, chat, translate" in line and "not of classify" in line, line


def test_tokenizer_train_shows_its_kinds_and_defaults_to_trains_vocabulary_size():
    from attnkit.train.job import DataConfig

    text = _parsers()["tokenizer train"].format_help()
    assert "--kind {char,bpe,wordpiece}" in text
    assert f"none: train's default --vocab-size ({DataConfig().vocab_size})" in " ".join(text.split())
    assert cli.TokenizerTrainSettings(out="t").vocab_size is None  # so --vocab-size given with --kind char is seen
    assert cli.BPE_VOCAB_SIZE == DataConfig().vocab_size  # what the command trains when no size is given


@pytest.mark.parametrize("name", ["gpt2", "meta-llama/Llama-2-7b-hf"])
def test_loading_a_hub_name_says_nothing_is_downloaded_and_names_convert(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(attnkit.CheckpointError, match="attnkit convert --from-hf DIR --out runs/NAME"):
        attnkit.load(name)


def test_a_missing_run_under_an_existing_folder_is_not_taken_for_a_hub_name(tmp_path):
    with pytest.raises(attnkit.CheckpointError, match="does not exist") as error:
        attnkit.load(tmp_path / "quick")
    assert "convert" not in str(error.value)


def test_count_parameters_and_build_model_take_a_model_a_config_its_fields_a_preset_or_a_loaded_run(runs):
    config = attnkit.presets.get("gpt2-tiny")
    expected = sum(p.numel() for p in {id(p): p for p in attnkit.build_model(config).parameters()}.values())
    assert attnkit.count_parameters(config) == expected
    assert attnkit.count_parameters(attnkit.build_model(config)) == expected
    assert attnkit.count_parameters("gpt2-tiny") == expected
    loaded = attnkit.load(runs["clf"], device="cpu")
    assert attnkit.count_parameters(loaded) == attnkit.count_parameters(loaded.config)
    assert attnkit.count_parameters(config.to_dict()) == expected
    assert attnkit.count_parameters(attnkit.build_model("gpt2-tiny")) == expected
    with pytest.raises(attnkit.ConfigError, match="expected a model config"):
        attnkit.count_parameters(3)


def test_a_task_the_preset_cannot_train_is_refused_before_a_tokenizer_is_trained(tmp_path, monkeypatch, capsys):
    import attnkit.tokenize

    def no_training(*args, **kwargs):
        raise AssertionError("a BPE was trained before the task was checked against the model")

    monkeypatch.setattr(attnkit.tokenize, "train_bpe", no_training)
    line = _one_error(capsys, ["train", "--preset", "bert-tiny", "--out", str(tmp_path / "run")])
    assert "--task lm" in line and "encoder" in line
    assert not (tmp_path / "run").exists()


def test_train_task_mlm_needs_no_set_encoder_head():
    from attnkit.train.job import check_request

    invocation = cli.parse(["train", "--task", "mlm", "--data", "corpus.txt"])
    config, data, _ = check_request(cli.train_request(invocation.settings, *invocation.sections))
    assert (data.task, config.family, config.encoder_head) == ("mlm", "encoder", "mlm")


def test_a_decoders_pipeline_offers_generate_alone_and_classify_on_it_names_the_command_that_fits(runs, capsys):
    pipeline = attnkit.load(runs["lm"], device="cpu")
    assert hasattr(pipeline, "generate") and not hasattr(pipeline, "classify") and not hasattr(pipeline, "translate")
    line = _one_error(capsys, ["classify", str(runs["lm"]), "--text", "ab"])
    assert "use generate instead" in line


def _shown(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}


def test_eval_of_a_run_shows_only_the_options_of_its_task(runs, capsys):
    """Given the run, eval reads its task (config.json, task.json) before it builds its options: int8 and
    decoding options for a language model, not for a classifier, and each option of another task in one line."""
    clf = _shown(subparsers(cli.build_parser(argv := ["eval", str(runs["clf"]), "--help"]))["eval"])
    lm = _shown(subparsers(cli.build_parser(["eval", "--run", str(runs["lm"]), "--help"]))["eval"])
    everything = _shown(_parsers()["eval"])  # no run named: every option, each help saying what it is for
    assert {"--int8", "--int8-dynamic", "--window", "--stride", "--beam-size", "--tag-column"} & clf == set()
    assert {"--data", "--batch-size", "--bad-labels", "--device", "--out"} <= clf
    assert {"--int8", "--int8-dynamic", "--window", "--stride"} <= lm
    assert {"--bad-labels", "--tag-column", "--beam-size", "--batch-size", "--seed"} & lm == set()
    assert clf | lm <= everything and {"--int8", "--bad-labels", "--tag-column"} <= everything
    with pytest.raises(SystemExit):
        cli.main(argv)
    help_text = capsys.readouterr().out
    assert f"--int8-dynamic does not apply to {runs['clf']}, whose task is classify: it is for runs of lm, " \
           "translate" in help_text


@pytest.mark.parametrize("words", [["--int8-dynamic"], ["--no-int8"], ["--beam-size", "4"], ["--window=8"]])
def test_an_option_of_another_tasks_eval_ends_in_one_line_naming_whose_it_is(runs, capsys, words):
    flag = words[0].partition("=")[0].replace("--no-", "--")
    line = _one_error(capsys, ["eval", str(runs["clf"]), "--data", "x.txt", *words])
    assert f"{flag} does not apply to {runs['clf']}, whose task is classify: it is for runs of " in line, line
    line = _one_error(capsys, ["eval", str(runs["lm"]), "--data", "x.txt", "--bad-labels", "skip"])
    assert "--bad-labels does not apply" in line and "it is for runs of classify" in line, line


def test_an_option_of_another_tasks_eval_in_a_config_file_is_refused_before_anything_loads(runs, tmp_path, capsys,
                                                                                          monkeypatch):
    monkeypatch.setattr("attnkit.train.evaluate.evaluate_run", lambda *a, **k: pytest.fail("the run was scored"))
    (tmp_path / "eval.json").write_text('{"int8": true}')
    line = _one_error(capsys, ["eval", str(runs["clf"]), "--data", "x.txt", "--config", str(tmp_path / "eval.json")])
    assert "--int8 does not apply" in line and "drop it" in line, line


def test_eval_of_a_tagging_run_shows_its_tasks_own_option(tmp_path):
    from attnkit import build_model
    from attnkit.checkpoint import save_model
    from attnkit.config import ModelConfig
    from attnkit.tokenize import CharTokenizer

    tokenizer = CharTokenizer("abc ")
    config = ModelConfig(family="encoder", encoder_head="tag", vocab_size=tokenizer.vocab_size, d_model=16,
                         n_layers=1, n_heads=2, d_ff=32, max_seq_len=16)
    save_model(build_model(config), config, tmp_path / "tag")
    tokenizer.save(tmp_path / "tag" / "tokenizer")
    shown = _shown(subparsers(cli.build_parser(["eval", str(tmp_path / "tag"), "--help"]))["eval"])
    assert {"--tag-column", "--batch-size"} <= shown and not {"--int8", "--bad-labels", "--window"} & shown


def test_eval_refuses_another_tasks_option_in_a_config_file_that_names_the_run_too(runs, tmp_path, capsys):
    (tmp_path / "eval.json").write_text(f'{{"run": "{runs["clf"]}", "data": ["x.txt"], "window": 8}}')
    line = _one_error(capsys, ["eval", "--config", str(tmp_path / "eval.json")])
    assert f"--window does not apply to {runs['clf']}, whose task is classify: it is for runs of lm" in line, line


# train shows the options of the task it will train ---------------------------------------------------------------
def _train_help(argv: list[str]) -> tuple[set[str], str]:
    """The flags `attnkit train ARGV --help` shows, and the help it prints."""
    parser = subparsers(cli.build_parser(["train", *argv, "--help"]))["train"]
    return _shown(parser), parser.format_help()


def test_train_shows_the_options_of_the_task_it_trains():
    lm, lm_help = _train_help(["--task", "lm"])
    tag, _ = _train_help(["--task", "tag"])
    translate, _ = _train_help(["--task=translate"])
    assert "--tag-column" not in lm and "--tag-column" in tag
    assert {"--max-bytes", "--eval-batches", "--sample-tokens"} <= lm
    assert not {"--src-lang", "--val-data", "--bad-labels", "--bleu-samples", "--batch-tokens"} & lm
    assert {"--src-lang", "--tgt-lang", "--bleu-samples", "--val-data"} <= translate
    assert not {"--max-bytes", "--sample-tokens", "--tag-column"} & translate
    assert {"--out", "--preset", "--set", "--max-steps", "--lr", "--data", "--seq-len", "--recipe"} <= lm & tag
    assert "  --tag-column does not apply to --task lm: it is for --task tag\n" in lm_help
    assert _train_help([])[0] == lm  # nothing named: the default task's


@pytest.mark.parametrize("task", task_names())
def test_train_hides_only_task_options_and_names_each_hidden_one_in_a_line(task):
    from attnkit.train.job import DataConfig, applicable

    shown, text = _train_help(["--task", task])
    hidden = _shown(_parsers()["train"]) - shown
    depends = {options.flag(name) for name in [*options.fields_of(DataConfig), *own_options(),
                                               "sample_tokens"]}
    assert hidden <= depends  # a model, training or run option never depends on the task
    assert hidden, "every task leaves some other task's options out of --help"
    assert {options.flag(name) for name in applicable(task_spec(task))} <= shown
    for flag in hidden:
        assert re.search(rf"^  {flag} does not apply to --task {task}: it is for --task \w", text, re.M), flag


@pytest.mark.parametrize("argv, flag, owners", [
    (["--task", "lm", "--tag-column", "NER"], "--tag-column", ["tag"]),
    (["--src-lang", "de"], "--src-lang", ["translate"]),
    (["--task", "classify", "--sample-tokens", "0"], "--sample-tokens", ["lm"]),
    (["--task", "translate", "--max-bytes=9"], "--max-bytes", ["lm", "mlm"]),
    (["--task", "mlm", "--val-data", "v.txt"], "--val-data", ["classify", "tag", "translate"]),
])
def test_an_option_of_another_task_given_to_train_ends_in_one_line_naming_its_tasks(argv, flag, owners, tmp_path,
                                                                                    capsys):
    line = _one_error(capsys, ["train", *argv, "--out", str(tmp_path / "run")])
    task = argv[argv.index("--task") + 1] if "--task" in argv else "lm"
    assert f"{flag} does not apply to --task {task}: it is for --task " in line, line
    assert all(owner in line.rpartition("--task ")[2] for owner in owners), line
    assert not (tmp_path / "run").exists()


def test_another_tasks_setting_in_set_or_a_config_file_is_refused_before_a_tokenizer_is_trained(tmp_path, monkeypatch,
                                                                                                capsys):
    import attnkit.train

    class Prepared(Exception):
        pass

    def prepared(*args, **kwargs):
        raise Prepared

    monkeypatch.setattr("attnkit.tokenize.train_bpe", lambda *a, **k: pytest.fail("a tokenizer was trained"))
    out = ["--out", str(tmp_path / "run")]
    line = _one_error(capsys, ["train", "--task", "lm", "--set", "src_lang=de", *out])
    assert line.endswith("--src-lang does not apply to --task lm: it is for --task translate; drop it"), line
    (tmp_path / "run.json").write_text('{"task": "classify", "max_bytes": 1000}')
    line = _one_error(capsys, ["train", "--config", str(tmp_path / "run.json"), *out])
    assert "--max-bytes does not apply to --task classify: it is for --task lm, mlm; drop it from --config" in line
    (tmp_path / "set.json").write_text('{"task": "tag", "set": ["bleu_samples=4"]}')
    line = _one_error(capsys, ["train", "--config", str(tmp_path / "set.json"), *out])
    assert "--bleu-samples does not apply to --task tag: it is for --task translate" in line, line
    assert not (tmp_path / "run").exists()
    monkeypatch.setattr(attnkit.train, "prepare", prepared)  # its own task's settings pass the checks
    with pytest.raises(Prepared):
        cli.main(["train", "--task", "translate", "--set", "bleu_samples=4", "--set", "src_lang=de", *out])


def test_a_recipe_or_a_config_file_naming_a_task_shows_that_tasks_options(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNKIT_DATA", raising=False)  # --help reads no data: the recipe's paths are not looked up
    translate, _ = _train_help(["--recipe", "multi30k-transformer"])
    assert {"--src-lang", "--bleu-samples"} <= translate and "--max-bytes" not in translate
    lm, _ = _train_help(["--recipe", "shakespeare-char"])
    assert "--max-bytes" in lm and "--src-lang" not in lm
    assert "--tag-column" in _train_help(["--recipe", "shakespeare-char", "--task", "tag"])[0]  # the command line wins
    (tmp_path / "run.yaml").write_text("task: tag\nmax_steps: 5\n")
    pytest.importorskip("yaml")
    assert "--tag-column" in _train_help(["--config", str(tmp_path / "run.yaml")])[0]


def test_train_resume_shows_the_options_of_the_resumed_runs_task(runs):
    shown, text = _train_help(["--resume", str(runs["clf"])])
    assert "--bad-labels" in shown and not {"--max-bytes", "--sample-tokens"} & shown
    assert f"--max-bytes does not apply to {runs['clf']}, whose task is classify: it is for runs of lm, mlm" in text
    assert _train_help(["--out", str(runs["lm"]), "--resume"])[0] == _train_help(["--task", "lm"])[0]


@pytest.mark.parametrize("argv", [["--preset", "bert-tiny"], ["--task", "clasify"], ["--resume", "runs/no-such"],
                                  ["--set", "family=encoder"]])
def test_train_shows_every_option_when_no_task_can_be_told(argv):
    """A model the default task does not train (the run would be refused), an unknown task, a run that is not
    there: no task to show the options of, so all of them."""
    assert _train_help(argv)[0] == _shown(_parsers()["train"])


def test_viz_and_serve_show_only_what_a_run_of_its_task_reads(runs, capsys):
    viz = _shown(subparsers(cli.build_parser(["viz", str(runs["lm"]), "--help"]))["viz"])
    assert "--text" in viz and not {"--target", "--translate", "--max-length"} & viz
    assert {"--target", "--translate", "--max-length"} <= _shown(_parsers()["viz"])
    serve_clf = _shown(subparsers(cli.build_parser(["serve", str(runs["clf"]), "--help"]))["serve"])
    serve_lm = _shown(subparsers(cli.build_parser(["serve", str(runs["lm"]), "--help"]))["serve"])
    decoding = {"--max-batch", "--max-queue", "--max-tokens"}
    assert decoding <= serve_lm and not decoding & serve_clf and "--port" in serve_clf
    line = _one_error(capsys, ["viz", str(runs["lm"]), "--text", "ab", "--target", "ba"])
    assert f"--target does not apply to {runs['lm']}, whose task is lm: it is for runs of translate" in line, line
    line = _one_error(capsys, ["serve", str(runs["clf"]), "--max-tokens", "5"])
    assert "--max-tokens does not apply" in line and "it is for runs of lm" in line, line


@pytest.mark.parametrize("words, flag, goes_with", [(["--type", "q8_0"], "--type", "--to-gguf"),
                                                    (["--chat-template", "t.jinja"], "--chat-template", "--to-gguf"),
                                                    (["--dtype", "bf16"], "--dtype", "--from-hf"),
                                                    (["--allow-pickle"], "--allow-pickle", "--from-hf")])
def test_a_convert_option_of_another_direction_is_refused_not_ignored(runs, tmp_path, capsys, words, flag, goes_with):
    line = _one_error(capsys, ["convert", str(runs["lm"]), "--to-hf", str(tmp_path / "hf"), *words])
    assert f"{flag} goes with {goes_with}" in line and "drop it" in line, line
    assert not (tmp_path / "hf").exists()


def test_convert_reads_the_run_given_right_after_the_target_flag(runs, tmp_path, capsys):
    """`convert --to-hf RUN OUT` (the order `convert --to-gguf RUN OUT.gguf` is written in the export issue) writes
    what `convert RUN --to-hf OUT` writes, for every target alike; a run is never taken for the output."""
    pytest.importorskip("transformers")
    assert cli.main(["convert", "--to-hf", str(runs["lm"]), str(tmp_path / "a")]) == 0
    assert cli.main(["convert", str(runs["lm"]), "--to-hf", str(tmp_path / "b")]) == 0
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    capsys.readouterr()
    line = _one_error(capsys, ["convert", str(runs["lm"]), "--to-hf", str(tmp_path / "a")])
    assert "already holds a model's files" in line


def test_train_says_it_does_not_compile_a_recurrent_model_asked_to(tmp_path, caplog):  # and samples in 16 tokens
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat. " * 80)
    args = ["train", "--out", str(tmp_path / "lm"), "--task", "lm", "--preset", "lstm-lm-tiny", "--data", str(text),
            "--tokenizer", "char", "--batch-size", "4", "--max-steps", "1", "--no-progress", "--set", "max_seq_len=16"]
    with caplog.at_level(logging.WARNING):
        assert cli.main([*args, "--compile", "blocks"]) == 0
    said = [r.getMessage() for r in caplog.records if "--compile" in r.getMessage()]
    assert said == ["--compile blocks is not followed: compilation eager, as Dynamo does not trace nn.RNN, nn.GRU or "
                    "nn.LSTM (each is already one fused kernel call); a recurrent model trains eagerly"]
    model = attnkit.build_model(attnkit.ModelConfig(family="recurrent-lm", vocab_size=12, cell="lstm", hidden_size=8))
    for compile, said in (("auto", None), ("off", None), ("model", "--compile model is not followed")):
        choices = plan_training(model, family="recurrent-lm", device="cpu", compile=compile).choices
        assert [c.departure()[:31] for c in choices if c.departure()] == ([said] if said else [])
