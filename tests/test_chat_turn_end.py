"""A chat's reply ends at its template's end of turn (ChatML's <|im_end|>) where the tokenizer's EOS is another token
(Qwen's <|endoftext|>), through `attnkit serve`'s /v1/chat/completions and `attnkit generate --chat`, as vLLM and
transformers stop there; and a multi-turn chat's prompt is read as its conversation was trained."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from attnkit import build_model
from attnkit.chat_format import ChatTemplate, chat_template
from attnkit.checkpoint import record_checksums, save_model
from attnkit.config import ModelConfig
from attnkit.tokenize import load_tokenizer

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
          "{{ m['content'] }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def tokenizer_dir(folder, template=CHATML, eos="<|endoftext|>"):
    """A byte-level BPE tokenizer directory with chat special tokens, `template`, and EOS `eos`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator(["the user asks and the assistant answers: yes, no, maybe so.\n"] * 20,
                           trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": eos}),
                                                  encoding="utf-8")
    return folder


@pytest.mark.parametrize(("template", "end"), [(CHATML, "<|im_end|>"), (LLAMA3, "<|eot_id|>")])
def test_the_turns_end_is_read_from_the_template(tmp_path, template, end):
    tok = load_tokenizer(tokenizer_dir(tmp_path, template))
    assert tok.eos_id == tok.encode_with_specials("<|endoftext|>")[0]
    assert chat_template(tmp_path, tok.specials).turn_end_ids(tok) == {tok.encode_with_specials(end)[0]}


def test_no_turn_end_where_the_reply_is_followed_by_text_or_the_format_is_the_default(tmp_path):
    tok = load_tokenizer(tokenizer_dir(tmp_path))
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    assert ChatTemplate(plain).turn_end_ids(tok) == frozenset()
    assert ChatTemplate().turn_end_ids(tok) == frozenset()


@pytest.fixture(scope="module")
def chatml_run(tmp_path_factory):
    """A tiny decoder that writes <|im_end|> above all, then the word 'yes': its logits are the same at every
    position (the final norm's output is its bias alone)."""
    root = tmp_path_factory.mktemp("chatml")
    tok = load_tokenizer(tokenizer_dir(root / "tokenizer"))
    config = ModelConfig(family="decoder", vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2, d_ff=64,
                         max_seq_len=64, dropout=0.0)
    torch.manual_seed(0)
    model = build_model(config).eval()
    end, word = tok.encode_with_specials("<|im_end|>")[0], tok.encode("yes")
    assert len(word) == 1
    with torch.no_grad():
        model.stack.final_norm.weight.zero_()
        model.stack.final_norm.bias.copy_(torch.nn.functional.one_hot(torch.tensor(0), 32).float())
        model.lm_head.weight.zero_()
        model.lm_head.weight[end, 0] = 10.0
        model.lm_head.weight[word[0], 0] = 5.0
    run = root / "run"
    save_model(model, config, run)
    shutil.copytree(root / "tokenizer", run / "tokenizer")
    record_checksums(run)
    return run


def test_the_chat_api_stops_at_the_templates_end_of_turn(chatml_run):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from serve_helpers import running_server

    with running_server(chatml_run) as (url, _):
        body = {"messages": [{"role": "user", "content": "yes or no?"}], "temperature": 0, "max_tokens": 6,
                "min_tokens": 2}  # <|im_end|> is held back twice: 'yes' 'yes', then it ends the reply
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
        completion = httpx.post(f"{url}/v1/completions", json={"prompt": "yes", "temperature": 0, "max_tokens": 3},
                                timeout=60).json()
    choice = answer["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("yesyes", "stop")
    assert completion["choices"][0]["finish_reason"] == "length"  # a completion has no turn to end


def test_generate_chat_stops_at_the_templates_end_of_turn(chatml_run, capsys):
    from attnkit import cli

    assert cli.main(["generate", str(chatml_run), "--chat", "--prompt", "yes or no?", "--max-new-tokens", "6",
                     "--min-new-tokens", "2", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.strip() == "yesyes"


MULTI_TURN = [{"role": "system", "content": "the cat"}, {"role": "user", "content": "the mat?"},
              {"role": "assistant", "content": "a dog ran."}, {"role": "user", "content": "to the park?"},
              {"role": "assistant", "content": "and the cat saw it!"}]


def test_a_multi_turn_chat_is_served_as_it_was_trained_in_the_default_format(tmp_path):
    """The default format writes no end of turn, so chat fine-tuning puts EOS after each reply: the served prompt
    of the chat up to its last reply (the chat API, /tokenize, generate --chat) carries the EOS after the earlier
    one too, and begins the training ids, where it read the history as text without it."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from serve_helpers import running_server, tiny_run

    from attnkit.tasks.lm import chat_prompt

    run = tiny_run(tmp_path, tokenizer="bpe")
    tok = load_tokenizer(run / "tokenizer")
    template = chat_template(run / "tokenizer", tok.specials)
    assert template.source is None
    trained, marks = template.conversation_ids(tok, MULTI_TURN)
    served = template.chat_ids(tok, MULTI_TURN[:-1])
    assert served == trained[: len(served)] and served.count(tok.eos_id) == 1
    assert len(trained) - len(served) == len(tok.encode(" and the cat saw it!")) + 1  # the reply and its EOS
    with running_server(run) as (url, _):
        tokens = httpx.post(f"{url}/tokenize", json={"messages": MULTI_TURN[:-1]}, timeout=60).json()["tokens"]
        answer = httpx.post(f"{url}/v1/chat/completions", json={"messages": MULTI_TURN[:-1], "max_tokens": 1},
                            timeout=60).json()
    assert tokens == served and answer["usage"]["prompt_tokens"] == len(served)
    assert chat_prompt(template, tok, "the mat?", system="the cat")[0] == trained[: marks.index(True)]  # --chat


def test_the_sample_after_a_chat_run_ends_at_its_templates_end_of_turn(tmp_path, monkeypatch):
    from attnkit import cli
    from attnkit.generate import Pipeline

    lines = [json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
             for q, a in (("yes or no?", "yes."), ("the user asks?", "no."))]
    (tmp_path / "chats.jsonl").write_text("\n".join(lines * 4) + "\n", encoding="utf-8")
    tokenizer_dir(tmp_path / "tokenizer")
    fed, generate = [], Pipeline.generate
    monkeypatch.setattr(Pipeline, "generate", lambda self, prompts, **kw: fed.append(kw.get("stop_tokens")) or
                        generate(self, prompts, **kw))
    assert cli.main(["train", "--task", "chat", "--data", str(tmp_path / "chats.jsonl"), "--tokenizer",
                     str(tmp_path / "tokenizer"), "--out", str(tmp_path / "run"), "--max-steps", "1", "--warmup", "0",
                     "--sample-tokens", "2", "--no-progress", "--set", "d_model=32", "n_layers=1", "n_heads=2",
                     "d_ff=64", "max_seq_len=64"]) == 0
    tok = load_tokenizer(tmp_path / "tokenizer")
    assert fed == [[tok.encode_with_specials("<|im_end|>")[0]]]


def test_the_chat_api_ends_a_reply_at_the_end_of_turn_of_the_template_the_pipeline_holds_now(chatml_run, monkeypatch):
    """An application serving a `Pipeline` replaces its chat template: the reply ends at the new template's end of
    turn and no longer at the old one's (read once when the server started, it stayed ChatML's <|im_end|>)."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from serve_helpers import running_server

    import attnkit.generate

    served, load = [], attnkit.generate.load
    monkeypatch.setattr(attnkit.generate, "load", lambda *a, **kw: served.append(load(*a, **kw)) or served[-1])
    body = {"messages": [{"role": "user", "content": "yes or no?"}], "temperature": 0, "max_tokens": 4}
    with running_server(chatml_run) as (url, _):
        pipeline = served[0]
        chatml = pipeline.chat_template

        def reply() -> tuple[str, str, int]:
            answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
            choice = answer["choices"][0]
            return choice["message"]["content"], choice["finish_reason"], answer["usage"]["completion_tokens"]

        assert reply() == ("", "stop", 0)  # <|im_end|> at once (a stop token is not returned)
        pipeline.chat_template = ChatTemplate(LLAMA3)  # its turn ends at <|eot_id|>: <|im_end|> is a token like others
        assert reply() == ("", "length", 4)  # four <|im_end|>, special tokens the text leaves out (as vLLM's)
        pipeline.chat_template = chatml
        assert reply() == ("", "stop", 0)
