"""Evaluation under torchrun: two CPU ranks (gloo), under DDP and FSDP2, each score their share of the validation
set (lm, mlm, classify, tag) and reduce the metrics from summed statistics; the numbers are one process's on the same
weights and data, every rank runs as many forward passes (FSDP2 gathers weights inside each) and none scores all.

This file is also the script the ranks run (`torchrun ... tests/test_distributed_eval.py OUT`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit.config import ModelConfig
from attnkit.data import LabelledData, LabelVocab, LMData
from attnkit.models import build_model
from attnkit.tasks.classify import ClassifyTask
from attnkit.tasks.lm import LMTask, MLMTask
from attnkit.tasks.tag import TaggedData, TagTask
from attnkit.tokenize import CharTokenizer

TASKS = ("lm", "mlm", "classify", "tag")
TOKENIZER = CharTokenizer.from_texts(["abcdefgh [MASK]"])


def build(name: str) -> tuple[object, torch.nn.Module]:
    """The task and its tiny model, the same in every process (seeded). The lm split scores 10 windows of 8 tokens
    (the last shorter) in batches of 4, so the later batches leave one rank without a window."""
    rng = np.random.default_rng(0)
    stream = LMData(rng.integers(0, TOKENIZER.vocab_size, 275), n_train=200)  # validation: the last 75 tokens
    size = dict(vocab_size=TOKENIZER.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_seq_len=16,
                dropout=0.0)
    torch.manual_seed(0)
    if name == "lm":
        return LMTask(stream, batch_size=4, seq_len=8, seed=0), build_model(ModelConfig(family="decoder", **size))
    if name == "mlm":
        task = MLMTask(stream, tokenizer=TOKENIZER, batch_size=4, seq_len=10, seed=0)
        return task, build_model(ModelConfig(family="encoder", encoder_head="mlm", **size))
    labels = ["B-X", "I-X", "O"]  # tag: entities of type X; classify: three classes
    if name == "tag":  # 7 sentences of 1 to 4 words, entity scores from seqeval's entities
        sentences = [(words, [labels[i] for i in rng.integers(0, 3, len(words))]) for words in (
            ["".join(rng.choice(list("abcdefgh"), 2)) for _ in range(int(rng.integers(1, 5)))] for _ in range(7))]
        val = TaggedData.from_sentences(sentences, TOKENIZER, label_vocab=LabelVocab(tuple(labels)), max_len=16,
                                        batch_size=4, seed=0)
        model = build_model(ModelConfig(family="encoder", encoder_head="tag", n_classes=3, **size))
        return TagTask(val, val, scheme="BIO"), model
    examples = [("".join(rng.choice(list("abcdefgh"), int(rng.integers(2, 12)))), labels[i % 3]) for i in range(11)]
    val = LabelledData.from_examples(examples, TOKENIZER, label_vocab=LabelVocab(tuple(labels)), max_len=16,
                                     batch_size=4, seed=0)
    model = build_model(ModelConfig(family="encoder", encoder_head="classify", n_classes=3, **size))
    return ClassifyTask(val, val), model


def evaluate(name: str, shard=None) -> dict:
    """The task's metrics, and the forward passes and rows the model ran (this rank's)."""
    task, model = build(name)
    if shard is not None:
        model = shard.wrap(model, dtype="fp32", seed=0)  # DDP: broadcast (same weights); FSDP2: sharded in place
    seen = {"calls": 0, "rows": 0}

    def count(module, args, kwargs):
        seen["calls"] += 1
        seen["rows"] += args[0].shape[0]  # (B, T) ids

    model = getattr(model, "module", model)  # DDP: the replica inside (as the trainer evaluates through)
    model.register_forward_pre_hook(count, with_kwargs=True)
    model.eval()
    with torch.no_grad():
        metrics = task.evaluate(model) if shard is None else task.evaluate(model, shard=shard)
    return {"metrics": metrics, **seen}


def main(out: str) -> None:
    import torch.distributed as dist

    from attnkit.train.distributed import Replicated, Sharded, World

    dist.init_process_group("gloo")
    world, results = World.from_env(), {}
    for kind in (Replicated, Sharded):
        for name in TASKS:
            mine = evaluate(name, kind(world, "cpu"))
            ranks: list = [None] * world.size
            dist.all_gather_object(ranks, mine)
            results[f"{kind.kind} {name}"] = ranks
    if world.rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


@pytest.mark.slow  # two processes (12 s); training's two-rank tests stay in the default suite
def test_two_ranks_evaluate_their_shares_to_one_process_numbers(tmp_path):
    out = tmp_path / "ranks.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__,
               str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    for name in TASKS:
        one = evaluate(name)
        for kind in ("DDP", "FSDP2"):
            ranks = results[f"{kind} {name}"]
            for rank in ranks:
                torch.testing.assert_close(rank["metrics"], one["metrics"], rtol=1e-5, atol=1e-6)
                assert rank["calls"] == one["calls"]  # as many forward passes on every rank
                assert 0 < rank["rows"] < one["rows"]  # a share, not the whole set
            assert sum(rank["rows"] for rank in ranks) >= one["rows"]  # every item scored (plus stand-ins)


if __name__ == "__main__":
    main(sys.argv[1])
