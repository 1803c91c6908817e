"""Write tiny recurrent-lm and recurrent-seq2seq runs with the code this runs under, and their logits."""
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from attnkit.checkpoint import save_model
from attnkit.config import ModelConfig
from attnkit.models import build_model

out = Path(sys.argv[1])
torch.set_num_threads(1)
runs = {
    "recurrent-lm-lstm-tied": dict(family="recurrent-lm", vocab_size=23, cell="lstm", n_layers=2, hidden_size=24,
                                   embedding_dim=16, tie_embeddings=True),
    "recurrent-lm-gru-untied": dict(family="recurrent-lm", vocab_size=23, cell="gru", n_layers=1, hidden_size=24,
                                    embedding_dim=16, tie_embeddings=False),
    "recurrent-seq2seq-attn": dict(family="recurrent-seq2seq", vocab_size=23, cell="gru", n_layers=1,
                                   hidden_size=24, embedding_dim=16, attention="bahdanau"),
    "recurrent-seq2seq-none": dict(family="recurrent-seq2seq", vocab_size=23, cell="lstm", n_layers=1,
                                   hidden_size=24, embedding_dim=16, attention="none"),
}
for name, fields in runs.items():
    torch.manual_seed(0)
    config = ModelConfig(**fields)
    model = build_model(config).eval()
    run = out / name
    run.mkdir(parents=True)
    save_model(model, config, run)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 23, (2, 7), generator=g)
    with torch.no_grad():
        if config.family == "recurrent-lm":
            logits = model(ids).logits
        else:
            tgt = torch.randint(0, 23, (2, 5), generator=g)
            logits = model(ids, tgt).logits
    tensors = {"input_ids": ids, "logits": logits}
    if config.family != "recurrent-lm":
        tensors["decoder_input_ids"] = tgt
    save_file(tensors, str(run / "expected.safetensors"))
    print(name, sum(p.numel() for p in model.parameters()))
