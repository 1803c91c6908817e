"""Reward models (`attnkit train --task reward`) and best-of-N sampling (`attnkit generate --best-of N --reward RUN`):
the ranking loss against a hand computation and, with its gradients, against TRL's RewardTrainer on the same tiny
Llama; the reward read at the whole sequence's last token; best-of-N keeping the highest reward, the same under a
seed; the refusals of bad input; and short runs from the command line."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from test_dpo import ALPHABET, pretrained, trl_packages

from attnkit import build_model
from attnkit.config import ModelConfig
from attnkit.data.preferences import PreferenceRows, TokenizedPair, read_pairs
from attnkit.errors import ConfigError, InputError
from attnkit.tasks.best_of import best_of_n
from attnkit.tasks.reward import Reward, RewardOptions, RewardTask, batch_rewards, ranking_loss, whole_sequences

PAD = 0


def tiny_reward_model(seed=0, position="learned"):
    torch.manual_seed(seed)
    config = ModelConfig(family="decoder", vocab_size=len(ALPHABET) + 4, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                         max_seq_len=64, decoder_head="reward", n_classes=1, position=position)
    return build_model(config).eval()


def rows(pairs, batch_size=8):
    """PreferenceRows of (prompt, chosen, rejected, margin) token lists."""
    return PreferenceRows([TokenizedPair(f"p line {i}", *pair) for i, pair in enumerate(pairs)], pad_id=PAD,
                          batch_size=batch_size)


PAIRS = [([5, 6, 7], [8, 9, 2], [10, 2], 0.0), ([11], [12, 13, 14, 15, 2], [16, 17, 2], 1.5),
         ([18, 19], [20, 2], [21, 22, 23, 24, 25, 2], -0.5)]


def test_the_ranking_loss_equals_a_hand_computation_with_margins_and_centring():
    chosen, rejected = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64), torch.tensor([0.0, 0.5, 2.5],
                                                                                          dtype=torch.float64)
    margins = torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64)
    for center in (0.0, 0.01):
        expected = sum(-math.log(1 / (1 + math.exp(-(c - r - m)))) for c, r, m in
                       zip(chosen.tolist(), rejected.tolist(), margins.tolist(), strict=True)) / 3
        expected += center * sum((c + r) ** 2 for c, r in zip(chosen.tolist(), rejected.tolist(), strict=True)) / 3
        found = ranking_loss(chosen, rejected, margins=margins, center_rewards=center)
        assert found.item() == pytest.approx(expected, rel=1e-12)
    without = ranking_loss(chosen, rejected).item()
    assert without != pytest.approx(ranking_loss(chosen, rejected, margins=margins).item())


def test_the_reward_is_the_head_at_the_last_token_of_the_whole_sequence_alone():
    """Each row's reward is the head applied to the stack's state at the last token of prompt + response + EOS, as
    that sequence alone gives it: not at the padding, and not before the EOS the rows' inputs leave out."""
    model = tiny_reward_model()
    batch = rows(PAIRS).collate([0, 1, 2])
    ids, mask = whole_sequences(batch)
    found = batch_rewards(model, batch)  # (B, 2)
    with torch.no_grad():
        for i, (prompt, chosen, rejected, _) in enumerate(PAIRS):
            for j, response in enumerate((chosen, rejected)):
                sequence = [*prompt, *response]
                assert ids[2 * i + j, : len(sequence)].tolist() == sequence  # the EOS put back
                assert mask[2 * i + j].sum().item() == len(sequence)
                hidden, _ = model.stack(torch.tensor([sequence]))  # (1, T, C)
                expected = hidden[0, -1] @ model.classifier.weight[0]
                before_eos = hidden[0, -2] @ model.classifier.weight[0]
                assert found[i, j].item() == pytest.approx(expected.item(), abs=1e-5)
                assert found[i, j].item() != pytest.approx(before_eos.item(), abs=1e-4)


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_a_batch_padded_on_either_side_scores_each_row_as_alone(position):
    """Rows of a batch padded on the left or on the right, the padding masked, score as each row does alone: the
    head reads the last real token wherever the padding lies, which the padding neither sees nor shifts."""
    model = tiny_reward_model(position=position)
    rows = [[5, 6, 7, 8, 9, 2], [10, 11, 2], [12, 2]]
    with torch.no_grad():
        alone = torch.cat([model(torch.tensor([row])).logits for row in rows])  # (B, 1)
        for left in (False, True):
            ids = torch.tensor([[PAD] * (6 - len(r)) * left + r + [PAD] * (6 - len(r)) * (not left) for r in rows])
            found = model(ids, attention_mask=ids != PAD).logits  # (B, 1)
            torch.testing.assert_close(found, alone, rtol=1e-5, atol=1e-5, msg=f"left-padded: {left}")


def test_a_known_head_gives_a_known_reward():
    """With the head reading one coordinate of the final state, the reward is that coordinate at the last token."""
    model = tiny_reward_model()
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.weight[0, 3] = 2.0
        ids = torch.tensor([[5, 6, 7, 2, PAD, PAD]])
        hidden, _ = model.stack(ids[:, :4])
        reward = model(ids, attention_mask=torch.tensor([[1, 1, 1, 1, 0, 0]])).logits
    assert reward.shape == (1, 1)
    assert reward.item() == pytest.approx(2.0 * hidden[0, 3, 3].item(), rel=1e-6)


TRL_SCRIPT = r"""
import collections, sys, types
import torch
sys.path.append(sys.argv[1])
import transformers
from trl.trainer.reward_trainer import RewardTrainer

given = torch.load(sys.argv[3])
model = transformers.LlamaForSequenceClassification.from_pretrained(sys.argv[2], num_labels=1)
with torch.no_grad():
    model.score.weight.copy_(given["score"])
model.train()

class Accelerator:
    gather = gather_for_metrics = staticmethod(lambda t: t)

trainer = types.SimpleNamespace(model=model, accelerator=Accelerator(), _total_train_tokens=0, _tp_size=1,
                                args=types.SimpleNamespace(center_rewards_coefficient=given["center"]),
                                _metrics=collections.defaultdict(lambda: collections.defaultdict(list)))
inputs = {"input_ids": given["input_ids"], "attention_mask": given["attention_mask"], "margin": given["margin"]}
loss = RewardTrainer.compute_loss(trainer, model, inputs)
loss.backward()
torch.save({"loss": loss.detach(), "metrics": {k: v[-1] for k, v in trainer._metrics["train"].items()},
            "score": model.score.weight.grad, "embed": model.model.embed_tokens.weight.grad,
            "norm": sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None)},
           sys.argv[4])
"""


@pytest.mark.slow  # TRL's import alone takes about 20 s
def test_the_loss_its_gradients_and_metrics_equal_trls_reward_trainer_on_the_same_llama(tmp_path):
    """TRL's `RewardTrainer.compute_loss` on a tiny Hugging Face LlamaForSequenceClassification (the margin and the
    centring term given), against attnkit's reward task on the same weights read through `--init-from`'s loader:
    the loss, the metrics, the head's and the embeddings' gradients, and the norm of all of them."""
    folder = trl_packages()
    if folder is None:
        pytest.skip("TRL is not installed: pip install --no-deps --target DIR trl datasets, then TRL_PACKAGES=DIR")
    pytest.importorskip("transformers")
    from interop_models import PAD as HF_PAD
    from interop_models import hf_model, word_tokenizer

    from attnkit.interop.hf import load as load_hf
    from attnkit.tasks.reward import REWARD
    from attnkit.train.finetune import load_body, read_source, target_config

    hf_model("llama", tmp_path / "hf")
    word_tokenizer(tmp_path / "hf")
    source = read_source(tmp_path / "hf", load_hf=load_hf)
    model = build_model(target_config(source, spec=REWARD, assignments=[]))
    load_body(model, source)
    score = torch.randn(1, 32, generator=torch.Generator().manual_seed(1)) * 0.5
    with torch.no_grad():
        model.classifier.weight.copy_(score)
    data = PreferenceRows([TokenizedPair(f"p {i}", *pair) for i, pair in enumerate(PAIRS)], pad_id=HF_PAD,
                          batch_size=3)
    batch = data.collate([0, 1, 2])
    task = RewardTask(data, data, options=RewardOptions(center_rewards=0.01))
    loss, metrics = task.loss_and_metrics(model.train(), batch)
    loss.backward()
    ids, mask = whole_sequences(batch)  # (2B, T + 1), pair i's chosen at 2i; TRL's: the chosen rows, then the rejected
    given = {"input_ids": torch.cat([ids[0::2], ids[1::2]]).masked_fill(~torch.cat([mask[0::2], mask[1::2]]), HF_PAD),
             "attention_mask": torch.cat([mask[0::2], mask[1::2]]).long(), "margin": batch.margins, "score": score,
             "center": 0.01}
    torch.save(given, tmp_path / "given.pt")
    done = subprocess.run([sys.executable, "-c", TRL_SCRIPT, folder, str(tmp_path / "hf"), str(tmp_path / "given.pt"),
                           str(tmp_path / "trl.pt")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    trl = torch.load(tmp_path / "trl.pt")
    assert loss.item() == pytest.approx(trl["loss"].item(), rel=1e-5)
    for name in ("accuracy", "margin"):
        assert metrics[name].item() == pytest.approx(trl["metrics"][name], rel=1e-5, abs=1e-7), name
    torch.testing.assert_close(model.classifier.weight.grad, trl["score"], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(model.stack.embeddings.token.weight.grad, trl["embed"], rtol=1e-4, atol=1e-6)
    norm = sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None)
    assert norm.item() == pytest.approx(trl["norm"].item(), rel=1e-4)


class Scripted:
    """A stand-in policy and reward: generate gives `texts` in order; reward scores a text by `scores`."""

    def __init__(self, texts, scores):
        self.texts, self.scores, self.asked = texts, scores, []

    def generate(self, prompt, **options):
        self.asked.append(options)
        taken, self.texts = self.texts[: options["num_samples"]], self.texts[options["num_samples"]:]
        return taken

    def reward(self, prompt, replies):
        return [Reward(self.scores[r]) for r in replies]


def test_best_of_n_keeps_the_highest_reward_and_the_first_of_equal_ones():
    scripted = Scripted(["a", "b", "c", "d", "e", "f"], {"a": 0.1, "b": 2.0, "c": -1.0, "d": 5.0, "e": 5.0, "f": 1.0})
    first, second = best_of_n(scripted, scripted, ["p", "q"], n=3, seed=7, temperature=0.5)
    assert (first.best, first.text, first.reward) == (1, "b", 2.0)
    assert (second.best, second.text) == (0, "d")  # d and e tie: the first is kept
    assert first.rewards == [0.1, 2.0, -1.0] and scripted.asked[0] == {"num_samples": 3, "seed": 7, "temperature": 0.5}
    assert first.to_dict()["text"] == "b"


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "4"])
def test_best_of_n_refuses_n_below_one_or_not_an_integer(n):
    scripted = Scripted(["a"], {"a": 0.0})
    with pytest.raises(InputError, match="N must be an integer of 1 or more"):
        best_of_n(scripted, scripted, "p", n=n)
    assert not scripted.asked


def test_best_of_n_refuses_options_that_draw_other_samples_or_one_sample_n_times_and_prompts_as_token_ids():
    scripted = Scripted(["a"], {"a": 0.0})
    with pytest.raises(InputError, match="does not take num_beams"):
        best_of_n(scripted, scripted, "p", n=2, num_beams=2)
    with pytest.raises(InputError, match="temperature=0 decodes greedily"):
        best_of_n(scripted, scripted, "p", n=2, temperature=0)
    assert not scripted.asked
    for prompts in ([[1, 2]], [1, 2], [], ["a", ["b"]]):
        with pytest.raises(InputError, match="prompts are a text, a chat"):
            best_of_n(scripted, scripted, prompts, n=2)


@pytest.mark.parametrize(("line", "said"), [
    ('{"prompt": "a", "chosen": "b"}', "but not rejected"),
    ('{"prompt": "a", "chosen": "b", "rejected": "c", "margin": "big"}', '"margin": \'big\''),
    ('{"prompt": "a", "chosen": "b", "rejected": "c", "margin": NaN}', "finite number"),
])
def test_a_pairs_line_missing_a_field_or_with_a_bad_margin_is_refused_by_line(tmp_path, line, said):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "x", "chosen": "y", "rejected": "z", "margin": 2}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 2") as error:
        read_pairs(path)
    assert said in str(error.value)
    path.write_text('{"prompt": "x", "chosen": "y", "rejected": "z", "margin": 2}\n', encoding="utf-8")
    assert read_pairs(path)[0].margin == 2.0


def test_options_out_of_range_are_refused_naming_the_field():
    for value in (-0.1, math.inf, math.nan):
        with pytest.raises(ConfigError, match="center_rewards"):
            RewardOptions(center_rewards=value)


# Runs from the command line ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny model briefly pretrained, 24 pairs that prefer capitals to train on and 8 held out (test_dpo's)."""
    return pretrained(tmp_path_factory.mktemp("reward"), steps=4, pairs=32, held_out=8)


def reward_args(folder, out, *more, init_from=None):
    return ["train", "--task", "reward", "--init-from", str(init_from or folder / "base"), "--data",
            str(folder / "train.jsonl"), "--val-data", str(folder / "val.jsonl"), "--out", str(out), "--batch-size",
            "8", "--lr", "3e-3", "--warmup", "2", "--seed", "0", "--no-progress", "--no-instruments", *more]


@pytest.fixture(scope="module")
def reward_run(base, tmp_path_factory):
    from attnkit import cli

    run = tmp_path_factory.mktemp("rm") / "rm"
    assert cli.main(reward_args(base, run, "--max-steps", "12", "--eval-every", "6")) == 0
    return run


def test_a_reward_run_learns_to_rank_held_out_pairs_and_eval_reproduces_its_last_evaluation(base, reward_run, capsys):
    from attnkit import cli, load

    records = [json.loads(line) for line in (reward_run / "metrics.jsonl").read_text().splitlines()]
    evaluations = [r for r in records if "val_loss" in r]
    assert all("accuracy" in r and "margin" in r for r in records if r.get("kind") == "train")
    assert evaluations[-1]["accuracy"] >= 0.9 and evaluations[-1]["margin"] > 0
    assert evaluations[-1]["val_loss"] < math.log(2)
    assert (reward_run / "model.safetensors").is_file() and json.loads((reward_run / "task.json").read_text())[
        "task"] == "reward"
    capsys.readouterr()
    assert cli.main(["eval", str(reward_run), "--data", str(base / "val.jsonl"), "--no-progress"]) == 0
    scored = json.loads((reward_run / "eval" / "eval.json").read_text())["rows"][0]
    for name in ("val_loss", "accuracy", "margin"):
        assert scored[name] == pytest.approx(evaluations[-1][name], rel=1e-4, abs=1e-6), name
    pair = read_pairs(base / "val.jsonl")[0]
    chosen, rejected = load(reward_run).reward(pair.prompt, [pair.chosen, pair.rejected])
    assert chosen.reward > rejected.reward and not chosen.truncated and not rejected.truncated
    whole = load(reward_run).reward([pair.prompt + pair.chosen, pair.prompt + pair.rejected])  # characters: the same
    assert [r.reward for r in whole] == pytest.approx([chosen.reward, rejected.reward], abs=1e-5)
    with pytest.raises(InputError, match="give one prompt"):
        load(reward_run).reward(["a", "b"], ["c", "d", "e"])


@pytest.mark.parametrize("layout", ["text", "chat"])
def test_reward_scores_a_reply_as_training_reads_it_in_both_layouts(reward_run, layout):
    """`reward(prompt, replies)` gives each reply the reward training gives it as a pair's response (`batch_rewards`
    over the pairs' rows), for a plain-text prompt and for a chat rendered by the run's template: both read the
    same tokens and the same last one."""
    from attnkit import load
    from attnkit.data.preferences import PreferencePair
    from attnkit.tasks.reward import rows_of_pairs

    pipeline = load(reward_run)
    replies = ["PRINT(X)", "print(x) and more"]
    prompt = "def f(x):\n    " if layout == "text" else [{"role": "user", "content": "def f(x):"}]
    chosen, rejected = (r if layout == "text" else [{"role": "assistant", "content": r}] for r in replies)
    data = rows_of_pairs([PreferencePair("line 1", prompt, chosen, rejected)], template=pipeline.chat_template,
                         tokenizer=pipeline.tokenizer, seq_len=pipeline.config.max_seq_len, batch_size=1)
    with torch.no_grad():
        trained = batch_rewards(pipeline.model, next(iter(data.eval_batches())))[0].tolist()  # (2,)
    assert [r.reward for r in pipeline.reward(prompt, replies)] == pytest.approx(trained, abs=1e-5)


def test_best_of_n_from_the_command_line_prints_the_top_candidate_the_same_under_a_seed(base, reward_run, capsys):
    from attnkit import cli, load

    args = ["generate", str(base / "base"), "--prompt", "def ", "--max-new-tokens", "8", "--seed", "3",
            "--best-of", "4", "--reward", str(reward_run)]
    assert cli.main([*args, "--candidates-json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert len(found["texts"]) == 4 and found["best"] == max(range(4), key=lambda i: found["rewards"][i])
    assert found["text"] == found["texts"][found["best"]]
    scored = load(reward_run).reward("def ", found["texts"])
    assert found["rewards"] == pytest.approx([r.reward for r in scored], abs=1e-5)
    assert found["texts"] == load(base / "base").generate("def ", max_new_tokens=8, seed=3, num_samples=4)
    assert cli.main(args) == 0
    assert capsys.readouterr().out == "def " + found["text"] + "\n"


@pytest.mark.parametrize(("more", "said"), [
    (["--best-of", "0"], "--best-of 0: best-of-N draws N candidates"),
    (["--best-of", "3"], "give --reward RUN"),
    (["--best-of", "3", "--reward", "RM", "--num-beams", "2"], "does not take --num-beams"),
    (["--best-of", "3", "--reward", "RM", "--temperature", "0"], "does not take --temperature 0 (greedy"),
    (["--best-of", "3", "--reward", "BASE"], "is a run of --task lm, not a reward model"),
])
def test_bad_best_of_flags_are_refused_in_one_line(base, reward_run, capsys, more, said):
    from attnkit import cli

    more = [str(reward_run) if m == "RM" else str(base / "base") if m == "BASE" else m for m in more]
    assert cli.main(["generate", str(base / "base"), "--prompt", "x", "--max-new-tokens", "2", *more]) != 0
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_chat_pairs_beside_plain_text_pairs_are_refused_naming_both_files(base, tmp_path, capsys):
    """A run learns one layout (task.json records which): --val-data of chats beside --data of plain text is refused
    before training, naming both files, where the record named the first pair's layout alone."""
    from attnkit import cli

    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"prompt": [{"role": "user", "content": "a"}], "chosen": [{"role": "assistant",
                     "content": "B"}], "rejected": [{"role": "assistant", "content": "b"}]}) + "\n", encoding="utf-8")
    args = reward_args(base, tmp_path / "rm", "--max-steps", "1")
    args[args.index("--val-data") + 1] = str(chats)
    assert cli.main(args) != 0
    err = capsys.readouterr().err
    assert f"{chats} holds chat messages and {base / 'train.jsonl'} plain text" in err and "Traceback" not in err
    assert not (tmp_path / "rm" / "model.safetensors").exists()


def test_a_reward_model_needs_a_decoder_to_start_from(base, tmp_path, capsys):
    pytest.importorskip("transformers")
    from interop_models import hf_model, word_tokenizer

    from attnkit import cli

    code = cli.main(["train", "--task", "reward", "--data", str(base / "train.jsonl"), "--out", str(tmp_path / "x"),
                     "--no-progress"])
    assert code != 0 and "give --init-from RUN_DIR" in capsys.readouterr().err
    hf_model("bert", tmp_path / "bert")
    word_tokenizer(tmp_path / "bert")
    code = cli.main(reward_args(base, tmp_path / "y", "--max-steps", "1", init_from=tmp_path / "bert"))
    err = capsys.readouterr().err
    assert code != 0 and "holds a encoder model, which --task reward cannot train" in err



def test_a_reward_run_is_served_at_v1_reward_each_text_scored_whole_or_said_truncated(base, reward_run):
    """`attnkit serve` answers POST /v1/reward with each text's reward and whether it was truncated, as `reward(texts)`
    gives them (an over-long text is said `truncated`, as /v1/classify says it), refuses an empty text, no text or a
    chat in OpenAI's error shape, and offers no completions (a reward model writes nothing)."""
    from fastapi.testclient import TestClient

    from attnkit import load
    from attnkit.serve import ServeSettings, build_app

    texts = ["import os\nHELLO WORLD", "import os\nhello world", "HELLO " * load(reward_run).config.max_seq_len]
    with TestClient(build_app(ServeSettings(run=str(reward_run)))) as client:
        answer = client.post("/v1/reward", json={"input": texts})
        assert answer.status_code == 200, answer.text
        assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 404
        for body, said in (({"input": ["x", ""]}, "text 1 is empty"), ({"input": []}, "at least 1 item"),
                           ({"input": [{"role": "user", "content": "x"}]}, "valid string")):
            refused = client.post("/v1/reward", json=body)
            assert 400 <= refused.status_code < 500 and said in refused.json()["error"]["message"], refused.text
            assert refused.json()["error"]["type"] == "invalid_request_error"
    found = [row["result"] for row in answer.json()["data"]]
    expected = load(reward_run).reward(texts)
    assert [row["truncated"] for row in found] == [False, False, True] == [r.truncated for r in expected]
    assert [row["reward"] for row in found] == pytest.approx([r.reward for r in expected], abs=1e-5)


def test_an_over_long_text_is_scored_on_its_first_window_and_said_truncated(reward_run, caplog):
    """A text longer than the model's window is scored on its first max_seq_len tokens: two texts alike there but
    not after score alike, each `truncated`, with a warning naming the fix; a text that fits is not truncated. Each is
    a `Reward` as attnkit.generate names it, beside `Classification`."""
    from attnkit import load
    from attnkit.generate import Reward as PublicReward

    pipeline = load(reward_run)
    head = "HELLO " * pipeline.config.max_seq_len  # a character tokenizer: a token a character, past the window
    with caplog.at_level("WARNING", logger="attnkit.tasks.reward"):
        short, long, longer = pipeline.reward(["HELLO", head, head + "world"])
    assert all(isinstance(result, PublicReward) for result in (short, long, longer))
    assert (short.truncated, long.truncated, longer.truncated) == (False, True, True)
    assert long.reward == pytest.approx(longer.reward, abs=1e-6) and short.reward != pytest.approx(long.reward)
    assert "2 text(s) hold more than" in caplog.text and "shorten them to score them whole" in caplog.text


def test_best_of_n_over_a_chat_samples_its_replies_and_scores_them_as_the_assistants_turn(base, reward_run, capsys):
    """A chat prompt: candidate i is the reply `Pipeline.chat` gives under seed + i, and its reward is the reward
    model on the conversation with that reply as the assistant's turn, rendered by the run's template."""
    from attnkit import cli, load

    policy, reward = load(base / "base"), load(reward_run)
    chat = [{"role": "user", "content": "def "}]
    found = best_of_n(policy, reward, chat, n=3, seed=5, max_new_tokens=6)[0]
    assert found.texts == [policy.chat(chat, seed=5 + i, max_new_tokens=6) for i in range(3)]
    for text, score in zip(found.texts, found.rewards, strict=True):
        turns = [*chat, {"role": "assistant", "content": text}]
        ids = reward.chat_template.conversation_ids(reward.tokenizer, turns)[0]
        with torch.no_grad():
            expected = reward.model(torch.tensor([ids])).logits[0, 0].item()
        assert score == pytest.approx(expected, abs=1e-5)
    assert cli.main(["generate", str(base / "base"), "--prompt", "def ", "--chat", "--max-new-tokens", "6", "--seed",
                     "5", "--best-of", "3", "--reward", str(reward_run), "--candidates-json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["texts"] == found.texts and shown["best"] == found.best


def test_gguf_refuses_a_reward_run_naming_the_form_that_holds_it(reward_run, tmp_path, capsys):
    from attnkit import cli

    assert cli.main(["convert", str(reward_run), "--to-gguf", str(tmp_path / "rm.gguf")]) != 0
    assert "head 'reward' gives a score per sequence: use --to-onnx for it" in capsys.readouterr().err
    assert not (tmp_path / "rm.gguf").exists()


@pytest.mark.slow  # the ONNX export traces the model: about 10 s on a loaded core
def test_a_reward_run_exported_to_onnx_scores_any_batch_as_the_run_does(reward_run, tmp_path):
    """The exported graph takes a batch of another size than it was traced on (the reward is gathered at each row's
    last token, not indexed by a batch size read as a number), and gives the run's rewards, padded on the right or
    on the left."""
    onnxruntime = pytest.importorskip("onnxruntime")
    from attnkit import cli, load

    assert cli.main(["convert", str(reward_run), "--to-onnx", str(tmp_path / "onnx")]) == 0
    pipeline = load(reward_run)
    texts = ["import os\nHELLO", "import os\nhello world"]
    rows = [pipeline.tokenizer.encode(t) + [pipeline.tokenizer.eos_id] for t in texts]
    ids = torch.full((2, max(map(len, rows))), pipeline.pad_id, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    rewards = [r.reward for r in pipeline.reward(texts)]
    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model.onnx"))
    logits = session.run(["logits"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    assert logits[:, 0].tolist() == pytest.approx(rewards, abs=1e-4)
    shifts = (1 - mask).sum(dim=1).tolist()  # each row's padding, moved to its left
    left = {name: torch.stack([row.roll(shift) for row, shift in zip(rows, shifts, strict=True)]).numpy()
            for name, rows in (("input_ids", ids), ("attention_mask", mask))}
    logits = session.run(["logits"], left)[0]
    assert logits[:, 0].tolist() == pytest.approx(rewards, abs=1e-4)


def test_a_reward_run_records_its_pairs_layout_and_warns_when_asked_to_score_the_other(reward_run, caplog):
    from attnkit import load

    assert json.loads((reward_run / "task.json").read_text())["pairs"] == "text"
    reward = load(reward_run)
    with caplog.at_level("WARNING", logger="attnkit.tasks.reward"):
        reward.reward("def ", ["x = 1"])
        assert not caplog.records
        reward.reward([{"role": "user", "content": "def "}], ["x = 1"])
    assert "learnt from text pairs and is asked to score chats" in caplog.text
