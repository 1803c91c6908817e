"""Round trips: attnkit -> Hugging Face directory -> attnkit (identical weights and logits), and the directories
attnkit writes load in `transformers` with the same logits; a model no layout holds is refused by name."""

import pytest
import torch
from interop_models import FAMILIES, batch, hf_model, transformers  # noqa: F401
from safetensors.torch import load_file

from attnkit import ConfigError, build_model, presets
from attnkit.interop import hf
from attnkit.models.encoder import EncoderModel
from attnkit.models.seq2seq import EncoderDecoder

# attnkit configs that a Hugging Face layout holds, and the class each is written as.
ATTNKIT_MODELS = {
    "GPT2LMHeadModel": presets.get("gpt2-tiny"),
    "LlamaForCausalLM": presets.get("llama2-tiny"),
    "BertForSequenceClassification": presets.get(
        "bert-tiny", type_vocab_size=2, embedding_norm=True, pooler=True, n_classes=3
    ),
    "BertModel": presets.get("bert-tiny", type_vocab_size=2, embedding_norm=True, pooler=True, encoder_head="none"),
    "BertForMaskedLM": presets.get(
        "bert-tiny", type_vocab_size=2, embedding_norm=True, encoder_head="mlm", mlm_transform=True, lm_head_bias=True
    ),
    "MarianMTModel": presets.get(
        "vaswani-tiny", sinusoidal_layout="halves", lm_head_bias=True, norm_eps=1e-5, activation="silu"
    ),
}


def _random_model(config, seed=0):
    torch.manual_seed(seed)
    model = build_model(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    return model


def _ours(model, ids, mask):
    with torch.no_grad():
        if isinstance(model, EncoderDecoder):
            return model(ids, ids, src_mask=mask, tgt_mask=mask).logits
        out = model(ids, attention_mask=mask)
        return out.hidden_states if isinstance(model, EncoderModel) else out.logits


def _theirs(reference, ids, mask):
    with torch.no_grad():
        if reference.config.is_encoder_decoder:
            out = reference(input_ids=ids, attention_mask=mask, decoder_input_ids=ids, decoder_attention_mask=mask)
            return out.logits
        out = reference(input_ids=ids, attention_mask=mask)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits


@pytest.mark.parametrize("architecture", ATTNKIT_MODELS)
def test_attnkit_to_hf_to_attnkit(tmp_path, architecture):
    config = ATTNKIT_MODELS[architecture]
    model = _random_model(config)
    labels = ["a", "b", "c"] if architecture == "BertForSequenceClassification" else None
    assert hf.save(model, tmp_path, config=config, labels=labels) == architecture

    back = hf.load(tmp_path)
    assert back.architecture == architecture and back.labels == labels
    theirs, ours = back.model.state_dict(), model.state_dict()
    assert theirs.keys() == ours.keys()
    for name, tensor in ours.items():
        assert torch.equal(theirs[name], tensor), name

    ids, mask = batch(0, length=8)
    ids = ids % config.vocab_size
    torch.testing.assert_close(_ours(back.model, ids, mask), _ours(model, ids, mask), atol=0, rtol=0)

    reference = getattr(transformers, architecture).from_pretrained(tmp_path).eval()
    real = mask.bool()
    expected, got = _theirs(reference, ids, mask), _ours(model, ids, mask)
    if got.dim() == 3:
        expected, got = expected[real], got[real]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_hf_to_attnkit_to_hf_writes_the_same_tensors(tmp_path, name):
    hf_model(name, tmp_path / "original")
    loaded = hf.load(tmp_path / "original")
    hf.save(loaded.model, tmp_path / "copy", config=loaded.config, labels=loaded.labels,
            special_ids=loaded.special_ids)
    original = load_file(tmp_path / "original" / "model.safetensors")
    copy = load_file(tmp_path / "copy" / "model.safetensors")
    assert copy.keys() == original.keys()
    for key, tensor in original.items():
        assert torch.equal(copy[key], tensor), key
    assert hf.load(tmp_path / "copy").special_ids == loaded.special_ids


def test_a_model_no_layout_holds_is_refused_with_the_differences(tmp_path):
    config = presets.get("gpt2-tiny", position="rope")
    with pytest.raises(ConfigError, match="no Hugging Face layout.*position='rope'"):
        hf.save(build_model(config), tmp_path, config=config)
    config = presets.get("llama2-tiny", bias=True, norm_position="post")
    with pytest.raises(ConfigError, match="norm_position='post' \\(a LlamaForCausalLM has 'pre'\\)"):
        hf.save(build_model(config), tmp_path, config=config)
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize("task", ["classify", "tag", "mlm"])
def test_an_encoder_built_from_scratch_is_refused_with_the_fields_that_keep_it_from_bert(tmp_path, task):
    from attnkit.config import ModelConfig
    from attnkit.tasks import tasks

    spec = next(spec for spec in tasks() if spec.name == task)
    fields = {**spec.default_model, "d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1, "vocab_size": 50}
    config = ModelConfig(**fields, **({"n_classes": 3} if task != "mlm" else {}))
    with pytest.raises(ConfigError, match=r"the nearest is Bert\w+: embedding_norm=False \(a Bert\w+ has True\); "
                                          r"final_norm=True \(a Bert\w+ has False\);.* norm_position='pre' "
                                          r"\(a Bert\w+ has 'post'\)\. Train with those fields .* --to-onnx"):
        hf.save(build_model(config), tmp_path, config=config)
    assert not (tmp_path / "config.json").exists()


# attnkit encoders without token types (type_vocab_size=0, as `attnkit train` builds them), the class each is written
# as and the Auto class transformers users load it with.
UNTYPED_ENCODERS = {
    "BertForMaskedLM": (dict(encoder_head="mlm", mlm_transform=True, lm_head_bias=True), "AutoModelForMaskedLM"),
    "BertForSequenceClassification": (dict(pooler=True, n_classes=3), "AutoModelForSequenceClassification"),
    "BertForTokenClassification": (dict(encoder_head="tag", n_classes=3), "AutoModelForTokenClassification"),
}


@pytest.mark.parametrize("architecture", UNTYPED_ENCODERS)
def test_an_encoder_without_token_types_is_written_with_one_zero_type_and_read_back_without(tmp_path, architecture):
    """BertEmbeddings always adds token_type_embeddings(token_type_ids=0): a table of no rows crashes it, one row of
    zeros adds nothing. Reading it back gives the model that was written."""
    fields, auto = UNTYPED_ENCODERS[architecture]
    config = presets.get("bert-tiny", embedding_norm=True, **fields)
    assert config.type_vocab_size == 0
    model = _random_model(config)
    labels = ["a", "b", "c"] if "n_classes" in fields else None
    assert hf.save(model, tmp_path, config=config, labels=labels) == architecture

    written = load_file(tmp_path / "model.safetensors")["bert.embeddings.token_type_embeddings.weight"]
    assert written.shape == (1, config.d_model) and written.dtype == torch.float32 and not written.any()
    reference = getattr(transformers, auto).from_pretrained(tmp_path).eval()
    assert reference.config.type_vocab_size == 1
    ids, mask = batch(0, length=8)
    ids = ids % config.vocab_size
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
    got = _ours(model, ids, mask)
    if got.dim() == 3:
        expected, got = expected[mask.bool()], got[mask.bool()]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)

    back = hf.load(tmp_path)
    assert back.config.type_vocab_size == 0 and back.config.resolved == config.resolved
    theirs, ours = back.model.state_dict(), model.state_dict()
    assert theirs.keys() == ours.keys()
    for name, tensor in ours.items():
        assert torch.equal(theirs[name], tensor), name
