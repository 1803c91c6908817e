"""Tiny run directories for the export tests (GGUF, ONNX): random models of each exported layout with a byte-level
BPE trained on attnkit's own source, and one decoder trained briefly, whose perplexity means something."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from attnkit import build_model
from attnkit.checkpoint import save_model
from attnkit.config import ModelConfig
from attnkit.tasks.lm import LM
from attnkit.tokenize import HFTokenizer, train_bpe

SOURCE = Path(__file__).resolve().parents[1] / "src" / "attnkit"
SPECIALS = {"pad": "<pad>", "bos": "<bos>", "eos": "<eos>", "unk": "<unk>"}
VOCAB = 320  # a multiple of 32 rows is not needed, but columns are: every width below is one

# attnkit config fields of each exported layout, small (the default `lm` model's own layout first)
LAYOUTS = {
    "default": {**LM.default_model, "d_model": 64, "d_ff": 192, "n_layers": 2, "max_seq_len": 64},
    "llama-gqa-untied": dict(family="decoder", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=160,
                             position="rope", norm="rms", activation="swiglu", bias=False, max_seq_len=64,
                             tie_embeddings=False, rope_theta=500.0),
    # GPT-2: transformers' GGUF reader takes n_positions and n_inner at GPT-2's own values (1024, 4 C)
    "gpt2": dict(family="decoder", d_model=64, n_layers=2, n_heads=4, d_ff=256, position="learned", norm="layer",
                 activation="gelu_tanh", max_seq_len=1024),
    # Llama with attention_bias and mlp_bias: the q and k biases pair their dimensions as the rows do
    "llama-bias": dict(family="decoder", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=160, position="rope",
                       norm="rms", activation="swiglu", bias=True, max_seq_len=64, tie_embeddings=False),
    "mistral-window": dict(family="decoder", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=160,
                           position="rope", norm="rms", activation="swiglu", bias=False, max_seq_len=64,
                           tie_embeddings=False, attention_window=16),
}
ENCODERS = {
    "classify": dict(family="encoder", encoder_head="classify", n_classes=3, pooler=True, type_vocab_size=2,
                     norm_position="post", embedding_norm=True),
    "tag": dict(family="encoder", encoder_head="tag", n_classes=5),
    "embeddings": dict(family="encoder", encoder_head="none", pooling="mean"),
}


@functools.cache
def tokenizer() -> HFTokenizer:
    texts = [path.read_text(encoding="utf-8") for path in sorted(SOURCE.glob("*.py"))]
    return train_bpe(texts, vocab_size=VOCAB, special_tokens=SPECIALS)


def source_text() -> str:
    """attnkit's own source: text to measure perplexity on."""
    return "".join(path.read_text(encoding="utf-8") for path in sorted((SOURCE / "interop").glob("*.py")))


def random_run(root: Path, fields: dict, *, name: str = "run", seed: int = 0) -> Path:
    """A run of `fields` whose every parameter is redrawn (std 0.2, norm gains around 1), so a tensor written to
    the wrong place changes the logits."""
    config = ModelConfig(**{"vocab_size": tokenizer().vocab_size, **fields})
    torch.manual_seed(seed)
    model = build_model(config).eval()
    with torch.no_grad():
        for pname, parameter in model.named_parameters():
            is_gain = parameter.dim() == 1 and "norm" in pname and pname.endswith("weight")
            parameter.normal_(1.0 if is_gain else 0.0, 0.2)
    run = root / name
    save_model(model, config, run)
    tokenizer().save(run / "tokenizer")
    return run


def trained_run(root: Path, *, steps: int = 300, length: int = 64) -> Path:
    """The default `lm` model's layout, small, trained for `steps` AdamW steps on attnkit's source."""
    config = ModelConfig(**{**LAYOUTS["default"], "vocab_size": tokenizer().vocab_size})
    torch.manual_seed(0)
    model = build_model(config)
    ids = torch.tensor(tokenizer().encode("".join(p.read_text(encoding="utf-8") for p in sorted(SOURCE.glob("*.py")))))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - length - 1, (16,), generator=generator)
        batch = torch.stack([ids[s:s + length + 1] for s in starts.tolist()])  # (B, T + 1)
        loss = model(batch[:, :-1], labels=batch[:, 1:]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    run = root / "trained"
    save_model(model.eval(), config, run)
    tokenizer().save(run / "tokenizer")
    return run
