"""The task registry: every task said once (families, head, pipeline method), the task implying its head,
the one evaluation loop giving training's numbers in `attnkit eval`, and no task name compared outside the
registry."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from tagging_data import tagging_sentences

import attnkit
from attnkit import build_model, cli, presets
from attnkit.checkpoint import save_model
from attnkit.config import HEADS, ModelConfig, register_head
from attnkit.errors import ConfigError, InputError
from attnkit.generate import translate_batched
from attnkit.interop.keymaps import FAMILIES as HF_FAMILIES
from attnkit.tasks import own_options, register, task_names, task_of_config, task_spec, tasks, unregister
from attnkit.tasks.bleu import translation_scores
from attnkit.tasks.conll import write_conll
from attnkit.tokenize import CharTokenizer
from attnkit.train import TrainRequest, prepare
from attnkit.train.evaluate import EVERY_TASK, EvalSettings, evaluate_run
from attnkit.train.job import DataConfig, check_request

SRC = Path(__file__).resolve().parents[1] / "src" / "attnkit"
TINY = ["d_model=32", "n_layers=1", "n_heads=2", "d_ff=64", "max_seq_len=32"]


@pytest.fixture(autouse=True)
def single_threaded():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_every_task_is_registered_once_with_what_it_needs():
    assert set(task_names()) >= {"lm", "mlm", "translate", "classify", "tag"}
    for spec in tasks():
        config = ModelConfig(**spec.default_model)
        found = task_of_config(config)  # its default model is built for it, and for it alone; chat and dpo fine-tune
        assert found is spec or (spec.name, found.name) in {("chat", "lm"), ("dpo", "lm")}  # lm's model: their runs
        # say chat or dpo in task.json
        assert config.family in spec.families
    with pytest.raises(ConfigError, match="did you mean classify"):
        task_spec("clasify")
    data_fields = {f.name for f in dataclasses.fields(DataConfig)}
    assert all(set(spec.options) <= data_fields for spec in tasks())  # the options a task reads exist
    eval_fields = {f.name for f in dataclasses.fields(EvalSettings)}
    assert all(set(spec.eval_options) <= eval_fields for spec in tasks())
    read_by_some = set(EVERY_TASK).union(*(spec.eval_options for spec in tasks()))
    assert read_by_some == eval_fields  # no eval option is read by no task


def test_eval_without_files_names_what_each_task_reads():
    with pytest.raises(InputError, match=r"tag: CoNLL or \.conllu files.*translate: a TSV file"):
        EvalSettings(run="runs/x", data=())


def test_hugging_face_classes_are_declared_by_their_tasks_and_listed_by_interop():
    """Each task's Hugging Face classes are listed under their model_type, implying a config the task fits; the
    interop families name no class of a task themselves (only their bare models)."""
    for spec in tasks():
        for hf_class in spec.hf_architectures:
            family = HF_FAMILIES[hf_class.model_type]
            assert family.ours_fixed["family"] in spec.families, (spec.name, hf_class.name)
            fields = {**family.ours_fixed, **family.architectures[hf_class.name]}
            assert task_of_config(presets_like(fields)) is spec, (spec.name, hf_class.name)
    declared = {c.name for spec in tasks() for c in spec.hf_architectures}
    for family in HF_FAMILIES.values():
        assert not declared & set(family.own_architectures)
        assert family.default_architecture in family.architectures


def presets_like(fields: dict) -> ModelConfig:
    """A small config with `fields` (the family's fixed fields and a class's head)."""
    return ModelConfig(**{"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "vocab_size": 40, **fields})


def test_the_task_implies_its_head_and_a_contradicting_set_is_refused(tmp_path):
    config, _, _ = check_request(TrainRequest(out=str(tmp_path), task="mlm", preset="bert-tiny"))
    assert config.encoder_head == "mlm"  # bert-tiny is a classifier; --task mlm asked for the masked-LM head
    config, _, _ = check_request(TrainRequest(out=str(tmp_path), task="tag"))
    assert config.encoder_head == "tag"
    with pytest.raises(ConfigError, match="--task mlm needs encoder_head='mlm'.*drop that --set"):
        check_request(TrainRequest(out=str(tmp_path), task="mlm", overrides=["encoder_head=classify"]))
    with pytest.raises(ConfigError, match="--task lm trains a decoder"):
        check_request(TrainRequest(out=str(tmp_path), task="lm", preset="bert-tiny"))


def test_a_mismatch_of_task_and_family_is_refused_before_a_tokenizer_is_trained(tmp_path, monkeypatch):
    def no_tokenizer(*args, **kwargs):
        raise AssertionError("a tokenizer was trained before the task was checked")

    monkeypatch.setattr("attnkit.train.job.train_tokenizer", no_tokenizer)
    text = tmp_path / "t.txt"
    text.write_text("some text " * 100, encoding="utf-8")
    with pytest.raises(ConfigError, match="--task lm trains a decoder"):
        prepare(TrainRequest(out=str(tmp_path / "run"), task="lm", preset="bert-tiny", data={"data": (str(text),)}))


def test_the_pipeline_has_only_the_method_of_its_run(tmp_path):
    tokenizer = CharTokenizer.from_texts(["abc [MASK]"])
    for head, method in (("classify", "classify"), ("mlm", "fill_mask"), ("tag", "tag")):
        config = ModelConfig(family="encoder", encoder_head=head, vocab_size=tokenizer.vocab_size, d_model=16,
                             n_layers=1, n_heads=2, d_ff=32, max_seq_len=16)
        save_model(build_model(config), config, tmp_path / head)
        tokenizer.save(tmp_path / head / "tokenizer")
        pipeline = attnkit.load(tmp_path / head)
        others = {"generate", "translate", "classify", "tag", "fill_mask"} - {method}
        assert hasattr(pipeline, method) and method in dir(pipeline)
        assert not any(hasattr(pipeline, m) for m in others) and not set(dir(pipeline)) & others
        with pytest.raises(InputError, match=f"use {method} instead"):
            getattr(pipeline, sorted(others)[0])


def _masked_lm_run(run: Path, tokenizer, max_seq_len: int = 16) -> torch.nn.Module:
    """A tiny random masked-LM run saved in `run`, with `tokenizer`; its model."""
    config = ModelConfig(family="encoder", encoder_head="mlm", vocab_size=tokenizer.vocab_size, d_model=16,
                         n_layers=1, n_heads=2, d_ff=32, max_seq_len=max_seq_len)
    torch.manual_seed(0)
    model = build_model(config).eval()
    save_model(model, config, run)
    tokenizer.save(run / "tokenizer")
    return model


def test_fill_mask_gives_the_top_k_tokens_at_each_mask(tmp_path):
    tokenizer = CharTokenizer.from_texts(["abcdef"])
    model = _masked_lm_run(tmp_path / "mlm", tokenizer)
    fills = attnkit.load(tmp_path / "mlm").fill_mask(["ab[MASK]d<mask>"], top_k=3)[0]
    assert [f.position for f in fills] == [0, 1] and all(len(f.candidates) == 3 for f in fills)
    mask, cls, sep = tokenizer.mask_id, tokenizer.cls_id or tokenizer.bos_id, tokenizer.sep_id or tokenizer.eos_id
    ids = [cls, *tokenizer.encode("ab"), mask, *tokenizer.encode("d"), mask, sep]
    with torch.no_grad():
        probs = model(torch.tensor([ids])).logits[0].softmax(-1)
    probs[:, mask] = 0.0  # the mask token is never its own fill
    for fill, where in zip(fills, (3, 5), strict=True):
        best = probs[where].topk(3)
        assert [p for _, p in fill.candidates] == pytest.approx(best.values.tolist())
        assert [t for t, _ in fill.candidates] == [tokenizer.decode([i], skip_special=False) for i in best.indices]
    every = attnkit.load(tmp_path / "mlm").fill_mask("a[MASK]", top_k=10_000)[0][0].candidates
    own = tokenizer.decode([mask], skip_special=False)
    assert len(every) == tokenizer.vocab_size - 1 and own not in [t for t, _ in every]
    with pytest.raises(InputError, match="holds no mask"):
        attnkit.load(tmp_path / "mlm").fill_mask("abc")
    with pytest.raises(InputError, match=r"texts are a string or a list of strings; got 5 \(int\)"):
        attnkit.load(tmp_path / "mlm").fill_mask(5)


def test_fill_mask_with_a_byte_level_bpe_masks_the_word_with_its_space(tmp_path):
    """A byte-level BPE writes a word with the space before it ('Ġmat'), so a masked-LM run learned masks that
    stand for such tokens; 'on the [MASK]' read as 'Ġthe', 'Ġ', MASK gave the model a lone space before the mask
    that its training never showed it (RoBERTa's <mask> takes the space before it for the same reason)."""
    from attnkit.tokenize import train_bpe

    text = "the cat sat on the mat . the dog sat on the log . " * 20
    tokenizer = train_bpe([text], vocab_size=300, special_tokens=["pad", "bos", "eos", "unk", "mask"])
    assert tokenizer.space_starts_word
    model = _masked_lm_run(tmp_path / "mlm", tokenizer, max_seq_len=32)
    whole = tokenizer.encode("the cat sat on the mat")
    ids = [tokenizer.bos_id, *whole[:-1], tokenizer.mask_id, tokenizer.eos_id]  # 'Ġmat' masked, as in training
    with torch.no_grad():
        probs = model(torch.tensor([ids])).logits[0, -2].softmax(-1)
    probs[tokenizer.mask_id] = 0.0
    fill = attnkit.load(tmp_path / "mlm").fill_mask("the cat sat on the [MASK]", top_k=3)[0][0]
    assert [p for _, p in fill.candidates] == pytest.approx(probs.topk(3).values.tolist())
    assert not CharTokenizer.from_texts(["a b"]).space_starts_word  # a character model's space is a character


def test_fill_mask_on_the_command_line(tmp_path, capsys):
    _masked_lm_run(tmp_path / "mlm", CharTokenizer.from_texts(["abcdef"]))
    assert cli.main(["fill-mask", str(tmp_path / "mlm"), "--text", "a[MASK]c[MASK]", "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(len(line.split("\t")) == 2 for line in lines)  # a line per mask, 2 candidates
    assert cli.main(["fill-mask", str(tmp_path / "mlm"), "--text", "a[MASK]c[MASK]", "[MASK]b", "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()  # a blank line between texts says which masks are whose
    assert [bool(line) for line in lines] == [True, True, False, True]



def test_masked_lm_eval_of_a_file_shorter_than_a_window_names_the_file_and_window(tmp_path, capsys):
    """The refusal spoke of the training data ('the val split', --data, --seq-len), none of them eval's."""
    _masked_lm_run(tmp_path / "mlm", CharTokenizer.from_texts(["abcdef"]))
    (tmp_path / "short.txt").write_text("abcab", encoding="utf-8")
    assert cli.main(["eval", str(tmp_path / "mlm"), "--data", str(tmp_path / "short.txt")]) == 2
    assert (f"{tmp_path / 'short.txt'} holds 5 tokens, fewer than a window of 16 needs (15): give a longer file, or "
            "--window 6 or less") in capsys.readouterr().err
    assert cli.main(["eval", str(tmp_path / "mlm"), "--data", str(tmp_path / "short.txt"), "--window", "6",
                     "--out", str(tmp_path / "eval")]) == 0

# Training-time and offline evaluation: one loop, the same numbers -----------------------------------------------
def _last_eval(run: Path) -> dict:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"][-1]


def _train(run: Path, task: str, data: dict, **settings) -> object:
    trainer = prepare(TrainRequest(
        out=str(run), task=task, overrides=TINY, data={"tokenizer": "char", "eval_batches": 1000, **data},
        settings=dict(max_steps=4, batch_size=8, eval_every=4, lr=3e-3, seed=3, **settings), progress=False))
    trainer.fit()
    return trainer


STORY = "".join(f"the {w} saw {v} by the river at dawn; {w} said nothing to {v}.\n"
                for w in ("fox", "owl", "cat", "elk") for v in ("rain", "snow", "mist", "fire") * 3)


@pytest.mark.parametrize("task", ["lm", "mlm"])
def test_stream_tasks_score_offline_as_in_training(tmp_path, task):
    (tmp_path / "train.txt").write_text(STORY, encoding="utf-8")
    trainer = _train(tmp_path / "run", task, {"data": (str(tmp_path / "train.txt"),)})
    val_text = trainer.tokenizer.decode(trainer.task.data.val.tolist())  # the validation split, as a file
    (tmp_path / "val.txt").write_text(val_text, encoding="utf-8")
    assert trainer.tokenizer.encode(val_text) == trainer.task.data.val.tolist()
    seq_len = 32
    report = evaluate_run(tmp_path / "run", [tmp_path / "val.txt"], window=seq_len, stride=seq_len, batch_size=5)
    trained, offline = _last_eval(tmp_path / "run"), report.rows[0]
    key = "loss" if task == "lm" else "val_loss"
    assert offline[key] == pytest.approx(trained["val_loss"], rel=1e-5)
    if task == "mlm":
        assert offline["accuracy"] == pytest.approx(trained["accuracy"], abs=1e-12)


def test_classify_and_tag_score_offline_as_in_training(tmp_path):
    rows = [("pos" if i % 3 else "neg", f"{'good' if i % 3 else 'bad'} film number {i}") for i in range(90)]
    for name, part in (("train", rows[:70]), ("val", rows[70:])):
        (tmp_path / f"{name}.txt").write_text("".join(f"{label} {text}\n" for label, text in part), encoding="utf-8")
    _train(tmp_path / "clf", "classify", {"data": (str(tmp_path / "train.txt"),),
                                          "val_data": (str(tmp_path / "val.txt"),)})
    offline = evaluate_run(tmp_path / "clf", [tmp_path / "val.txt"]).rows[0]
    trained = _last_eval(tmp_path / "clf")
    assert offline["accuracy"] == trained["accuracy"]
    assert offline["val_loss"] == pytest.approx(trained["val_loss"], rel=1e-5)

    write_conll(tmp_path / "train.conll", tagging_sentences(60, seed=0))
    write_conll(tmp_path / "val.conll", tagging_sentences(20, seed=1))
    _train(tmp_path / "tag", "tag", {"data": (str(tmp_path / "train.conll"),),
                                     "val_data": (str(tmp_path / "val.conll"),)})
    offline = evaluate_run(tmp_path / "tag", [tmp_path / "val.conll"]).rows[0]
    trained = _last_eval(tmp_path / "tag")
    for key in ("f1", "precision", "recall", "accuracy"):
        assert offline[key] == trained[key], key
    assert offline["val_loss"] == pytest.approx(trained["val_loss"], rel=1e-5)


def test_translate_scores_offline_as_in_training(tmp_path, capsys):
    """Training's BLEU decodes through the pipeline's own decoding (`translate_batched`): its translations are
    `attnkit.load(run).translate`'s, and `attnkit eval` (which translates through the pipeline) reports its BLEU."""
    pairs = [(f"{a} {b}", f"{b} {a}") for a in ("red", "blue", "green", "grey") for b in ("cat", "dog", "cow")] * 4
    (tmp_path / "train.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    (tmp_path / "val.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs[:12]), encoding="utf-8")
    trainer = prepare(TrainRequest(
        out=str(tmp_path / "run"), task="translate", overrides=TINY,
        data={"data": (str(tmp_path / "train.tsv"),), "val_data": (str(tmp_path / "val.tsv"),), "tokenizer": "char"},
        settings=dict(max_steps=4, batch_size=5, eval_every=4, lr=3e-3, seed=3), progress=False),
        translate=translate_batched)
    trainer.fit()
    trained = _last_eval(tmp_path / "run")
    in_training = trainer.task.hypotheses(trainer.model.eval())  # what the last evaluation scored
    pipeline = attnkit.load(tmp_path / "run", device="cpu")
    assert pipeline.translate([s for s, _ in pairs[:12]], batch_size=5) == in_training
    assert translation_scores(in_training, [t for _, t in pairs[:12]])["bleu"] == pytest.approx(trained["bleu"])

    assert cli.main(["eval", str(tmp_path / "run"), "--data", str(tmp_path / "val.tsv"), "--batch-size", "5",
                     "--device", "cpu"]) == 0
    offline = json.loads((tmp_path / "run" / "eval" / "eval.json").read_text())["rows"][0]
    assert offline["bleu"] == pytest.approx(trained["bleu"], abs=1e-9)
    assert offline["bleu_lowercased"] == pytest.approx(trained["bleu_lowercased"], abs=1e-9)


# No task name compared outside the registry ---------------------------------------------------------------------
def _task_name_comparisons(path: Path, names: set[str], root: Path = SRC) -> list[str]:
    """Comparisons (==, !=, in, not in) of a string that names a task, except against a pipeline method's name
    (`spec.method`, `pipeline.methods`: "translate", "classify" and "tag" name methods too). A head field compared
    with a head's name counts (`config.encoder_head == "tag"`): a family builds a head by what it outputs
    (`attnkit.config.head_output`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        strings = {s.value for side in sides for s in ast.walk(side)
                   if isinstance(s, ast.Constant) and isinstance(s.value, str)}
        method = any(isinstance(s, ast.Attribute) and s.attr in ("method", "methods")
                     for side in sides for s in ast.walk(side))
        if strings & names and not method:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def _task_specific(path: Path, root: Path = SRC) -> list[str]:
    """What only a task's registration may say, said elsewhere: a table keyed by a task's name (dispatch on it,
    `{"tag": build_tagger}`; but `attnkit.config.HEADS`, the built-in heads by name), a Hugging Face class that
    carries a task's head (but a family's default class), a field named as a task's own option (`tag_column: str`),
    or a command named as a task's (`Command("tag", ...)`)."""
    names = {spec.name for spec in tasks()}
    hf_classes = {c.name for spec in tasks() for c in spec.hf_architectures}
    own = set(own_options())
    commands = {spec.command.name for spec in tasks() if spec.command is not None}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defaults = {id(k.value) for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg == "default_architecture"}
    heads = {id(d) for a in ast.walk(tree) if isinstance(a, ast.AnnAssign) and getattr(a.target, "id", "") == "HEADS"
             for d in ast.walk(a)}  # config.HEADS: the built-in heads' names, which saved config.json files hold
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Dict) and id(node) not in heads and any(
                isinstance(k, ast.Constant) and k.value in names for k in node.keys):
            found.append(f"{where}: a table keyed by task names")
        elif isinstance(node, ast.Constant) and node.value in hf_classes and id(node) not in defaults:
            found.append(f"{where}: {node.value!r}, a class a task declares (TaskSpec.hf_architectures)")
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in own:
            found.append(f"{where}: a field {node.target.id!r}, a task's own option (TaskSpec.own_options)")
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Command" and node.args
              and isinstance(node.args[0], ast.Constant) and node.args[0].value in commands):
            found.append(f"{where}: Command({node.args[0].value!r}), a task's command (TaskSpec.command)")
    return found


def _outside_tasks() -> list[Path]:
    return [path for path in sorted(SRC.rglob("*.py")) if "tasks" not in path.relative_to(SRC).parts]


def test_no_task_name_is_compared_outside_the_registry():
    names = {spec.name for spec in tasks()}
    found = [hit for path in _outside_tasks() for hit in _task_name_comparisons(path, names)]
    assert not found, "task names compared outside attnkit/tasks (ask the registry instead):\n" + "\n".join(found)


def test_nothing_outside_the_registry_says_what_a_task_alone_says():
    """Heads built by what they output, Hugging Face classes, own options and commands come from registrations."""
    found = [hit for path in _outside_tasks() for hit in _task_specific(path)]
    assert not found, "task-specific code outside attnkit/tasks (put it in the task's registration):\n" + \
        "\n".join(found)


def test_the_checks_find_what_they_look_for(tmp_path):
    (tmp_path / "x.py").write_text('if data.task == "mlm":\n    pass\nif config.encoder_head != "mlm":\n    pass\n'
                                   'if spec.method == "tag":\n    pass\n')
    assert _task_name_comparisons(tmp_path / "x.py", {"mlm", "tag"}, tmp_path) == [
        "x.py:1: data.task == 'mlm'", "x.py:3: config.encoder_head != 'mlm'"]
    (tmp_path / "y.py").write_text(
        'HEADS = {"tag": build_tagger}\nclasses = {"BertForTokenClassification": {}}\n'
        'FamilyMap(default_architecture="GPT2LMHeadModel")\nclass S:\n    tag_column: str = "upos"\n'
        'Command("tag", "label words", S, run)\n')
    assert sorted(hit.split(":")[1] for hit in _task_specific(tmp_path / "y.py", tmp_path)) == ["1", "2", "5", "6"]


def test_presets_say_which_task_they_are_for():
    assert task_of_config(presets.get("bert-tiny")).name == "classify"
    assert task_of_config(presets.get("gpt2-tiny")).name == "lm"


# A task's own options ---------------------------------------------------------------------------------------------
def _conllu(sentences) -> str:
    """CoNLL-U with the BIO tags in MISC (NER=...) and a UPOS of X for every word."""
    return "".join("".join(f"{i}\t{w}\t_\tX\t_\t_\t0\tdep\t_\tNER={t}\n" for i, (w, t) in
                           enumerate(zip(words, tags, strict=True), 1)) + "\n" for words, tags in sentences)


def test_a_tasks_own_option_trains_is_saved_and_is_evaluations_default(tmp_path, capsys):
    """--tag-column is tag's own (TaskSpec.own_options): train reads it, the run keeps it, eval takes it unless
    told otherwise; another task refuses it, and a saved run of another task that holds it still loads."""
    (tmp_path / "train.conllu").write_text(_conllu(tagging_sentences(40, seed=0)), encoding="utf-8")
    (tmp_path / "val.conllu").write_text(_conllu(tagging_sentences(10, seed=1)), encoding="utf-8")
    trainer = _train(tmp_path / "tag", "tag", {"data": (str(tmp_path / "train.conllu"),),
                                               "val_data": (str(tmp_path / "val.conllu"),), "tag_column": "NER"})
    assert trainer.labels != ["X"] and "B-PER" in trainer.labels  # read from MISC's NER, not UPOS
    state = json.loads((tmp_path / "tag" / "train_state.json").read_text())
    assert state["data_config"]["tag_column"] == "NER"
    assert evaluate_run(tmp_path / "tag", [tmp_path / "val.conllu"]).rows[0]["f1"] == _last_eval(tmp_path / "tag")["f1"]
    with pytest.raises(InputError, match="tags the run does not know: X"):
        evaluate_run(tmp_path / "tag", [tmp_path / "val.conllu"], task_options={"tag_column": "upos"})

    with pytest.raises(ConfigError, match="--tag-column does not apply to --task lm: it is for --task tag"):
        check_request(TrainRequest(out=str(tmp_path / "lm"), task="lm", overrides=["tag_column=NER"]))
    assert not hasattr(DataConfig.from_dict({"task": "lm", "tag_column": "upos"}, saved=True).options, "tag_column")
    assert cli.main(["train", "--task", "classify", "--tag-column", "NER", "--out", str(tmp_path / "c")]) == 2
    assert "--tag-column does not apply to --task classify: it is for --task tag" in capsys.readouterr().err


def test_a_task_like_tag_with_a_head_of_its_own_needs_no_model_code(tmp_path, monkeypatch):
    """A task that labels positions under a head of its own name (`register_head`, of an output kind the family
    builds) trains, evaluates and tags through the registry alone: no model, config or interop code of its own."""
    monkeypatch.setitem(HEADS, "encoder", dict(HEADS["encoder"]))
    register_head("encoder", "chunk", "position")
    tag = task_spec("tag")
    chunk = register(dataclasses.replace(
        tag, name="chunk", help="chunks (BIO)", families=("encoder",), head={"encoder_head": "chunk"}, command=None,
        hf_architectures=(), default_model={**tag.default_model, "encoder_head": "chunk"}))
    try:
        write_conll(tmp_path / "train.conll", tagging_sentences(40, seed=0))
        write_conll(tmp_path / "val.conll", tagging_sentences(10, seed=1))
        trainer = _train(tmp_path / "run", "chunk", {"data": (str(tmp_path / "train.conll"),),
                                                     "val_data": (str(tmp_path / "val.conll"),)})
        assert trainer.config.encoder_head == "chunk" and task_of_config(trainer.config) is chunk
        assert type(trainer.model) is type(build_model(ModelConfig(**tag.default_model)))  # the family's own head
        offline = evaluate_run(tmp_path / "run", [tmp_path / "val.conll"]).rows[0]
        assert offline["f1"] == _last_eval(tmp_path / "run")["f1"]
        assert [w.word for w in attnkit.load(tmp_path / "run").tag(["Anna lives in Paris"])[0]] == \
            ["Anna", "lives", "in", "Paris"]
        with pytest.raises(ConfigError, match="did you mean 'chunk'"):
            ModelConfig(family="encoder", encoder_head="chunks")
    finally:
        unregister("chunk")


def test_the_library_refuses_another_tasks_set_key_as_the_command_line_does():
    """`attnkit.train` called directly (not through the CLI) refuses a --set key the task does not read."""
    from attnkit.train.job import TrainRequest, check_request

    with pytest.raises(ConfigError, match="--src-lang does not apply to --task lm: it is for --task translate"):
        check_request(TrainRequest(out="runs/unused", task="lm", overrides=["src_lang=de"]))


@pytest.mark.parametrize("written", ['{"task": ["lm"]}', '{"task": {}}', '{"task": 5}', '["lm"]'])
def test_a_hand_edited_task_json_is_refused_naming_the_file_and_the_fix(tmp_path, written):
    from attnkit.errors import CheckpointError
    from attnkit.tasks import task_of_run

    config = ModelConfig(family="decoder", vocab_size=20, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=16)
    (tmp_path / "task.json").write_text(written)
    with pytest.raises(CheckpointError, match=r"task\.json.*\{\"task\": NAME"):
        task_of_run(tmp_path, config)


@pytest.mark.parametrize("state", [{"epoch": 1}, {"epoch": "one", "index": 2}, ["epoch", "index"]])
def test_an_epoch_tasks_data_state_is_read_by_the_one_parser_and_a_damaged_one_named(state):
    """An epoch task read its saved position with int(state["epoch"]) beside `epoch_position`, the same parse twice:
    a damaged one was a KeyError or a ValueError; it is one CheckpointError naming the position, and a sound one
    (numbers written as text too) is read as `epoch_position` reads it."""
    from attnkit.errors import CheckpointError
    from attnkit.tasks.common import EpochTask, epoch_position

    task = EpochTask(train=None)
    with pytest.raises(CheckpointError, match="the saved data position .* is no {'epoch': E, 'index': I}"):
        task.load_data_state(state)
    task.load_data_state({"epoch": "3", "index": 4})
    assert (task.epoch, task.index) == epoch_position({"epoch": "3", "index": 4}) == (3, 4)


@pytest.mark.parametrize("specials", [["pad", "unk", "bos", "eos", "mask", "cls", "sep"],
                                      ["pad", "unk", "bos", "eos", "mask", "cls"],
                                      ["pad", "unk", "bos", "eos", "mask"]])
def test_masked_lm_windows_are_framed_as_a_classifiers_text(specials):
    """Masked-LM windows were framed by a rule of their own (CLS and SEP only where both exist, else BOS and EOS),
    beside `frame_ids`, which classifier data, viz and inspect read: a tokenizer with CLS but no SEP trained its
    encoder on BOS ... EOS and had it read CLS ... EOS after. Both are `frame_ids` now."""
    from attnkit.data.labelled import frame_ids
    from attnkit.tasks.lm import MaskedWindows
    from attnkit.tokenize import CharTokenizer

    tokenizer = CharTokenizer("abcdef", special_tokens=specials)
    inputs, _ = MaskedWindows(tokenizer, 6)(torch.tensor([[0, 1, 2, 3]]), torch.Generator().manual_seed(0))
    before, after = frame_ids(tokenizer)
    assert [inputs[0, 0].item()] == before and [inputs[0, -1].item()] == after



def test_a_synthetic_task_gives_classify_and_translate_their_sizes_and_a_validation_set_of_another_seed(monkeypatch):
    """`synthetic:NAME` reads as one split for every task that takes it (`tasks.common.synthetic_split`): the
    training set of SYNTHETIC_SIZES[0] examples drawn from the seed, the validation set of [1] from seed + 1."""
    from types import SimpleNamespace

    from attnkit.data import make_task
    from attnkit.tasks import classify, translate

    monkeypatch.setattr("attnkit.tasks.common.SYNTHETIC_SIZES", (30, 7))
    data = SimpleNamespace(data=("synthetic:ab",))
    train, val = classify.labelled(data, 4)
    assert (train, val) == (make_task("ab", 30, 4).labelled(), make_task("ab", 7, 5).labelled())
    data = SimpleNamespace(data=("synthetic:reverse",))
    train, val = translate.pairs(data, 4)
    assert (train, val) == (make_task("reverse", 30, 4).pairs(), make_task("reverse", 7, 5).pairs())


@pytest.mark.parametrize(("specials", "record", "warned"), [
    (["pad", "unk", "bos", "eos", "mask", "cls"], {"task": "mlm"}, True),  # pre-trained BOS ... EOS, now CLS ... EOS
    (["pad", "unk", "bos", "eos", "mask", "cls"], {"task": "mlm", "frame": "attnkit"}, False),
    (["pad", "unk", "bos", "eos", "mask", "cls"], None, False),  # a new run
    (["pad", "unk", "bos", "eos", "mask", "cls", "sep"], {"task": "mlm"}, False),  # CLS ... SEP before and after
    (["pad", "unk", "bos", "eos", "mask"], {"task": "mlm"}, False),  # BOS ... EOS before and after
])
def test_a_masked_lm_run_records_its_frame_and_one_resumed_without_it_is_told_the_frame_changed(
        tmp_path, caplog, specials, record, warned):
    """A masked-LM run whose tokenizer has CLS but no SEP was pre-trained on BOS ... EOS windows before they were framed
    by `frame_ids` (CLS ... EOS): resumed, it went on with the new frame without a word. Its task.json records the
    frame now, and a run resumed without one from such a tokenizer is warned in one line."""
    from attnkit.tasks.lm import MLM
    from attnkit.tasks.registry import TaskContext

    text = tmp_path / "text.txt"
    text.write_text("abcdef fedcba " * 40)
    tokenizer = CharTokenizer("abcdef ", special_tokens=specials)
    config = ModelConfig(family="encoder", encoder_head="mlm", vocab_size=tokenizer.vocab_size, d_model=16,
                         n_heads=2, d_ff=32, n_layers=1, max_seq_len=16)
    context = TaskContext(data=DataConfig(task="mlm", data=(str(text),)), tokenizer=tokenizer, config=config,
                          batch_size=2, seed=0, seq_len=16, cache=tmp_path / "cache", files=[text], record=record)
    with caplog.at_level("WARNING", logger="attnkit.tasks.lm"):
        task, _ = MLM.make(context)
    assert task.record == {"frame": "attnkit"}
    said = [r.getMessage() for r in caplog.records if r.name == "attnkit.tasks.lm"]
    assert said == (["this masked-LM run was trained on windows framed BOS ... EOS (its task.json records no frame); "
                     "they are framed CLS ... EOS from here on, as a classifier fine-tuned from it reads its texts"]
                    if warned else [])


@pytest.mark.parametrize("state", [{"epoch": 1, "index": -2}, {"epoch": -1, "index": 0}, {"epoch": 1.5, "index": 0},
                                   {"epoch": float("inf"), "index": 0}, {"epoch": 10**400, "index": 0}])
def test_a_data_position_of_no_whole_count_is_refused_not_read_from_the_end(state):
    """A negative index was taken, and the epoch's batches read from its end (Python's negative indexing); 1.5 was
    read as epoch 1: a damaged position is refused as one that is not there is."""
    from attnkit.errors import CheckpointError
    from attnkit.tasks.common import EpochTask, epoch_position

    assert epoch_position(state) is None
    with pytest.raises(CheckpointError, match="the saved data position .* is no {'epoch': E, 'index': I}"):
        EpochTask(train=None).load_data_state(state)
