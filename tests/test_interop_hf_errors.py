"""Bad Hugging Face directories are refused with one clear error; sharded and (explicitly allowed) pickled weights
load."""

import importlib.util
import json
import logging
import pickle

import pytest
import torch
from interop_models import batch, hf_model, transformers  # noqa: F401
from safetensors.torch import load_file, save_file

from attnkit import CheckpointError, ConfigError
from attnkit.checkpoint import load_model
from attnkit.cli import main
from attnkit.interop import hf


@pytest.fixture
def gpt2_dir(tmp_path):
    directory = tmp_path / "gpt2"
    hf_model("gpt2", directory)
    return directory


def _edit_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def _edit_weights(directory, edit):
    path = directory / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _logits(model, seed=0):
    ids, mask = batch(seed)
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits


def test_a_directory_without_config_is_refused(tmp_path, gpt2_dir):
    (gpt2_dir / "config.json").unlink()
    with pytest.raises(CheckpointError, match="has no config.json"):
        hf.load(gpt2_dir)
    with pytest.raises(CheckpointError, match="is not a directory"):
        hf.load(tmp_path / "nowhere")


def test_a_peft_adapter_directory_is_refused_saying_to_merge_it_first(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    save_file({"base_model.model.lm_head.lora_A.weight": torch.zeros(8, 32)}, tmp_path / "adapter_model.safetensors")
    with pytest.raises(CheckpointError, match=r"holds PEFT adapters \(adapter_config.json\), not a model: merge them "
                                              r"into their base model first .*merge_and_unload"):
        hf.load(tmp_path)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8,
                                                              "base_model_name_or_path": "meta-llama/Llama-3.2-1B"}))
    with pytest.raises(CheckpointError, match=r"merge them into their base model \(meta-llama/Llama-3.2-1B\) first"):
        hf.load(tmp_path)  # the base the adapters name


def test_an_unknown_model_type_is_refused(gpt2_dir):
    _edit_config(gpt2_dir, model_type="t5")
    with pytest.raises(ConfigError, match="model_type 't5'; attnkit reads .*gpt2: GPT2LMHeadModel, .*; llama: "):
        hf.load(gpt2_dir)
    _edit_config(gpt2_dir, model_type=None)
    with pytest.raises(ConfigError, match="has no model_type"):
        hf.load(gpt2_dir)


def test_an_unsupported_class_or_option_is_refused(gpt2_dir):
    _edit_config(gpt2_dir, architectures=["GPT2ForQuestionAnswering"])
    with pytest.raises(ConfigError, match="GPT2ForQuestionAnswering; attnkit reads the gpt2 classes GPT2LMHeadModel"):
        hf.load(gpt2_dir)
    _edit_config(gpt2_dir, architectures=["GPT2LMHeadModel"], scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(ConfigError, match="scale_attn_by_inverse_layer_idx=True is not supported"):
        hf.load(gpt2_dir)
    _edit_config(gpt2_dir, scale_attn_by_inverse_layer_idx=False, activation_function="quick_gelu")
    with pytest.raises(ConfigError, match="activation_function='quick_gelu' is not an activation attnkit has"):
        hf.load(gpt2_dir)
    _edit_config(gpt2_dir, activation_function="gelu_new", n_embd=None)
    with pytest.raises(ConfigError, match="lacks 'n_embd'"):
        hf.load(gpt2_dir)


def test_llama_rope_scaling_is_refused(tmp_path):
    hf_model("llama", tmp_path)
    _edit_config(tmp_path, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0})
    with pytest.raises(ConfigError, match="RoPE scaling 'llama3' is not supported"):
        hf.load(tmp_path)


def test_truncated_or_invalid_files_are_refused(gpt2_dir):
    path = gpt2_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        hf.load(gpt2_dir)
    path.unlink()
    with pytest.raises(CheckpointError, match="holds no weights"):
        hf.load(gpt2_dir)
    (gpt2_dir / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is not readable JSON"):
        hf.load(gpt2_dir)


def test_a_config_that_disagrees_with_the_weights_lists_every_problem(gpt2_dir):
    _edit_config(gpt2_dir, n_layer=3, n_inner=96)
    with pytest.raises(CheckpointError) as info:
        hf.load(gpt2_dir)
    message = str(info.value)
    assert "missing tensors: transformer.h.2.attn.c_attn.bias, transformer.h.2.attn.c_attn.weight" in message
    assert "missing tensors: transformer.h.0" not in message  # present with the wrong shape: not missing
    assert "transformer.h.0.mlp.c_fc.weight -> stack.blocks.0.mlp.up_proj.weight: checkpoint (128, 32) vs model " \
           "(96, 32)" in message
    assert "The weights and config.json must come from the same model" in message


def test_missing_and_unexpected_tensors_are_named_together(gpt2_dir):
    def edit(tensors):
        tensors.pop("transformer.ln_f.bias")
        tensors["transformer.h.0.attn.rotary.weight"] = torch.zeros(3)
        tensors["transformer.wpe.weight"] = tensors["transformer.wpe.weight"][:10]

    _edit_weights(gpt2_dir, edit)
    with pytest.raises(CheckpointError) as info:
        hf.load(gpt2_dir)
    message = str(info.value)
    assert "missing tensors: transformer.ln_f.bias" in message
    assert "unexpected tensors: transformer.h.0.attn.rotary.weight" in message
    assert "transformer.wpe.weight -> stack.embeddings.positions.weight: checkpoint (10, 32) vs model (64, 32)" \
        in message


def test_tied_weights_that_differ_are_refused(gpt2_dir):
    _edit_weights(gpt2_dir, lambda t: t.update({"lm_head.weight": t["transformer.wte.weight"] + 1}))
    with pytest.raises(CheckpointError, match="lm_head.weight and transformer.wte.weight differ .*tie_word_embeddings"):
        hf.load(gpt2_dir)
    _edit_weights(gpt2_dir, lambda t: t.update({"lm_head.weight": t["transformer.wte.weight"].clone()}))
    assert hf.load(gpt2_dir).config.tie_embeddings  # an equal copy of a tied tensor is fine


def test_a_sharded_checkpoint_loads(tmp_path):
    reference = hf_model("llama", tmp_path / "single")
    reference.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    loaded = hf.load(tmp_path / "sharded")
    torch.testing.assert_close(_logits(loaded.model), _logits(hf.load(tmp_path / "single").model), atol=0, rtol=0)

    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    next(tmp_path.glob("sharded/model-00001-*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match="names 1 shard file missing from .*: model-00001-of-"):
        hf.load(tmp_path / "sharded")
    assert len(set(index["weight_map"].values())) > 1


def _as_pickle(directory):
    torch.save(load_file(directory / "model.safetensors"), directory / "pytorch_model.bin")
    (directory / "model.safetensors").unlink()


def test_a_pickle_needs_an_explicit_flag(gpt2_dir):
    expected = _logits(hf.load(gpt2_dir).model)
    _as_pickle(gpt2_dir)
    with pytest.raises(CheckpointError, match="pytorch_model.bin is a Python pickle.*--allow-pickle"):
        hf.load(gpt2_dir)
    torch.testing.assert_close(_logits(hf.load(gpt2_dir, allow_pickle=True).model), expected, atol=0, rtol=0)


class _RunsCode:
    def __reduce__(self):
        return (print, ("code ran while unpickling",))


def test_a_pickle_is_read_weights_only(gpt2_dir, capsys):
    _as_pickle(gpt2_dir)
    (gpt2_dir / "pytorch_model.bin").write_bytes(pickle.dumps({"transformer.wte.weight": _RunsCode()}, protocol=2))
    with pytest.raises(CheckpointError, match="could not be read as a weights-only PyTorch checkpoint"):
        hf.load(gpt2_dir, allow_pickle=True)
    assert "code ran" not in capsys.readouterr().out


def test_marian_without_final_logits_bias_gets_zeros_as_in_transformers(tmp_path):
    hf_model("marian", tmp_path)
    _edit_weights(tmp_path, lambda t: t.pop("final_logits_bias"))
    model = hf.load(tmp_path).model
    assert not model.lm_head.bias.any()
    reference = transformers.MarianMTModel.from_pretrained(tmp_path).eval()
    ids, mask = batch(0)
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask, decoder_input_ids=ids).logits
        got = model(ids, ids, src_mask=mask).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_pretraining_checkpoint_loads_as_masked_lm_without_its_nsp_head(tmp_path):
    """bert-base-uncased style: BertForPreTraining weights (pooler, next-sentence head) under BertForMaskedLM."""
    hf_model("bert-mlm", tmp_path / "mlm")
    pretraining = transformers.BertForPreTraining.from_pretrained(tmp_path / "mlm")
    with torch.no_grad():
        pretraining.cls.seq_relationship.weight.normal_()
        pretraining.bert.pooler.dense.weight.normal_()
    pretraining.save_pretrained(tmp_path / "pretraining")
    _edit_config(tmp_path / "pretraining", architectures=["BertForMaskedLM"])
    reference = transformers.BertForMaskedLM.from_pretrained(tmp_path / "pretraining").eval()
    ids, mask = batch(0)
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
        got = hf.load(tmp_path / "pretraining").model(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=1e-5, rtol=1e-5)
    _edit_config(tmp_path / "pretraining", architectures=["BertModel"])
    with pytest.raises(CheckpointError, match="unexpected tensors: cls.predictions.bias"):
        hf.load(tmp_path / "pretraining")


# Fields checked one by one (attnkit.readback): each refusal names the file, the field and the fix ----------------
@pytest.mark.parametrize(("changes", "said"), [
    (dict(rope_scaling="yarn"), "rope_scaling='yarn' must be a JSON object"),
    (dict(rope_theta="500000"), "rope_theta='500000' must be a finite number"),
    (dict(rope_theta=-1.0), "rope_theta=-1.0 must be above 0"),
    (dict(architectures="LlamaForCausalLM"), "architectures='LlamaForCausalLM' must be a list of strings"),
    (dict(model_type=["llama"]), "model_type=['llama'] must be a string"),
    (dict(hidden_act=["silu"]), "hidden_act=['silu'] is not supported"),
    # yarn in rope_scaling is not dropped for rope_parameters' default
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 500.0},
          rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling: RoPE scaling 'yarn' is not supported"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, rope_theta=10000.0),
     "gives RoPE two bases"),
    (dict(eos_token_id="2"), "eos_token_id='2' is not a token id (a whole number, a list of them, or null)"),
    (dict(bos_token_id=1.5), "bos_token_id=1.5 is not a token id"),
    (dict(eos_token_id=[2, True]), "eos_token_id=[2, True] is not a token id"),
    # GPTQ, AWQ, bitsandbytes, fp8: integer or float8 weights with scales under names of their own
    (dict(quantization_config={"quant_method": "gptq", "bits": 4}),
     "describes a quantized checkpoint (quantization_config, quant_method 'gptq'), whose weights attnkit does not"),
])
def test_config_fields_of_the_wrong_type_or_range_are_refused_by_name(tmp_path, changes, said):
    hf_model("llama", tmp_path)
    _edit_config(tmp_path, **changes)
    with pytest.raises(ConfigError) as refusal:
        hf.load(tmp_path)
    assert said in str(refusal.value) and str(tmp_path / "config.json") in str(refusal.value)


def test_special_ids_outside_a_small_vocabulary_load_as_absent_and_are_said_in_one_line(tmp_path, capsys, caplog):
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=311, n_positions=64)  # ids 50256
    reference = hf_model("gpt2", tmp_path / "hf", config=config)
    with caplog.at_level(logging.WARNING):
        assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    said = [r.getMessage() for r in caplog.records if "outside the vocabulary" in r.getMessage()]
    assert said == [f"{tmp_path / 'hf' / 'config.json'}: bos_token_id=50256, eos_token_id=50256 outside the vocabulary "
                    "(vocab_size=311: ids 0 to 310): read as absent, as no token has that id"]
    ids = torch.randint(0, 311, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(load_model(tmp_path / "run")[0](ids).logits, reference(ids).logits, atol=1e-5,
                                   rtol=1e-5)
    hf_model("llama", tmp_path / "llama")
    _edit_config(tmp_path / "llama", bos_token_id=-1, eos_token_id=[2, 500])
    assert set(hf.load(tmp_path / "llama").special_ids) == {"pad_token_id"}


def _llama_and_its_first_token(directory):
    """A tiny Llama in `directory` with a word tokenizer; a prompt and the token greedy decoding starts it with."""
    from interop_models import word_tokenizer

    reference = hf_model("llama", directory)
    word_tokenizer(directory)
    prompt = [5, 17, 33]
    with torch.no_grad():
        first = int(reference(torch.tensor([prompt])).logits[0, -1].argmax())
    assert first != 2
    return prompt, first


@pytest.mark.parametrize("listed", [True, False])
def test_a_list_of_end_tokens_is_kept_through_a_run_and_back_and_generation_stops_at_any(tmp_path, capsys, listed):
    """transformers' generate stops at any of eos_token_id's end tokens (Llama 3's <|end_of_text|> and <|eot_id|>,
    listed in generation_config.json): the list was dropped on load; the run keeps it (hf_source.json), --to-hf
    writes it back, and attnkit's generate and server stop at any of them by default. A chat model's
    generation_config.json may name one end token (Qwen's <|im_end|>) where config.json names another
    (<|endoftext|>): both are kept (`listed` False; the one of generation_config.json was dropped)."""
    from attnkit import load

    prompt, first = _llama_and_its_first_token(tmp_path / "hf")
    _edit_config(tmp_path / "hf", eos_token_id=2)
    (tmp_path / "hf" / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, first] if listed
                                                                        else first}))
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    assert json.loads((tmp_path / "run" / "hf_source.json").read_text())["special_ids"]["eos_token_id"] == [2, first]
    pipeline = load(tmp_path / "run")
    assert pipeline.end_ids == {2, first}
    text = " ".join(f"w{i}" for i in prompt)
    assert pipeline.generate(text, max_new_tokens=4, temperature=0) == [""]  # its first token ends it
    assert pipeline.generate(text, max_new_tokens=4, temperature=0, logit_bias={2: 100.0}) == [""]  # and the other
    assert pipeline.generate(text, max_new_tokens=4, temperature=0, stop_at_eos=False)[0]
    if importlib.util.find_spec("fastapi") is not None:  # attnkit serve (the serve extra) stops there too
        httpx = pytest.importorskip("httpx")
        from serve_helpers import running_server

        with running_server(tmp_path / "run") as (url, _):
            body = {"model": "run", "prompt": text, "max_tokens": 4, "temperature": 0}
            reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
        assert reply["choices"][0]["finish_reason"] == "stop" and reply["usage"]["completion_tokens"] == 0
    assert main(["convert", "--run", str(tmp_path / "run"), "--to-hf", str(tmp_path / "back")]) == 0
    assert json.loads((tmp_path / "back" / "config.json").read_text())["eos_token_id"] == [2, first]


@pytest.mark.parametrize(("edit", "said"), [
    (lambda t: t["model.norm.weight"].__setitem__(0, float("nan")), "model.norm.weight holds 1 NaN or infinite"),
    (lambda t: t["model.layers.0.input_layernorm.weight"].fill_(float("inf")), "holds 32 NaN or infinite values"),
    (lambda t: t.__setitem__("model.norm.weight", t["model.norm.weight"].to(torch.int32)),
     "is int32, not a type attnkit reads weights in"),
    # float8 weights (a quantized checkpoint whose config.json lost its quantization_config): no NaN check exists
    (lambda t: t.__setitem__("model.layers.1.mlp.up_proj.weight", t["model.layers.1.mlp.up_proj.weight"].to(
        torch.float8_e4m3fn)), "up_proj.weight is float8_e4m3fn, not a type attnkit reads weights in"),
])
def test_weights_that_are_not_finite_floats_are_refused_on_load(tmp_path, edit, said):
    hf_model("llama", tmp_path)
    _edit_weights(tmp_path, edit)
    with pytest.raises(CheckpointError, match=said):
        hf.load(tmp_path)
    with pytest.raises(CheckpointError, match=said):
        hf.convert_from_hf(tmp_path, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_run_whose_weights_turned_nan_is_refused_by_name(tmp_path):
    from attnkit.checkpoint import load_model, save_model

    hf_model("llama", tmp_path / "hf")
    loaded = hf.load(tmp_path / "hf")
    name = next(n for n, _ in loaded.model.named_parameters() if "norm" in n)
    with torch.no_grad():
        loaded.model.get_parameter(name)[3] = float("inf")
    save_model(loaded.model, loaded.config, tmp_path / "run")
    with pytest.raises(CheckpointError, match=rf"{name} holds 1 NaN or infinite values .* damaged"):
        load_model(tmp_path / "run")


@pytest.mark.parametrize("changes, said", [
    # a cross-encoder's relevance score: transformers trains any one-label classifier as a regression
    (dict(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0}), "problem_type=None with 1 label(s)"),
    (dict(problem_type="regression", id2label={"0": "score"}, label2id={"score": 0}),
     "problem_type='regression' with 1 label(s)"),
    (dict(problem_type="multi_label_classification"), "problem_type='multi_label_classification' with 3 label(s)"),
])
def test_a_regression_or_multi_label_classifier_is_refused_not_read_as_one_label(tmp_path, changes, said):
    hf_model("bert-classifier", tmp_path)
    _edit_config(tmp_path, **changes)
    if "id2label" in changes:  # the head's rows as its labels
        _edit_weights(tmp_path, lambda tensors: tensors.update(
            {name: tensors[name][:1] for name in ("classifier.weight", "classifier.bias")}))
    with pytest.raises(ConfigError) as refusal:
        hf.load(tmp_path)
    assert said in str(refusal.value) and "attnkit converts single-label classifiers" in str(refusal.value)
    if "id2label" not in changes:  # the same head as a single-label classifier loads
        _edit_config(tmp_path, problem_type="single_label_classification")
        assert hf.load(tmp_path).config.n_classes == 3
