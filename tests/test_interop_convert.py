"""`attnkit convert`: Hugging Face directory -> run that generate / translate / classify use, and run -> Hugging Face
directory that transformers loads (model and tokenizer)."""

import json

import numpy as np
import pytest
import torch
from interop_models import PAD, batch, hf_model, transformers, word_tokenizer  # noqa: F401

from attnkit import build_model, presets
from attnkit.checkpoint import save_model
from attnkit.cli import main
from attnkit.tokenize import load_tokenizer

BOS, EOS = 1, 2


def _convert(source, run, capsys):
    assert main(["convert", "--from-hf", str(source), "--out", str(run)]) == 0
    assert f"to {run}" in capsys.readouterr().out


def _words(ids):
    """The text of word ids (4 and above: w4 .. w98) in the tiny tokenizer."""
    return " ".join(f"w{i}" for i in ids)


def test_converted_decoder_generates_what_transformers_generates(tmp_path, capsys):
    reference = hf_model("llama", tmp_path / "hf")
    word_tokenizer(tmp_path / "hf")
    _convert(tmp_path / "hf", tmp_path / "run", capsys)
    assert {p.name for p in (tmp_path / "run").iterdir()} >= {"config.json", "model.safetensors", "tokenizer"}

    prompt = [5, 17, 33, 8]
    args = ["generate", "--run", str(tmp_path / "run"), "--prompt", _words(prompt), "--max-new-tokens", "6",
            "--temperature", "0", "--no-stream"]
    assert main(args) == 0
    printed = capsys.readouterr().out.strip()

    with torch.no_grad():
        out = reference.generate(input_ids=torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                                 eos_token_id=EOS, pad_token_id=PAD)
    new = out[0, len(prompt):].tolist()
    new = new[: new.index(EOS)] if EOS in new else new
    assert new and printed == _words(prompt) + load_tokenizer(tmp_path / "run" / "tokenizer").decode(new)


def test_a_tokenizer_that_begins_its_texts_with_bos_gives_the_prompt_bos_as_transformers_does(tmp_path, capsys):
    """A Llama whose tokenizer puts BOS before every text (Llama's and Mistral's do, by their post-processor) was
    trained on such texts: the converted run's prompts begin with BOS too, so greedy text equals transformers' on
    the tokenizer's own encoding, and the chat template's bos_token is the token put first, not its characters; a
    chat in the default format (no template of the run's own) gets BOS as the same text's completion does; a
    tokenizer without that framing adds none."""
    from tokenizers import Tokenizer, processors

    from attnkit import load
    from attnkit.serve.chat import ChatTemplate, chat_template
    from attnkit.tokenize import HFTokenizer

    reference = hf_model("llama", tmp_path / "hf")
    word_tokenizer(tmp_path / "hf")
    framing = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    framing.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    framing.save(str(tmp_path / "hf" / "tokenizer.json"))
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}"
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(config))
    _convert(tmp_path / "hf", tmp_path / "run", capsys)
    pipeline = load(tmp_path / "run")
    prompt = [5, 17, 33, 8]
    assert pipeline.tokenizer.starts_with_bos and framing.encode(_words(prompt)).ids == [BOS, *prompt]
    assert pipeline.prompt_ids(_words(prompt), index=0) == [BOS, *prompt]
    assert pipeline.prompt_ids(_words(prompt), index=0, add_bos=False) == prompt
    text = pipeline.generate(_words(prompt), max_new_tokens=6, temperature=0)[0]
    with torch.no_grad():
        out = reference.generate(input_ids=torch.tensor([[BOS, *prompt]]), max_new_tokens=6, do_sample=False,
                                 eos_token_id=EOS, pad_token_id=PAD)
    new = out[0, 1 + len(prompt):].tolist()
    assert new and text == pipeline.tokenizer.decode(new[: new.index(EOS)] if EOS in new else new)
    template = chat_template(tmp_path / "run" / "tokenizer")
    chat = template.render([{"role": "user", "content": "w5"}], add_generation_prompt=False)
    assert template.prompt_ids(pipeline.tokenizer, chat) == [BOS, 5]
    default = ChatTemplate()  # a run with no template of its own: plain text, framed as a completion's prompt is
    chat = default.render([{"role": "user", "content": "w5 w17"}])
    assert default.prompt_ids(pipeline.tokenizer, chat) == pipeline.prompt_ids(chat, index=0)
    assert default.prompt_ids(pipeline.tokenizer, chat)[0] == BOS
    word_tokenizer(tmp_path / "plain")
    plain = HFTokenizer.from_dir(tmp_path / "plain")
    assert not plain.starts_with_bos and default.prompt_ids(plain, chat) == plain.encode(chat)


@pytest.mark.parametrize("writes_bos", [True, False])
def test_a_chat_prompt_has_the_tokens_transformers_gives_it_whether_its_template_writes_bos_or_not(tmp_path,
                                                                                               writes_bos):
    """transformers tokenizes a chat as its template writes it (`apply_chat_template(tokenize=True)`: the special
    tokens in the text read as tokens, none added; `TextGenerationPipeline` passes a chat through it and ignores
    add_special_tokens), so a tokenizer that begins every text with BOS gives a chat BOS only where the template
    writes bos_token, and an eos_token between turns is EOS: the server's chat prompt has the same ids. It had BOS
    either way (a template without bos_token got one), and eos_token's characters as words."""
    from tokenizers import Tokenizer, processors
    from transformers import AutoTokenizer, TextGenerationPipeline
    from transformers.utils.chat_template_utils import Chat

    from attnkit.serve.chat import chat_template
    from attnkit.tokenize import HFTokenizer

    word_tokenizer(tmp_path / "tok")
    framing = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    framing.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    framing.save(str(tmp_path / "tok" / "tokenizer.json"))
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    turns = "{% for m in messages %}w4 {{ m['content'] }}{{ eos_token }}{% endfor %}"
    reply = "{% if add_generation_prompt %}w6{% endif %}"
    config["chat_template"] = ("{{ bos_token }}" if writes_bos else "") + turns + reply
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(config))
    messages = [{"role": "user", "content": "w5 w17"}, {"role": "assistant", "content": "w33"},
                {"role": "user", "content": "w8"}]
    theirs = AutoTokenizer.from_pretrained(tmp_path / "tok")
    expected = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    generator = TextGenerationPipeline(model=hf_model("llama", tmp_path / "hf"), tokenizer=theirs)
    assert generator.preprocess(Chat(messages))["input_ids"][0].tolist() == expected
    assert expected.count(BOS) == int(writes_bos) and expected.count(EOS) == 3
    ours = HFTokenizer.from_dir(tmp_path / "tok")
    assert ours.starts_with_bos and ours.encode("w5") == [5]
    template = chat_template(tmp_path / "tok", ours.specials)
    assert template.prompt_ids(ours, template.render(messages)) == expected


def test_converted_classifier_classifies_as_transformers_does(tmp_path, capsys):
    reference = hf_model("bert-classifier", tmp_path / "hf")
    word_tokenizer(tmp_path / "hf")
    _convert(tmp_path / "hf", tmp_path / "run", capsys)
    assert json.loads((tmp_path / "run" / "labels.json").read_text()) == {"labels": ["negative", "neutral", "positive"]}

    texts = [[5, 6, 7], [40, 41, 42, 43, 44]]
    argv = ["classify", "--run", str(tmp_path / "run")]
    for text in texts:
        argv += ["--text", _words(text)]
    assert main(argv) == 0
    printed = [line.split("\t") for line in capsys.readouterr().out.strip().splitlines()]

    for text, (label, probability) in zip(texts, printed, strict=True):
        with torch.no_grad():  # the pipeline lays a text out as BOS text EOS when the tokenizer has no CLS
            probs = reference(input_ids=torch.tensor([[BOS, *text, EOS]])).logits.softmax(-1)[0]
        assert label == reference.config.id2label[int(probs.argmax())]
        assert float(probability) == pytest.approx(float(probs.max()), abs=1e-4)


def test_converted_marian_translates_as_transformers_does(tmp_path, capsys):
    reference = hf_model("marian", tmp_path / "hf")
    word_tokenizer(tmp_path / "hf")
    _convert(tmp_path / "hf", tmp_path / "run", capsys)
    source = [5, 6, 7, 30]
    assert main(["translate", "--run", str(tmp_path / "run"), "--text", _words(source), "--max-length", "8"]) == 0
    printed = capsys.readouterr().out.strip()

    # attnkit starts the target with BOS and ends the source with EOS
    reference.generation_config.forced_eos_token_id = None
    with torch.no_grad():
        out = reference.generate(input_ids=torch.tensor([[*source, EOS]]), decoder_start_token_id=BOS,
                                 eos_token_id=EOS, pad_token_id=PAD, max_new_tokens=8, num_beams=1, do_sample=False)
    new = out[0, 1:].tolist()
    new = new[: new.index(EOS)] if EOS in new else new
    assert new and printed == load_tokenizer(tmp_path / "run" / "tokenizer").decode(new)


def test_marian_without_tokenizer_json_converts_and_says_so(tmp_path, capsys, caplog):
    hf_model("marian", tmp_path / "hf")
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    assert "the model comes without a tokenizer" in caplog.text
    assert not (tmp_path / "run" / "tokenizer").exists()
    source = json.loads((tmp_path / "run" / "hf_source.json").read_text())
    assert source["special_ids"]["decoder_start_token_id"] == PAD


def test_a_trained_run_is_written_for_transformers(tmp_path, capsys):
    config = presets.get("llama2-tiny", vocab_size=99, max_seq_len=32)
    torch.manual_seed(0)
    model = build_model(config).eval()
    run = tmp_path / "run"
    save_model(model, config, run)
    word_tokenizer(tmp_path / "words")
    load_tokenizer(tmp_path / "words").save(run / "tokenizer")

    assert main(["convert", "--run", str(run), "--to-hf", str(tmp_path / "hf")]) == 0
    assert "as a LlamaForCausalLM" in capsys.readouterr().out
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids, mask = batch(1)
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
        got = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=1e-5, rtol=1e-5)

    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf_tokenizer("w5 w17 w33", add_special_tokens=False)["input_ids"] == [5, 17, 33]
    assert (hf_tokenizer.bos_token_id, hf_tokenizer.eos_token_id, hf_tokenizer.pad_token_id) == (BOS, EOS, PAD)
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (hf_config["bos_token_id"], hf_config["eos_token_id"], hf_config["pad_token_id"]) == (BOS, EOS, PAD)


@pytest.mark.parametrize("dtype, stored", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_a_half_precision_run_is_written_in_its_own_type_as_save_pretrained_would(tmp_path, capsys, dtype, stored):
    """A run converted with --dtype bf16 goes back out in bfloat16 (half the file of float32), its tensors bit for bit
    the source's rounded once, and transformers reads it in that type."""
    from safetensors.torch import load_file

    hf_model("llama", tmp_path / "hf")
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run"), "--dtype", dtype]) == 0
    assert main(["convert", str(tmp_path / "run"), "--to-hf", str(tmp_path / "out")]) == 0
    source = load_file(tmp_path / "hf" / "model.safetensors")
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert written.keys() == source.keys()
    for name, tensor in source.items():
        assert written[name].dtype == stored and torch.equal(written[name], tensor.to(stored)), name
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == str(stored)[6:]
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype="auto")
    assert reference.dtype == stored


def test_a_run_without_its_tokenizer_is_written_saying_the_directory_has_none(tmp_path, caplog):
    config = presets.get("llama2-tiny", vocab_size=99, max_seq_len=32)
    save_model(build_model(config), config, tmp_path / "run")
    assert main(["convert", str(tmp_path / "run"), "--to-hf", str(tmp_path / "hf")]) == 0
    assert "has no tokenizer/ directory, so" in caplog.text and "AutoTokenizer.from_pretrained will not" in caplog.text
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "model.safetensors"]


def test_overwrite_never_replaces_a_run_or_the_directory_read(tmp_path, capsys):
    from export_runs import LAYOUTS, random_run

    from attnkit.checkpoint import mark_run

    run, trained = random_run(tmp_path, LAYOUTS["default"]), random_run(tmp_path, LAYOUTS["default"], name="trained")
    mark_run(trained)
    assert main(["convert", str(run), "--to-hf", str(tmp_path / "hf")]) == 0
    for source, target in ((run, run), (run, trained), (trained, trained)):
        before = {p: p.read_bytes() for p in sorted(target.rglob("*")) if p.is_file()}
        assert main(["convert", str(source), "--to-hf", str(target), "--overwrite"]) == 2
        assert "is an attnkit run, not a Hugging Face model directory, and --overwrite never replaces a run" in (
            capsys.readouterr().err)
        assert {p: p.read_bytes() for p in sorted(target.rglob("*")) if p.is_file()} == before
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "hf"), "--overwrite"]) == 2
    assert "is the Hugging Face directory being read; choose another --out" in capsys.readouterr().err
    unmarked = random_run(tmp_path, LAYOUTS["default"], name="unmarked")  # its config.json names no model_type
    assert main(["convert", str(run), "--to-hf", str(unmarked), "--overwrite"]) == 2
    assert "already holds a model's files" in capsys.readouterr().err
    assert main(["convert", str(trained), "--to-hf", str(tmp_path / "hf"), "--overwrite"]) == 0  # one: replaced


def test_convert_refuses_bad_arguments(tmp_path, capsys):
    hf_model("gpt2", tmp_path / "hf")
    assert main(["convert", "--from-hf", str(tmp_path / "hf")]) == 2
    assert "give --out runs/NAME" in capsys.readouterr().err
    _convert(tmp_path / "hf", tmp_path / "run", capsys)
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 2
    assert "already holds a model" in capsys.readouterr().err
    assert main(["convert", "--run", str(tmp_path / "run")]) == 2
    assert "give one of --to-hf DIR, --to-gguf OUT.gguf or --to-onnx DIR" in capsys.readouterr().err
    assert main(["convert", "--from-hf", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run2")]) == 2
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("layout", ["default", "gpt2", "mistral-window"])
def test_a_written_run_generates_in_transformers_the_text_attnkit_generates(tmp_path, capsys, layout):
    """Run -> Hugging Face directory: transformers' tokenizer and greedy `generate` give the text `attnkit generate`
    prints, past the sliding window for Mistral (a prompt longer than its window of 16)."""
    from export_runs import LAYOUTS, random_run

    run = random_run(tmp_path, LAYOUTS[layout])
    assert main(["convert", str(run), "--to-hf", str(tmp_path / "hf")]) == 0
    prompt = "def convert(run_dir, out):\n    return"
    assert main(["generate", str(run), "--prompt", prompt, "--max-new-tokens", "24", "--temperature", "0",
                 "--no-stream"]) == 0
    printed = capsys.readouterr().out.split("\n", 1)[1].rstrip("\n")  # the line after the conversion's own
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    encoded = theirs(prompt, return_tensors="pt")
    assert encoded["input_ids"].shape[1] > LAYOUTS["mistral-window"]["attention_window"]
    with torch.no_grad():
        out = reference.generate(**encoded, max_new_tokens=24, do_sample=False)
    assert printed == theirs.decode(out[0], skip_special_tokens=True)


def test_a_config_edited_by_hand_is_refused_with_the_way_to_keep_the_edit(tmp_path, capsys):
    """A converted run's config.json changed by hand no longer matches its checksum: --to-hf refuses it, saying how to
    keep the change, and once its entry is gone from checksums.json the export carries the edit."""
    hf_model("llama", tmp_path / "hf")
    _convert(tmp_path / "hf", tmp_path / "run", capsys)
    path = tmp_path / "run" / "config.json"
    path.write_text(path.read_text().replace('"rope_theta": 500.0', '"rope_theta": 250.0'))
    assert main(["convert", str(tmp_path / "run"), "--to-hf", str(tmp_path / "out")]) == 2
    said = capsys.readouterr().err
    assert f"{path} is damaged" in said and 'delete its entry "config.json" under "sha256" from' in said
    assert not (tmp_path / "out").exists()
    checksums = tmp_path / "run" / "checksums.json"
    record = json.loads(checksums.read_text())
    del record["sha256"]["config.json"]
    checksums.write_text(json.dumps(record))
    assert main(["convert", str(tmp_path / "run"), "--to-hf", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["rope_theta"] == 250.0


def test_a_gpt2_tagger_keeps_its_tokenizers_framing_through_attnkit_and_back_to_transformers(tmp_path, capsys):
    """GPT2ForTokenClassification learned its texts as GPT-2's tokenizer gives them, with nothing added: attnkit tag
    reads a converted one so (it framed every tagger's text with BOS and EOS, and so answered otherwise than
    transformers), and --to-hf writes a tokenizer.json that adds nothing, so transformers gives the original's
    logits."""
    from attnkit import load

    reference = hf_model("gpt2-tagger", tmp_path / "hf")
    word_tokenizer(tmp_path / "hf")  # a tokenizer with no post-processor, as GPT-2's
    _convert(tmp_path / "hf", tmp_path / "run", capsys)
    assert main(["convert", "--run", str(tmp_path / "run"), "--to-hf", str(tmp_path / "back")]) == 0
    capsys.readouterr()
    words = [_words([i]) for i in (5, 17, 33, 8, 41, 60, 72, 9, 23, 88)]
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")(" ".join(words), return_tensors="pt")
    assert theirs["input_ids"][0].tolist() == [int(w[1:]) for w in words]
    back = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        expected = reference(**theirs).logits[0]  # (T, n_labels)
        torch.testing.assert_close(back(**theirs).logits[0], expected, atol=1e-5, rtol=1e-5)
    [tagged] = load(tmp_path / "run").tag([words])
    assert [w.label for w in tagged] == [reference.config.id2label[int(i)] for i in expected.argmax(-1)]


def test_a_half_precision_run_loads_as_stored_unless_a_dtype_is_asked(tmp_path, capsys):
    """attnkit.load's default dtype is "as stored": a run converted with --dtype bf16 loaded in float32 (twice the
    memory); it loads in bfloat16, generates, and dtype="fp32" still gives float32 (`stored_dtype`)."""
    from attnkit import load

    hf_model("llama", tmp_path / "hf")
    word_tokenizer(tmp_path / "hf")
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run"), "--dtype", "bf16"]) == 0
    stored = load(tmp_path / "run")
    assert {p.dtype for p in stored.model.parameters()} == {torch.bfloat16}
    assert stored.generate("w5 w17", max_new_tokens=3, temperature=0)[0] is not None
    assert {p.dtype for p in load(tmp_path / "run", dtype="fp32").model.parameters()} == {torch.float32}


def test_a_decoder_tagger_attnkit_trained_is_written_framed_as_attnkit_tag_reads_it(tmp_path, capsys):
    """--to-hf of a decoder tagger attnkit trained (task.json): its tokenizer.json adds BOS and EOS as `attnkit tag`
    frames the text, so transformers, fed what that file gives, labels as attnkit does."""
    from attnkit import load

    config = presets.get("llama2-tiny", vocab_size=99, max_seq_len=32, decoder_head="tag", n_classes=3)
    torch.manual_seed(0)
    run = tmp_path / "run"
    save_model(build_model(config).eval(), config, run)
    word_tokenizer(tmp_path / "words")
    load_tokenizer(tmp_path / "words").save(run / "tokenizer")
    (run / "task.json").write_text(json.dumps({"task": "tag", "word_pieces": "running", "frame": "attnkit"}))
    (run / "labels.json").write_text(json.dumps({"labels": ["A", "B", "O"]}))
    assert main(["convert", "--run", str(run), "--to-hf", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    words = [_words([i]) for i in (5, 17, 33, 8, 41)]
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")(" ".join(words), return_tensors="pt")
    assert theirs["input_ids"][0].tolist() == [BOS, 5, 17, 33, 8, 41, EOS]
    reference = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        best = reference(**theirs).logits[0, 1:-1].argmax(-1)  # (T,) at each word, between BOS and EOS
    assert [w.label for w in load(run).tag([words])[0]] == [reference.config.id2label[int(i)] for i in best]


def test_a_converted_llama_is_fine_tuned_on_files_that_start_with_bos_as_it_is_prompted(tmp_path, capsys):
    """`attnkit train --task lm --init-from` a converted Llama whose tokenizer puts BOS before every text trained it on
    a stream without BOS, though every prompt it is given starts with BOS: each file of its stream starts with BOS
    now (Hugging Face's run_clm puts BOS before each document), and the training windows read from that stream."""
    from tokenizers import Tokenizer, processors

    from attnkit.data import LMData

    hf_model("llama", tmp_path / "hf")
    word_tokenizer(tmp_path / "hf")
    framing = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    framing.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    framing.save(str(tmp_path / "hf" / "tokenizer.json"))
    _convert(tmp_path / "hf", tmp_path / "run", capsys)
    files = [tmp_path / "a.txt", tmp_path / "b.txt"]
    files[0].write_text(_words([5, 6, 7] * 30))
    files[1].write_text(_words([9, 10] * 30))
    assert main(["train", "--task", "lm", "--data", *map(str, files), "--init-from", str(tmp_path / "run"),
                 "--out", str(tmp_path / "tuned"), "--max-steps", "1", "--eval-every", "1", "--batch-size", "2",
                 "--seq-len", "8", "--no-progress"]) == 0
    tokenizer = load_tokenizer(tmp_path / "tuned" / "tokenizer")
    stream = LMData.prepare(files, tokenizer, tmp_path / "tuned" / "cache", progress=False)
    assert stream.reused  # the stream the run trained on
    assert np.asarray(stream.tokens).tolist() == [BOS, *[5, 6, 7] * 30, EOS, BOS, *[9, 10] * 30]
