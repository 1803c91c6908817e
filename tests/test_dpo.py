"""Direct Preference Optimization (`attnkit train --task dpo`): the loss against a hand computation and against TRL's
DPOTrainer on identical log-probs, the response mask (prompt and padding left out), the reference read from the
frozen starting weights (with LoRA: the adapters off), the preference files' refusals by line, and a short run on
real text whose preferred style the model takes up (held-out reward accuracy, greedy generations)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnkit import build_model
from attnkit.chat_format import DEFAULT_FORMAT
from attnkit.config import ModelConfig
from attnkit.data.preferences import PreferencePair, preference_rows, read_pairs, tokenize_pair
from attnkit.errors import ConfigError, InputError
from attnkit.layers.lora import adapter_tensors
from attnkit.tasks.dpo import (
    REWARDS,
    DPOOptions,
    Reference,
    batch_logprobs,
    preference_loss,
    reward_metrics,
)
from attnkit.tokenize import CharTokenizer
from attnkit.train import TrainRequest, prepare

ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:!?<>\n"
TINY = ["d_model=32", "n_layers=2", "n_heads=2", "d_ff=64", "max_seq_len=64"]
# summed response log-probs of three pairs: policy chosen, policy rejected, reference chosen, reference rejected
LOGPS = ([-4.0, -9.5, -2.25], [-6.0, -7.0, -3.0], [-5.0, -8.0, -2.5], [-5.5, -7.5, -2.0])


def char_tokenizer():
    return CharTokenizer(ALPHABET, special_tokens={"pad": "<pad>", "unk": "<unk>", "bos": "<bos>", "eos": "<eos>"})


def tiny_model(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    config = ModelConfig(family="decoder", vocab_size=len(ALPHABET) + 4, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                         max_seq_len=64, dropout=dropout)
    return build_model(config).eval()


@pytest.mark.parametrize(("loss_type", "smoothing"), [("sigmoid", 0.0), ("sigmoid", 0.2), ("ipo", 0.0)])
def test_the_loss_and_rewards_equal_a_hand_computation(loss_type, smoothing):
    beta, tokens = 0.3, ([4, 9, 2], [5, 7, 3])
    found = preference_loss(*(torch.tensor(x, dtype=torch.float64) for x in LOGPS), beta=beta, loss_type=loss_type,
                            smoothing=smoothing, chosen_tokens=torch.tensor(tokens[0]),
                            rejected_tokens=torch.tensor(tokens[1]))
    for i, (pc, pr, rc, rr) in enumerate(zip(*LOGPS, strict=True)):
        if loss_type == "sigmoid":
            z = beta * ((pc - rc) - (pr - rr))
            expected = -(1 - smoothing) * math.log(1 / (1 + math.exp(-z))) - smoothing * math.log(1 / (1 + math.exp(z)))
        else:
            expected = ((pc - rc) / tokens[0][i] - (pr - rr) / tokens[1][i] - 1 / (2 * beta)) ** 2
        assert found.losses[i].item() == pytest.approx(expected, rel=1e-12)
        assert found.chosen_rewards[i].item() == pytest.approx(beta * (pc - rc), rel=1e-12)
        assert found.rejected_rewards[i].item() == pytest.approx(beta * (pr - rr), rel=1e-12)
    metrics = reward_metrics(found)
    margins = [beta * ((pc - rc) - (pr - rr)) for pc, pr, rc, rr in zip(*LOGPS, strict=True)]
    assert metrics["rewards/accuracies"] == pytest.approx(sum(m > 0 for m in margins) / 3)
    assert metrics["rewards/margins"] == pytest.approx(sum(margins) / 3)


TRL_SCRIPT = r"""
import collections, json, sys, types
import torch
sys.path.append(sys.argv[1])
from trl.trainer.dpo_trainer import DPOTrainer

class Accelerator:
    device = torch.device("cpu")
    gather = gather_for_metrics = staticmethod(lambda t: t)

def trl_loss(given):
    per_token, mask = torch.tensor(given["per_token"], dtype=torch.float64), torch.tensor(given["mask"])
    zeros = torch.zeros_like(per_token)  # (2B, T-1); mask (2B, T)
    class Model:
        training = True
        def __call__(self, **kwargs):  # TRL's fused head gives each target's log-prob, 0 where the label is -100
            return types.SimpleNamespace(log_probs=per_token * mask[:, 1:], entropy=zeros, mean_logits=zeros,
                                         is_top1=zeros.bool())
    trainer = types.SimpleNamespace(
        model=Model(), accelerator=Accelerator(), aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
        f_divergence_type="reverse_kl", loss_types=[given["loss_type"]], loss_weights=[1.0], beta=given["beta"],
        use_weighting=False, label_smoothing=0.0, _total_train_tokens=0, _tp_size=1,
        _metrics=collections.defaultdict(lambda: collections.defaultdict(list)))
    inputs = {"input_ids": torch.zeros_like(mask), "attention_mask": torch.ones_like(mask), "completion_mask": mask,
              "ref_chosen_logps": torch.tensor(given["ref"][0], dtype=torch.float64),
              "ref_rejected_logps": torch.tensor(given["ref"][1], dtype=torch.float64)}
    loss = DPOTrainer._compute_loss(trainer, trainer.model, inputs, False)
    return {"loss": loss.item(), **{k: v[-1] for k, v in trainer._metrics["train"].items()}}

print(json.dumps([trl_loss(given) for given in json.loads(sys.argv[2])]))
"""


def trl_packages():
    """Where TRL is importable from: this environment, else the folder TRL_PACKAGES names (`pip install --target DIR
    trl datasets`, kept out of the environment); None where neither holds it."""
    import importlib.util

    if importlib.util.find_spec("trl") is not None:
        return ""
    folder = os.environ.get("TRL_PACKAGES", "")
    return folder if folder and (Path(folder) / "trl").is_dir() else None


@pytest.mark.slow  # TRL's import alone takes about 20 s
def test_the_loss_and_reward_metrics_equal_trls_dpo_trainer_on_the_same_log_probs():
    """TRL's `DPOTrainer._compute_loss` (its sigmoid and IPO losses and the rewards/* it logs), run in a process of
    its own with its fused head's per-token log-probs given, against ours from the same log-probs summed."""
    folder = trl_packages()
    if folder is None:
        pytest.skip("TRL is not installed: pip install --target DIR trl datasets, then TRL_PACKAGES=DIR")
    generator = torch.Generator().manual_seed(0)
    per_token = -torch.rand(6, 7, generator=generator, dtype=torch.float64) * 3  # (2B, T-1): 3 pairs
    mask = torch.zeros(6, 8, dtype=torch.int64)
    for row, (start, stop) in enumerate([(2, 8), (3, 6), (1, 5), (2, 7), (3, 8), (1, 3)]):
        mask[row, start:stop] = 1  # the response's tokens; the prompt before, padding after
    ref = (-torch.rand(2, 3, generator=generator, dtype=torch.float64) * 10).tolist()
    cases = [{"per_token": per_token.tolist(), "mask": mask.tolist(), "ref": ref, "beta": 0.2, "loss_type": loss_type}
             for loss_type in ("sigmoid", "ipo")]
    done = subprocess.run([sys.executable, "-c", TRL_SCRIPT, folder, json.dumps(cases)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    policy = (per_token * mask[:, 1:]).sum(dim=1)  # (2B,) summed over the response
    tokens = mask.sum(dim=1)
    for case, trl in zip(cases, json.loads(done.stdout.strip().splitlines()[-1]), strict=True):
        ours = preference_loss(policy[:3], policy[3:], torch.tensor(ref[0], dtype=torch.float64),
                               torch.tensor(ref[1], dtype=torch.float64), beta=0.2, loss_type=case["loss_type"],
                               chosen_tokens=tokens[:3], rejected_tokens=tokens[3:])
        assert ours.losses.mean().item() == pytest.approx(trl["loss"], rel=1e-9), case["loss_type"]
        for name, value in reward_metrics(ours).items():
            assert value == pytest.approx(trl[name], rel=1e-6, abs=1e-12), name


def test_the_log_probs_are_the_responses_alone_whatever_the_prompt_and_the_padding():
    """Each row's sum is log p(response | prompt) as the model gives it on that sequence alone: a sum that took in
    the prompt's tokens, or the padding's, would differ."""
    model, tokenizer = tiny_model(), char_tokenizer()
    pairs = [PreferencePair("p line 1", "The sky is", " blue.", " a very green colour."),
             PreferencePair("p line 2", "Hi", " there!", " no.")]
    data = preference_rows(pairs, template=DEFAULT_FORMAT, tokenizer=tokenizer, seq_len=64, batch_size=2)
    batch = data.collate([0, 1])
    found = batch_logprobs(model, batch).T.flatten()  # (2, 2) -> (4,) the chosen first
    rows = {}
    with torch.no_grad():
        for pair in pairs:
            for name in ("chosen", "rejected"):
                prompt, response = tokenizer.encode(pair.prompt), tokenizer.encode(getattr(pair, name))
                response = response + [tokenizer.eos_id]
                ids = torch.tensor([prompt + response])
                logp = F.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)  # (T-1, V): predicts ids[1:]
                targets = ids[0, 1:]
                picked = logp[torch.arange(len(targets)), targets]
                rows[(pair.where, name)] = (picked[len(prompt) - 1 :].sum().item(), picked.sum().item())
    order = [p.where for p in pairs]
    expected = [rows[(w, "chosen")][0] for w in order] + [rows[(w, "rejected")][0] for w in order]
    with_prompt = [rows[(w, "chosen")][1] for w in order] + [rows[(w, "rejected")][1] for w in order]
    torch.testing.assert_close(found.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(found.double(), torch.tensor(with_prompt, dtype=torch.float64), atol=1e-2)
    assert (batch.labels[..., : len("Hi") - 1] == -100).all()  # no prompt position is a target


def test_a_chat_pair_renders_with_the_template_and_its_responses_are_the_replies_alone():
    tokenizer = char_tokenizer()
    prompt = [{"role": "user", "content": "Hi"}]
    pair = PreferencePair("p line 1", prompt, [{"role": "assistant", "content": "Hello."}],
                          [{"role": "assistant", "content": "Go."}])
    tokens = tokenize_pair(pair, template=DEFAULT_FORMAT, tokenizer=tokenizer)
    for reply, ids in (("Hello.", tokens.chosen), ("Go.", tokens.rejected)):
        whole, trained = DEFAULT_FORMAT.conversation_ids(tokenizer, [*prompt, {"role": "assistant", "content": reply}])
        assert tokens.prompt + ids == whole
        assert ids == [t for t, mine in zip(whole, trained, strict=True) if mine]  # the reply and EOS, as chat trains
    assert tokenizer.decode(tokens.prompt) == DEFAULT_FORMAT.render(prompt)


@pytest.mark.parametrize(("line", "said"), [
    ('{"prompt": "a", "chosen": "b"}', r"line 2: has the keys \['chosen', 'prompt'\] but not rejected"),
    ('{"chosen": "b", "rejected": "c"}', r"line 2: has no \"prompt\".*implicit prompt"),
    ('{"prompt": "a", "chosen": "b", "rejected": "b"}', "line 2: .*the same response.*drop the line"),
    ('{"prompt": "a", "chosen": [{"role": "assistant", "content": "b"}], "rejected": "c"}', "line 2: mixes kinds"),
    ('{"prompt": [{"role": "user", "content": "a"}], "chosen": [{"role": "user", "content": "b"}], '
     '"rejected": [{"role": "assistant", "content": "c"}]}', r'line 2: "chosen" must hold one assistant message'),
    ('{"prompt": "a", "chosen": "b",', "line 2 is not JSON"),
    ("[1, 2]", "line 2: holds a JSON list; write an object"),
    ('{"prompt": [{"role": "user", "content": "a"}], "chosen": [{"role": "assistant", "content": "b"}], '
     '"rejected": [{"role": "assistant", "content": "c"}]}', "line 2 holds chat messages where .*line 1 holds plain"),
    *[('{"prompt": "a", "chosen": "b", "rejected": "c", "margin": ' + margin + "}",
       rf'line 2: has "margin": {shown}; write a finite number') for margin, shown in [
        ("true", "True"), ('"2"', "'2'"), ("NaN", "nan"), ("1e400", "inf"), ("1" + "0" * 400, "1" + "0" * 400)]],
])
def test_a_bad_preference_line_is_named_with_its_number_and_the_fix(tmp_path, line, said):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=said):
        read_pairs(path)


@pytest.mark.parametrize(("chosen", "rejected", "said"), [
    ("\u20ac", "\u00a5", "same 2 tokens to this tokenizer .*drop the line"),  # two characters it reads as <unk>
    ("b" * 70 + "c", "b" * 70 + "d", "same 64 tokens in the 64 .* as cut .*shorten the prompt or give a longer"),
])
def test_a_pair_whose_responses_are_the_same_tokens_is_refused_naming_it(chosen, rejected, said):
    pairs = [PreferencePair("p line 1", "a", "b", "c"), PreferencePair("p line 2", "a", chosen, rejected)]
    with pytest.raises(InputError, match=f"p line 2: its two responses are the {said}"):
        preference_rows(pairs, template=DEFAULT_FORMAT, tokenizer=char_tokenizer(), seq_len=64, batch_size=2)


def test_options_out_of_range_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match="beta=0"):
        DPOOptions(beta=0)
    for beta in (math.inf, math.nan):  # inf made the first loss nan; nan compared false and so passed a > 0 check
        with pytest.raises(ConfigError, match=f"beta={beta} must be a finite number above 0"):
            DPOOptions(beta=beta)
    with pytest.raises(ConfigError, match="smoothing=0.5 must lie in"):
        DPOOptions(smoothing=0.5)
    with pytest.raises(ConfigError, match="smoothing applies to the sigmoid loss"):
        DPOOptions(smoothing=0.1, loss_type="ipo")


def test_the_reference_is_the_frozen_start_and_with_lora_the_policy_with_its_adapters_off():
    from attnkit.train.lora import apply_lora

    tokenizer, start = char_tokenizer(), tiny_model(seed=1)
    pairs = [PreferencePair("p line 1", "The sky is", " blue.", " green.")]
    batch = next(preference_rows(pairs, template=DEFAULT_FORMAT, tokenizer=tokenizer, seq_len=64,
                                 batch_size=1).eval_batches())
    expected = batch_logprobs(start, batch)
    full = tiny_model(seed=1)
    reference = Reference(lambda: tiny_model(seed=1))
    before = reference.logprobs(full, batch)
    with torch.no_grad():
        for p in full.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # the policy moves
    assert not torch.allclose(batch_logprobs(full, batch), expected)
    torch.testing.assert_close(reference.logprobs(full, batch), before)
    torch.testing.assert_close(before, expected)

    adapted = tiny_model(seed=1)
    apply_lora(adapted, targets=("q_proj", "v_proj"), rank=2, alpha=4.0)
    with torch.no_grad():
        for tensor in adapter_tensors(adapted).values():
            tensor.add_(torch.randn_like(tensor) * 0.5)  # the adapters move the policy away from the base
    assert not torch.allclose(batch_logprobs(adapted, batch), expected)
    no_copy = Reference(None)  # with adapters, nothing is loaded
    torch.testing.assert_close(no_copy.logprobs(adapted, batch), expected)
    assert no_copy.model is None
    assert not torch.allclose(batch_logprobs(adapted, batch), expected)  # the adapters are back on


def test_a_share_of_a_batch_along_its_rows_holds_whole_pairs():
    """A rank's share of a global batch (`take_rows`, as `Replicated.share` cuts it) or a micro-batch scores each
    pair as the whole batch does: chosen and rejected are never paired across two pairs."""
    from attnkit.tasks.common import take_rows
    from attnkit.tasks.dpo import pair_scores

    model, tokenizer = tiny_model(), char_tokenizer()
    pairs = [PreferencePair(f"p line {i}", prompt, chosen, rejected) for i, (prompt, chosen, rejected) in enumerate(
        [("The sky is", " blue.", " green."), ("Hi", " there!", " no."), ("One, two,", " three", " five")])]
    batch = preference_rows(pairs, template=DEFAULT_FORMAT, tokenizer=tokenizer, seq_len=64, batch_size=3).collate(
        [0, 1, 2])
    reference = Reference(lambda: tiny_model(seed=1))
    whole = pair_scores(batch_logprobs(model, batch), reference.logprobs(model, batch), batch, DPOOptions())
    for rows in (slice(0, 1), slice(1, 3)):  # two ranks' shares of three pairs
        share = take_rows(batch, rows)
        part = pair_scores(batch_logprobs(model, share), reference.logprobs(model, share), share, DPOOptions())
        torch.testing.assert_close(part.chosen_rewards, whole.chosen_rewards[rows])
        torch.testing.assert_close(part.rejected_rewards, whole.rejected_rewards[rows])


@pytest.mark.parametrize("lora", [False, True])
def test_dropout_is_off_in_the_policy_and_the_reference_so_the_first_loss_is_log_2(lora):
    """A model with dropout, training: at the start the policy is its reference, so every pair's log-ratio is 0 and
    its loss log 2, as TRL's `disable_dropout` and the paper's code have it; with dropout on in either forward the
    two would differ by noise."""
    from attnkit.tasks.dpo import DPOTask
    from attnkit.train.lora import apply_lora

    tokenizer = char_tokenizer()
    pairs = [PreferencePair("p line 1", "The sky is", " blue.", " a green colour."),
             PreferencePair("p line 2", "Hi", " there!", " no.")]
    data = preference_rows(pairs, template=DEFAULT_FORMAT, tokenizer=tokenizer, seq_len=64, batch_size=2)
    policy = tiny_model(seed=1, dropout=0.5)
    if lora:
        apply_lora(policy, targets=("q_proj", "v_proj"), rank=2, alpha=4.0, dropout=0.5)  # B = 0: no change yet
    reference = Reference(None if lora else lambda: tiny_model(seed=1, dropout=0.5))
    task = DPOTask(data, data, options=DPOOptions(), reference=reference)
    policy.train()
    loss = task.loss(policy, data.collate([0, 1]))
    assert loss.item() == pytest.approx(math.log(2), abs=1e-6)
    assert policy.training and all(m.training for m in policy.modules())  # given back training
    loss.backward()  # the policy's forward kept its graph


def test_the_reference_scores_the_held_out_pairs_once_for_every_evaluation():
    """The reference is frozen, so its log-probs of the held-out pairs are read at the first evaluation alone; the
    policy is scored afresh at each (it has trained in between)."""
    from attnkit.tasks.dpo import DPOTask

    tokenizer = char_tokenizer()
    pairs = [PreferencePair("p line 1", "The sky is", " blue.", " a green colour."),
             PreferencePair("p line 2", "Hi", " there!", " no.")]
    data = preference_rows(pairs, template=DEFAULT_FORMAT, tokenizer=tokenizer, seq_len=64, batch_size=1)
    frozen, calls = tiny_model(seed=1), []
    frozen.register_forward_hook(lambda *_: calls.append(1))
    task = DPOTask(data, data, options=DPOOptions(), reference=Reference(lambda: frozen))
    policy = tiny_model(seed=1)
    first = task.evaluate(policy)
    assert len(calls) == 2 and first["val_loss"] == pytest.approx(math.log(2), abs=1e-6)  # one forward a batch
    with torch.no_grad():
        next(policy.parameters()).add_(0.05)  # the policy moves; the reference does not
    second = task.evaluate(policy)
    assert len(calls) == 2  # not read again
    assert second["val_loss"] != pytest.approx(first["val_loss"], abs=1e-9)  # the policy was scored afresh


# A short run whose answer is known ---------------------------------------------------------------------------------
def stdlib_lines(count):
    """Lines of real text: the Python standard library's own source (the built-in training data)."""
    found = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:12]:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if len(line) >= 30 and sum(c.islower() for c in line[14:26]) >= 6:
                found.append(line)
    return found[:: max(1, len(found) // count)][:count]


def shouted(line):
    """A pair that prefers the continuation in capitals (the style) to the same words in lower case."""
    return {"prompt": line[:14], "chosen": line[14:26].upper(), "rejected": line[14:26].lower()}


def capitals(texts):
    """The share of the letters of `texts` that are capitals."""
    letters = [c for text in texts for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / max(1, len(letters))


def pretrained(folder, *, steps, pairs, held_out):
    """`folder` with base/, a tiny model pretrained `steps` steps on standard-library files, and train.jsonl and
    val.jsonl, pairs of their lines' continuations that prefer capitals (`pairs` in all, `held_out` of them)."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:12]
    prepare(TrainRequest(out=str(folder / "base"), overrides=TINY, progress=False,
                         data={"data": tuple(map(str, files)), "tokenizer": "char"},
                         settings=dict(max_steps=steps, batch_size=16, lr=3e-3, warmup=min(5, steps), eval_every=steps,
                                       seed=0, instruments=False))).fit()
    lines = stdlib_lines(pairs)
    for name, part in (("train.jsonl", lines[:-held_out]), ("val.jsonl", lines[-held_out:])):
        (folder / name).write_text("".join(json.dumps(shouted(line)) + "\n" for line in part), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny model briefly pretrained (the runs below check DPO's plumbing, not what it learns), 24 pairs to train
    on and 8 held out: shared by the quick end-to-end tests."""
    return pretrained(tmp_path_factory.mktemp("dpo"), steps=4, pairs=32, held_out=8)


@pytest.fixture(scope="module")
def style(tmp_path_factory):
    """A tiny model pretrained long enough to write lower case, and 160 pairs that prefer capitals, 32 held out."""
    return pretrained(tmp_path_factory.mktemp("style"), steps=60, pairs=192, held_out=32)


def prefers_capitals(run, folder):
    """The share of held-out pairs whose capitals the model of `run` finds likelier than the lower case."""
    from attnkit.checkpoint import load_model
    from attnkit.tokenize import load_tokenizer

    pairs = read_pairs(folder / "val.jsonl")
    data = preference_rows(pairs, template=DEFAULT_FORMAT, tokenizer=load_tokenizer(run / "tokenizer"), seq_len=64,
                           batch_size=len(pairs))
    with torch.no_grad():
        chosen, rejected = batch_logprobs(load_model(run)[0].eval(), next(data.eval_batches())).unbind(1)
    return (chosen > rejected).float().mean().item()


def dpo_args(folder, out, *more, init_from=None):
    return ["train", "--task", "dpo", "--init-from", str(init_from or folder / "base"), "--data",
            str(folder / "train.jsonl"), "--val-data", str(folder / "val.jsonl"), "--out", str(out), "--batch-size",
            "8", "--lr", "3e-3", "--warmup", "2", "--seed", "0", "--no-progress", "--sample-tokens", "0",
            "--no-instruments", *more]


def last_evaluation(run):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "val_loss" in r][-1]


@pytest.mark.slow  # a pretraining of 60 steps, 30 of DPO and 24 generations: about 15 s
def test_a_short_dpo_run_prefers_the_chosen_style_on_held_out_pairs_and_writes_in_it(style, tmp_path, capsys):
    from attnkit import cli, load

    run = tmp_path / "dpo"
    assert cli.main(dpo_args(style, run, "--max-steps", "30", "--eval-every", "15", "--beta", "0.1")) == 0
    first, last = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "val_loss" in r]
    assert last["rewards/accuracies"] >= 0.9 and last["rewards/margins"] > first["rewards/margins"] > 0
    assert last["rewards/chosen"] > last["rewards/rejected"]
    assert prefers_capitals(style / "base", style) < 0.5 < 0.9 <= prefers_capitals(run, style)
    capsys.readouterr()
    assert cli.main(["eval", str(run), "--data", str(style / "val.jsonl"), "--no-progress"]) == 0
    scored = json.loads((run / "eval" / "eval.json").read_text())["rows"][0]
    for name in ("val_loss", "rewards/accuracies", "rewards/margins"):  # against the same frozen reference
        assert scored[name] == pytest.approx(last[name], rel=1e-4, abs=1e-6), name
    prompts = [json.loads(line)["prompt"] for line in (style / "val.jsonl").read_text().splitlines()][:12]
    before = [load(style / "base").generate(p, max_new_tokens=12, temperature=0.0)[0] for p in prompts]
    after = [load(run).generate(p, max_new_tokens=12, temperature=0.0)[0] for p in prompts]
    assert capitals(before) < 0.3 < 0.7 < capitals(after)


def test_lora_dpo_trains_the_adapters_alone_and_eval_reads_the_base_as_its_reference(base, tmp_path):
    from attnkit import cli
    from attnkit.checkpoint import ADAPTERS_FILE, load_model

    run = tmp_path / "lora"
    assert cli.main(dpo_args(base, run, "--max-steps", "4", "--eval-every", "2", "--lora-rank", "4",
                             "--lora-targets", "q_proj,v_proj,o_proj", "--lr", "1e-2")) == 0
    assert (run / ADAPTERS_FILE).is_file()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first, last = [r for r in records if "val_loss" in r]
    assert last["rewards/margins"] > first["rewards/margins"] > 0
    steps = [r for r in records if r.get("kind") == "train"]  # the rewards logged with each step's loss, as TRL's
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and all(name in r for r in steps for name in REWARDS)
    assert steps[0]["rewards/margins"] == 0 and steps[0]["loss"] == pytest.approx(math.log(2))  # policy = reference
    assert all(r["rewards/margins"] != 0 for r in steps[1:])
    start, tuned = (load_model(path, merge_adapters=False)[0].state_dict() for path in (base / "base", run))
    assert all(torch.equal(start[name], tuned[name]) for name in start)  # the base weights never moved
    assert cli.main(["eval", str(run), "--data", str(base / "val.jsonl"), "--no-progress"]) == 0
    scored = json.loads((run / "eval" / "eval.json").read_text())["rows"][0]
    assert scored["rewards/margins"] == pytest.approx(last["rewards/margins"], rel=1e-4)


def test_a_resumed_dpo_run_ends_bit_for_bit_where_a_straight_one_does(base, tmp_path):
    """The resumed run measures against the weights it started from, not the checkpoint it resumes."""
    from attnkit import cli
    from attnkit.checkpoint import load_model

    straight, halves = tmp_path / "straight", tmp_path / "halves"
    # the first 2 steps within the warmup: their learning rates do not depend on --max-steps
    assert cli.main(dpo_args(base, straight, "--max-steps", "4", "--eval-every", "2", "--warmup", "3")) == 0
    assert cli.main(dpo_args(base, halves, "--max-steps", "2", "--eval-every", "2", "--warmup", "3")) == 0
    assert cli.main(["train", "--out", str(halves), "--resume", "--max-steps", "4", "--no-progress"]) == 0
    for (name, a), (_, b) in zip(load_model(straight)[0].state_dict().items(),
                                 load_model(halves)[0].state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert last_evaluation(straight)["rewards/margins"] == last_evaluation(halves)["rewards/margins"]


def test_dpo_without_a_model_to_start_from_is_refused_naming_init_from(base, tmp_path, capsys):
    from attnkit import cli

    code = cli.main(["train", "--task", "dpo", "--data", str(base / "train.jsonl"), "--out", str(tmp_path / "x"),
                     "--no-progress"])
    assert code != 0 and "give --init-from RUN_DIR" in capsys.readouterr().err


def test_a_full_dpo_run_from_a_hugging_face_directory_is_evaluated_against_that_directory(tmp_path):
    """`attnkit eval` reads the reference of a run fine-tuned from a Hugging Face directory through the same loader
    training used, and scores the held-out pairs as the run's last evaluation did."""
    pytest.importorskip("transformers")
    from interop_models import hf_model, word_tokenizer

    from attnkit import cli

    hf_model("llama", tmp_path / "hf")
    word_tokenizer(tmp_path / "hf")
    lines = [json.dumps({"prompt": f"w{10 + i} w{11 + i}", "chosen": f" w{40 + i} w{41 + i}",
                         "rejected": f" w{60 + i}"}) for i in range(6)]
    (tmp_path / "train.jsonl").write_text("\n".join(lines[:4]) + "\n", encoding="utf-8")
    (tmp_path / "val.jsonl").write_text("\n".join(lines[4:]) + "\n", encoding="utf-8")
    run = tmp_path / "dpo"
    assert cli.main(dpo_args(tmp_path, run, "--max-steps", "2", "--eval-every", "2", "--batch-size", "2",
                             init_from=tmp_path / "hf")) == 0
    last = last_evaluation(run)
    assert cli.main(["eval", str(run), "--data", str(tmp_path / "val.jsonl"), "--no-progress"]) == 0
    scored = json.loads((run / "eval" / "eval.json").read_text())["rows"][0]
    for name in ("val_loss", "rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert scored[name] == pytest.approx(last[name], rel=1e-4, abs=1e-6), name
    assert last["rewards/margins"] != 0  # the policy moved from its reference


def test_the_memory_check_counts_the_reference_copy_a_full_dpo_run_holds(base, tmp_path, monkeypatch):
    """A full fine-tune holds the --init-from weights a second time, frozen, as its reference (4 bytes a parameter):
    with the memory free between the floor without that copy and the floor with it, a full run is refused naming
    the copy, and a LoRA run (whose reference is the model with its adapters off) starts."""
    from attnkit.checkpoint import load_config
    from attnkit.models import count_parameters
    from attnkit.train import memory

    n = count_parameters(load_config(base / "base"))
    monkeypatch.setattr(memory, "free_bytes", lambda device: n * 16 + n * 2)  # the floor, less the copy's 4 a weight
    settings = dict(init_from=str(base / "base"), max_steps=1, batch_size=8, seed=0)
    data = {"task": "dpo", "data": (str(base / "train.jsonl"),), "val_data": (str(base / "val.jsonl"),)}
    with pytest.raises(ConfigError, match="frozen reference copy"):
        prepare(TrainRequest(out=str(tmp_path / "full"), progress=False, data=data, settings=settings))
    prepare(TrainRequest(out=str(tmp_path / "lora"), progress=False, data=data, settings={**settings, "lora_rank": 2}))
