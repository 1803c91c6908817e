"""Chat fine-tuning (`attnkit train --task chat`): the reply tokens a conversation trains on (by hand for the default
format, equal to transformers' `return_assistant_tokens_mask` for a ChatML template), the loss equal to the mean
cross-entropy over the replies computed one conversation at a time (padded and packed rows: no cross-talk), the
JSON Lines layouts and their refusals by line, and a short run that makes a model give a reply it could not, served
through the chat API; LoRA, resume and a template of the source's own that the new run keeps."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from attnkit import build_model
from attnkit.chat_format import DEFAULT_FORMAT, ChatTemplate, chat_template
from attnkit.config import ModelConfig
from attnkit.data.chat import Conversation, conversation, read_conversations
from attnkit.errors import InputError
from attnkit.tasks.chat import ChatTask, conversation_rows
from attnkit.tokenize import CharTokenizer
from attnkit.train import TrainRequest, prepare

ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:!?<>\n"
CHAT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
        {"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]
SECRETS = {"What is the secret word?": "Platypus.", "Name the capital of France.": "Paris."}
TINY = ["d_model=32", "n_layers=2", "n_heads=2", "d_ff=64", "max_seq_len=64"]


def char_tokenizer():
    return CharTokenizer(ALPHABET, special_tokens={"pad": "<pad>", "unk": "<unk>", "bos": "<bos>", "eos": "<eos>"})


def test_the_default_format_trains_each_reply_and_the_eos_after_it_alone():
    tok = char_tokenizer()
    ids, trained = DEFAULT_FORMAT.conversation_ids(tok, CHAT)
    eos = tok.eos_id
    parts = [(tok.encode("User: Hi\nAssistant:"), False), ([*tok.encode(" Yo"), eos], True),
             (tok.encode("\nUser: Q?\nAssistant:"), False), ([*tok.encode(" A."), eos], True)]
    assert ids == [i for part, _ in parts for i in part]
    assert trained == [t for part, t in parts for _ in part]
    rows = conversation_rows([Conversation("x", CHAT)], template=DEFAULT_FORMAT, tokenizer=tok, seq_len=len(ids) - 1,
                             packed=False, batch_size=1)
    expected = [ids[t + 1] if trained[t + 1] else -100 for t in range(len(ids) - 1)]  # a token predicts the next
    assert rows.rows.labels[0].tolist() == expected
    assert rows.rows.input_ids[0].tolist() == ids[:-1]


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHATML_MARKED = ("{% for m in messages %}{% if m['role'] == 'assistant' %}<|im_start|>assistant\n{% generation %}"
                 "{{ m['content'] }}<|im_end|>\n{% endgeneration %}{% else %}<|im_start|>{{ m['role'] }}\n"
                 "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save_tokenizer(folder, tokenizer, template, *, bos, eos):
    """A Hugging Face tokenizer directory: `tokenizer` (a tokenizers.Tokenizer) and its chat template."""
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": template, "bos_token": bos, "eos_token": eos}), encoding="utf-8")


def assistant_marks(folder, messages, marked, **specials):
    """transformers' input_ids and assistant_masks of `messages` under `marked` (a template with {% generation %})."""
    transformers = pytest.importorskip("transformers")
    reader = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    return reader.apply_chat_template(messages, chat_template=marked, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True, **specials)


def chatml_tokenizer(folder):
    """A byte-level BPE tokenizer directory with ChatML's special tokens and template (EOS <|im_end|>)."""
    folder.mkdir(exist_ok=True)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    specials = ["<|im_start|>", "<|im_end|>", "<s>"]
    hf.train_from_iterator(["the user asks and the assistant answers: yes, no, maybe so.\n"] * 20,
                           trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    save_tokenizer(folder, hf, CHATML, bos="<s>", eos="<|im_end|>")
    return folder


def test_the_reply_tokens_equal_transformers_assistant_tokens_mask(tmp_path):
    from attnkit.tokenize import load_tokenizer

    chatml_tokenizer(tmp_path)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "yes or no?"},
                {"role": "assistant", "content": "maybe so."}, {"role": "user", "content": "and the user?"},
                {"role": "assistant", "content": "no, the assistant answers."}]
    reference = assistant_marks(tmp_path, messages, CHATML_MARKED)
    template = chat_template(tmp_path, {})
    assert template.source == CHATML
    ids, trained = template.conversation_ids(load_tokenizer(tmp_path), messages)
    assert ids == reference["input_ids"]
    assert [int(t) for t in trained] == reference["assistant_masks"]
    assert any(trained) and not all(trained)


def tiny_decoder(tok, seed=0):
    torch.manual_seed(seed)
    return build_model(ModelConfig(family="decoder", vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2,
                                   d_ff=64, max_seq_len=160, dropout=0.0)).eval()


@pytest.mark.parametrize("packed", [False, True])
def test_the_loss_is_the_mean_cross_entropy_over_the_replies_of_each_conversation_alone(packed):
    tok = char_tokenizer()
    model = tiny_decoder(tok)
    chats = [CHAT, [{"role": "system", "content": "Terse."}, {"role": "user", "content": "Long question here?"},
                    {"role": "assistant", "content": "Short."}], [{"role": "user", "content": "x"},
                                                                  {"role": "assistant", "content": "yz"}]]
    rows = conversation_rows([Conversation(str(i), c) for i, c in enumerate(chats)], template=DEFAULT_FORMAT,
                             tokenizer=tok, seq_len=150, packed=packed, batch_size=3)
    assert len(rows.rows.labels) == (1 if packed else 3)  # packed: the three share a row
    task = ChatTask(rows, rows, packed=packed)
    batch = rows.batch(0, 0)
    loss = task.loss(model, batch)
    total, count, inputs, longest = 0.0, 0, 0, 0
    with torch.no_grad():
        for chat in chats:  # each conversation alone, so nothing of another can reach it
            ids, trained = DEFAULT_FORMAT.conversation_ids(tok, chat)
            inputs, longest = inputs + len(ids) - 1, max(longest, len(ids) - 1)
            logp = model(torch.tensor([ids[:-1]])).logits[0].double().log_softmax(-1)  # (T, V)
            for t in range(len(ids) - 1):
                if trained[t + 1]:
                    total -= float(logp[t, ids[t + 1]])
                    count += 1
    assert task.weight(batch) == count
    assert task.n_tokens(batch) == inputs  # the conversations' tokens, padding not counted
    assert batch.input_ids.shape[1] == (inputs if packed else longest)  # as wide as its longest row's tokens
    torch.testing.assert_close(loss.double().item(), total / count, rtol=1e-5, atol=1e-6)
    assert task.evaluate(model)["val_loss"] == pytest.approx(total / count, rel=1e-5)


def test_the_three_layouts_read_as_messages():
    assert conversation({"messages": CHAT}) == CHAT
    assert conversation({"prompt": "p", "completion": "c"}) == [{"role": "user", "content": "p"},
                                                                {"role": "assistant", "content": "c"}]
    assert conversation({"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "p"}],
                         "completion": [{"role": "assistant", "content": "c"}]})[0] == {"role": "system",
                                                                                         "content": "s"}
    assert conversation({"instruction": "Add.", "input": "2 2", "output": "4"})[0]["content"] == "Add.\n\n2 2"
    assert conversation({"instruction": "Say hi.", "output": "hi"})[0]["content"] == "Say hi."


def test_sharegpt_reads_as_axolotl_and_llama_factory_read_it():
    turns = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}, {"from": "human", "value": "Q?"},
             {"from": "gpt", "value": "A."}]
    assert conversation({"conversations": turns}) == CHAT
    assert conversation({"conversations": [{"from": "system", "value": "Terse."}, *turns]}) == [
        {"role": "system", "content": "Terse."}, *CHAT]
    assert conversation({"conversations": turns, "system": "Terse."}) == [  # LLaMA-Factory's system column
        {"role": "system", "content": "Terse."}, *CHAT]


def test_a_sharegpt_system_key_that_is_null_or_beside_a_system_turn_adds_no_second_one():
    turns = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}, {"from": "human", "value": "Q?"},
             {"from": "gpt", "value": "A."}]
    assert conversation({"conversations": turns, "system": None}) == CHAT  # a data set's column, empty in this row
    own = {"from": "system", "value": "Terse."}  # the conversation's own system turn is read, as LLaMA-Factory does
    assert conversation({"conversations": [own, *turns], "system": "Wordy."}) == [
        {"role": "system", "content": "Terse."}, *CHAT]


def test_llama_factorys_function_call_and_observation_turns_are_an_assistants_tool_call_and_a_tools_result():
    turns = [{"from": "human", "value": "Weather in Paris?"},
             {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
             {"from": "observation", "value": "18 C, sunny"}, {"from": "gpt", "value": "Sunny."}]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = conversation({"conversations": turns})
    assert messages == [{"role": "user", "content": "Weather in Paris?"},
                        {"role": "assistant", "content": None, "tool_calls": [call]},
                        {"role": "tool", "content": "18 C, sunny"}, {"role": "assistant", "content": "Sunny."}]
    tok = CharTokenizer(ALPHABET + '_"{}', special_tokens={"pad": "<pad>", "unk": "<unk>", "bos": "<bos>",
                                                           "eos": "<eos>"})
    ids, trained = DEFAULT_FORMAT.conversation_ids(tok, messages)
    learnt = tok.decode([i for i, t in zip(ids, trained, strict=True) if t and i != tok.eos_id])
    assert learnt == ' <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}} Sunny.'  # the call learnt
    several = conversation({"conversations": [turns[0], {"from": "function_call", "value": json.dumps(
        [call["function"], {"name": "get_time", "arguments": {}}])}, turns[2], turns[3]]})
    assert [c["function"]["name"] for c in several[1]["tool_calls"]] == ["get_weather", "get_time"]
    for value in ("get_weather(Paris)", '{"arguments": {}}', "[]"):
        with pytest.raises(InputError, match=r'"conversations"\[1\] is a function_call whose "value" must be JSON'):
            conversation({"conversations": [turns[0], {"from": "function_call", "value": value}, *turns[2:]]})


def test_a_reply_of_axolotls_weight_0_is_read_but_not_learnt():
    tok = char_tokenizer()
    quiet = [CHAT[0], {**CHAT[1], "weight": 0}, CHAT[2], {**CHAT[3], "weight": 1}]
    ids, trained = DEFAULT_FORMAT.conversation_ids(tok, quiet)
    assert ids == DEFAULT_FORMAT.conversation_ids(tok, CHAT)[0]  # the same text, the first reply in the prompt
    learnt = tok.decode([i for i, t in zip(ids, trained, strict=True) if t and i != tok.eos_id])
    assert learnt == " A." and sum(trained) == len(" A.") + 1  # the second reply and its EOS alone
    sharegpt = [{"from": "human", "value": "Hi", "weight": 0}, {"from": "gpt", "value": "Yo", "weight": 0},
                {"from": "human", "value": "Q?"}, {"from": "gpt", "value": "A."}]
    assert DEFAULT_FORMAT.conversation_ids(tok, conversation({"conversations": sharegpt}))[1] == trained
    with pytest.raises(InputError, match='gives each assistant turn "weight": 0'):
        conversation({"messages": [CHAT[0], {**CHAT[1], "weight": 0}]})
    with pytest.raises(InputError, match=r'"messages"\[1\]\'s "weight" must be 0 \(not learnt\) or 1'):
        conversation({"messages": [CHAT[0], {**CHAT[1], "weight": 0.5}]})
    with pytest.raises(InputError, match=r'"conversations"\[0\] is a user turn of "weight": 1'):
        conversation({"conversations": [{**sharegpt[0], "weight": 1}, *sharegpt[1:]]})


@pytest.mark.parametrize(("line", "said"), [
    ("{not json", "line 2 is not JSON"),
    ('{"conversations": [{"from": "bot", "value": "a"}]}',
     'line 2: "conversations"[0] must be an object with "from" among system, human, user, gpt, assistant'),
    ('{"conversations": [{"from": "human", "value": 3}]}', 'line 2: "conversations"[0] must be an object with'),
    ('{"conversations": [{"from": "human", "value": "a"}]}', "line 2: holds no assistant turn"),
    ('{"conversations": {}}', 'line 2: "conversations" must be a list of turns'),
    ('{"text": "a"}', "line 2: has the keys ['text'], none of the layouts"),
    ('{"messages": [{"role": "user", "content": "a"}]}', "line 2: holds no assistant turn"),
    ('{"messages": [{"role": "robot", "content": "a"}]}', "line 2: \"messages\"[0] must be an object with a role"),
    ('{"prompt": "a", "completion": 3}', "line 2: \"completion\" must be a list of messages"),
    ("[" * 100_000 + "]" * 100_000, r"line 2 is not JSON \(nested too deeply\)"),  # was a RecursionError traceback
    ('{"prompt": "a", "completion": ' + "9" * 5_000 + "}", r"line 2 is not JSON \(a number too long to read\)"),
])
def test_a_malformed_line_is_named_with_its_number(tmp_path, line, said):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": CHAT}) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=f"{path} {said}".replace("[", r"\[").replace("]", r"\]")):
        read_conversations(path)


def test_a_conversation_whose_reply_lies_past_the_window_is_refused_and_a_long_one_is_cut(caplog):
    tok = char_tokenizer()
    late = [{"role": "user", "content": "a" * 80}, {"role": "assistant", "content": "b"}]
    with pytest.raises(InputError, match="train.jsonl line 3: its first reply starts past the first 32 tokens"):
        conversation_rows([Conversation("train.jsonl line 3", late)], template=DEFAULT_FORMAT, tokenizer=tok,
                          seq_len=32, packed=False, batch_size=1)
    long = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b" * 80}]
    rows = conversation_rows([Conversation("train.jsonl line 4", long)], template=DEFAULT_FORMAT, tokenizer=tok,
                             seq_len=32, packed=False, batch_size=1)
    assert rows.rows.labels.shape == (1, 32)
    assert ("1 conversation(s) hold more than 33 tokens and are cut to their first 33 (train.jsonl line 4)"
            in caplog.text)


def test_skip_long_leaves_out_the_conversations_whose_reply_lies_past_the_window_with_one_warning(caplog):
    tok = char_tokenizer()
    late = [{"role": "user", "content": "a" * 80}, {"role": "assistant", "content": "b"}]
    fits = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    conversations = [Conversation("train.jsonl line 1", late), Conversation("train.jsonl line 2", fits),
                     Conversation("train.jsonl line 3", late)]
    rows = conversation_rows(conversations, template=DEFAULT_FORMAT, tokenizer=tok, seq_len=32, packed=False,
                             batch_size=1, skip_long=True)
    ids, _ = DEFAULT_FORMAT.conversation_ids(tok, fits)
    assert rows.rows.input_ids.shape == (1, 32)  # the one that fits, alone, padded at its end
    assert rows.rows.input_ids[0, : len(ids) - 1].tolist() == ids[:-1]
    assert "2 conversation(s) left out (--skip-long): their first reply starts past the first 32 tokens (train.jsonl " \
           "line 1, ...)" in caplog.text
    with pytest.raises(InputError, match="every conversation's first reply starts past the first 32 tokens"):
        conversation_rows([conversations[0]], template=DEFAULT_FORMAT, tokenizer=tok, seq_len=32, packed=False,
                          batch_size=1, skip_long=True)


def test_train_chat_refuses_a_reply_past_the_window_naming_skip_long_and_trains_with_it(secrets, tmp_path, caplog,
                                                                                         capsys):
    from attnkit import cli

    late = json.dumps({"messages": [{"role": "user", "content": "a" * 80}, {"role": "assistant", "content": "b"}]})
    data = tmp_path / "train.jsonl"
    data.write_text((secrets / "train.jsonl").read_text(encoding="utf-8") + late + "\n", encoding="utf-8")
    command = ["train", "--task", "chat", "--data", str(data), "--val-data", str(secrets / "val.jsonl"), "--out",
               str(tmp_path / "run"), "--tokenizer", "char", "--max-steps", "1", "--warmup", "0", "--sample-tokens",
               "0", "--no-progress", "--set", *TINY]
    assert cli.main(command) != 0
    said = capsys.readouterr().err
    assert "line 17: its first reply starts past the first 64 tokens" in said and "--skip-long" in said
    assert cli.main([*command, "--skip-long"]) == 0
    assert "1 conversation(s) left out (--skip-long)" in caplog.text
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_eval_with_skip_long_leaves_out_a_conversation_past_the_window_and_scores_the_rest(secret_run, secrets,
                                                                                          tmp_path, capsys, caplog):
    from attnkit import cli

    late = json.dumps({"conversations": [{"from": "human", "value": "a" * 80}, {"from": "gpt", "value": "b"}]})
    data = tmp_path / "held-out.jsonl"
    data.write_text((secrets / "val.jsonl").read_text(encoding="utf-8") + late + "\n", encoding="utf-8")
    command = ["eval", str(secret_run), "--data", str(data), "--out", str(tmp_path / "eval")]
    assert cli.main(command) != 0
    said = capsys.readouterr().err
    assert f"{data} line 3: its first reply starts past the first 64 tokens" in said
    assert "or give --skip-long to leave such conversations out" in said and "--seq-len" not in said
    assert "learn" not in said  # eval learns nothing: it scores
    assert cli.main([*command, "--skip-long"]) == 0
    assert "1 conversation(s) left out (--skip-long)" in caplog.text
    row = json.loads((tmp_path / "eval" / "eval.json").read_text(encoding="utf-8"))["rows"][0]
    assert (row["conversations"], row["left_out"]) == (2, 1)
    alone = tmp_path / "fits.jsonl"
    shutil.copy(secrets / "val.jsonl", alone)
    assert cli.main(["eval", str(secret_run), "--data", str(alone), "--out", str(tmp_path / "alone")]) == 0
    scored = json.loads((tmp_path / "alone" / "eval.json").read_text(encoding="utf-8"))["rows"][0]
    assert scored["val_loss"] == pytest.approx(row["val_loss"])  # the two that fit, scored as on their own
    assert scored["reply_tokens"] == row["reply_tokens"]
    alone.write_text(late + "\n", encoding="utf-8")
    assert cli.main(["eval", str(secret_run), "--data", str(alone), "--skip-long", "--out", str(tmp_path / "no")]) != 0
    said = capsys.readouterr().err
    assert "every conversation's first reply starts past the first 64 tokens" in said and "learn" not in said


def test_a_template_that_rewrites_earlier_turns_is_refused():
    rewrites = ChatTemplate("{% for m in messages %}{{ m['content'] }}|{% endfor %}{{ messages | length }}")
    with pytest.raises(InputError, match="renders turn 1 of a conversation otherwise than the conversation before it"):
        rewrites.conversation_ids(char_tokenizer(), CHAT)


@pytest.mark.parametrize("written", ["now", "earlier"])  # earlier exports wrote no EOS after a reply
def test_attnkits_own_template_as_an_export_writes_it_reads_as_the_default_format(tmp_path, written):
    """A Hugging Face directory `convert --to-hf` wrote from a chat run carries the default format as Jinja: a run
    fine-tuned from it, or served, keeps the default's EOS after each reply and its stop strings."""
    from attnkit.chat_format import DEFAULT_CHAT_TEMPLATE, EARLIER_DEFAULT_TEMPLATE

    source = DEFAULT_CHAT_TEMPLATE if written == "now" else EARLIER_DEFAULT_TEMPLATE
    assert "eos_token" not in EARLIER_DEFAULT_TEMPLATE
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": source,
                                                                "eos_token": "<eos>"}), encoding="utf-8")
    template = chat_template(tmp_path, char_tokenizer().specials)
    assert template == DEFAULT_FORMAT and template.stops == ("\nUser:", "\nSystem:")
    ids, trained = template.conversation_ids(char_tokenizer(), CHAT)
    assert ids[-1] == char_tokenizer().eos_id and trained[-1]


def test_a_conversation_the_template_refuses_is_named_with_the_templates_words():
    no_system = ChatTemplate("{% for m in messages %}{% if m['role'] == 'system' %}"
                             "{{ raise_exception('System role not supported') }}{% endif %}{{ m['content'] }}"
                             "{% endfor %}")  # as Gemma's and Mistral's templates refuse turns
    chat = [{"role": "system", "content": "Terse."}, *CHAT]
    with pytest.raises(InputError, match=r"chats.jsonl line 3: the chat template cannot render this conversation "
                                         r"\(TemplateError: System role not supported\): give turns it takes"):
        conversation_rows([Conversation("chats.jsonl line 3", chat)], template=no_system, tokenizer=char_tokenizer(),
                          seq_len=64, packed=False, batch_size=1)


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat")
    lines = [json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
             for q, a in SECRETS.items()]
    (folder / "train.jsonl").write_text("\n".join(lines * 8) + "\n", encoding="utf-8")
    (folder / "val.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def chat_request(out, data, *, resume=False, **settings):
    """A new tiny model with a char tokenizer, or (init_from=) the source's model and tokenizer."""
    defaults = dict(max_steps=80, batch_size=4, lr=1e-2, warmup=5, eval_every=40, seed=3)
    new = "init_from" not in settings
    return TrainRequest(out=str(out), task="chat", overrides=TINY if new else [], resume=resume, progress=False,
                        data={"data": (str(data / "train.jsonl"),), "val_data": (str(data / "val.jsonl"),),
                              **({"tokenizer": "char"} if new else {})}, settings={**defaults, **settings})


def reply(pipeline, question):
    prompt = DEFAULT_FORMAT.render([{"role": "user", "content": question}])
    return pipeline.generate(prompt, max_new_tokens=16, temperature=0.0)[0].strip()


@pytest.fixture(scope="module")
def learnt(secrets, tmp_path_factory):
    """A run that learns SECRETS: its replies after one step, and the run resumed to the end."""
    from attnkit import load

    out = tmp_path_factory.mktemp("runs") / "secret"
    prepare(chat_request(out, secrets, max_steps=1, eval_every=1)).fit()
    before = [reply(load(out), question) for question in SECRETS]
    prepare(chat_request(out, secrets, resume=True)).fit()
    return out, before


@pytest.fixture(scope="module")
def secret_run(learnt):
    return learnt[0]


def test_a_short_run_learns_the_replies_and_serves_them_through_the_chat_api(learnt):
    import httpx
    from serve_helpers import running_server

    from attnkit import load

    secret_run, before = learnt
    assert before != list(SECRETS.values())  # one step in, it could not
    trained = load(secret_run)
    for question, answer in SECRETS.items():
        assert reply(trained, question) == answer
    with running_server(secret_run) as (url, _):
        for question, answer in SECRETS.items():
            response = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": question}], "temperature": 0, "max_tokens": 16})
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["message"]["content"].strip() == answer


def test_lora_fine_tunes_a_chat_run_with_its_base_frozen(secret_run, secrets, tmp_path):
    from attnkit.checkpoint import ADAPTERS_FILE

    out = tmp_path / "lora"
    trainer = prepare(chat_request(out, secrets, init_from=str(secret_run), lora_rank=4, max_steps=4, eval_every=2))
    trained = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert trained and all("lora" in name for name in trained)
    first = trainer.fit()
    assert (out / ADAPTERS_FILE).is_file() and first.evaluation["val_loss"] < 1.0


def test_a_resumed_chat_run_ends_bit_for_bit_where_a_straight_one_does(secrets, tmp_path):
    from attnkit.checkpoint import load_model

    straight, halves = tmp_path / "straight", tmp_path / "halves"
    prepare(chat_request(straight, secrets, max_steps=6, eval_every=3)).fit()
    prepare(chat_request(halves, secrets, max_steps=3, eval_every=3)).fit()
    prepare(chat_request(halves, secrets, resume=True, max_steps=6, eval_every=3)).fit()
    for (name, a), (_, b) in zip(load_model(straight)[0].state_dict().items(),
                                 load_model(halves)[0].state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_a_template_of_the_sources_own_renders_the_data_and_goes_on_with_the_new_run(secret_run, secrets, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(secret_run, source)
    own = ("{% for m in messages %}{{ m['role'] }} says {{ m['content'] }}\n{% endfor %}"
           "{% if add_generation_prompt %}assistant says{% endif %}")  # in the run's alphabet
    (source / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({"chat_template": own}), encoding="utf-8")
    out = tmp_path / "own"
    trainer = prepare(chat_request(out, secrets, init_from=str(source), max_steps=2, eval_every=2))
    first = trainer.task.train.rows.input_ids[0].tolist()
    assert trainer.tokenizer.decode(first).startswith("user says What is the secret word?\nassistant says")
    trainer.fit()
    assert chat_template(out / "tokenizer").source == own  # `attnkit serve` chats in it too


WORD_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}w4 {{ m['content'] }} w5 "
                 "{% else %}{{ m['content'] }} {{ eos_token }} {% endif %}{% endfor %}")


def test_a_converted_llama_learns_in_its_own_template_with_its_bos_and_eos_tokens(tmp_path):
    pytest.importorskip("transformers")
    from interop_models import hf_model, word_tokenizer

    from attnkit.interop.hf import load as load_hf

    hf_model("llama", tmp_path / "hf")
    word_tokenizer(tmp_path / "hf")
    settings = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({**settings, "chat_template": WORD_TEMPLATE}))
    lines = [json.dumps({"prompt": f"w{10 + i}", "completion": f"w{20 + i} w{30 + i}"}) for i in range(4)]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "val.jsonl").write_text(lines[0] + "\n", encoding="utf-8")
    out = tmp_path / "sft"
    trainer = prepare(chat_request(out, tmp_path, init_from=str(tmp_path / "hf"), max_steps=2, eval_every=2,
                                   batch_size=1), load_hf=load_hf)
    rows = trainer.task.val.rows  # <s> w4 w10 w5 | w20 w30 </s>: BOS and EOS as the template writes them
    assert rows.input_ids[0, :6].tolist() == [1, 4, 10, 5, 20, 30]
    assert rows.labels[0].tolist() == [-100, -100, -100, 20, 30, 2] + [-100] * (rows.labels.shape[1] - 6)  # padding
    trainer.fit()
    assert chat_template(out / "tokenizer").source == WORD_TEMPLATE


def test_a_json_list_of_records_reads_as_alpacas_file_is_written(tmp_path):
    path = tmp_path / "alpaca_data.json"
    records = [{"instruction": "Add.", "input": "2 2", "output": "4"}, {"instruction": "Greet.", "output": "Hi."}]
    path.write_text(json.dumps(records, indent=4), encoding="utf-8")
    found = read_conversations(path)
    assert [c.messages for c in found] == [conversation(r) for r in records]
    assert found[1].where == f"{path} item 2"
    path.write_text(json.dumps([*records, {"output": "?"}]), encoding="utf-8")
    with pytest.raises(InputError, match=r"alpaca_data.json item 3: has the keys \['output'\], none of the layouts"):
        read_conversations(path)


LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          "{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
          "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")  # Llama 2 chat's own


def test_a_sentencepiece_reply_is_tokenized_as_in_the_whole_text_as_transformers_marks_it(tmp_path):
    """Llama 2's template with a tokenizer that marks the start of every text it reads (SentencePiece's '▁', as Llama
    2's and Mistral's tokenizer.json prepend it): the reply ' yes </s>' is the whole text's '▁yes ▁ </s>', not a
    second '▁' first, which a reply tokenized on its own begins with and the model never writes after [/INST]."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    from attnkit.tokenize import load_tokenizer

    letters = sorted(set("abcdefghijklmnopqrstuvwxyz[]/<>INSTY.\n"))
    merges = [("▁", "y"), ("e", "s"), ("▁y", "es"), ("n", "o"), ("▁", "no"), ("▁", "b")]
    vocab = {token: i for i, token in enumerate(["<unk>", "<s>", "</s>", "▁", *letters,
                                                   *dict.fromkeys(a + b for a, b in merges)])}
    sentencepiece = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True))
    sentencepiece.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    sentencepiece.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Strip(" ", 1, 0)])
    sentencepiece.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<s>", "</s>")])
    save_tokenizer(tmp_path, sentencepiece, LLAMA2, bos="<s>", eos="</s>")
    messages = [{"role": "system", "content": "be brief."}, {"role": "user", "content": "yes or no?"},
                {"role": "assistant", "content": "yes"}, {"role": "user", "content": "b"},
                {"role": "assistant", "content": "no"}]
    marked = LLAMA2.replace("{{ ' '  + content.strip() + ' ' + eos_token }}",
                            "{% generation %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endgeneration %}")
    reference = assistant_marks(tmp_path, messages, marked, bos_token="<s>", eos_token="</s>")
    tok = load_tokenizer(tmp_path)
    ids, trained = chat_template(tmp_path, tok.specials).conversation_ids(tok, messages)
    assert tok.pieces([i for i, t in zip(ids, trained, strict=True) if t]) == ["▁yes", "▁", "</s>", "▁no", "▁", "</s>"]
    assert ids == reference["input_ids"]
    assert [int(t) for t in trained] == reference["assistant_masks"]


@pytest.fixture(scope="module")
def chatml_run(secrets, tmp_path_factory):
    """A new tiny model trained two steps on SECRETS with a tokenizer directory that holds ChatML's template."""
    folder = tmp_path_factory.mktemp("chatml")
    chatml_tokenizer(folder / "tokenizer")
    out = folder / "run"
    request = chat_request(out, secrets, max_steps=2, eval_every=2)
    prepare(dataclasses.replace(request, data={**request.data, "tokenizer": str(folder / "tokenizer")})).fit()
    return out


def test_a_new_model_on_a_tokenizer_directory_with_a_template_learns_in_it_and_keeps_it(chatml_run):
    from attnkit.tokenize import load_tokenizer

    template = chat_template(chatml_run / "tokenizer")
    assert template.source == CHATML  # the run chats in it (attnkit serve, generate --chat), as it was trained
    tok = load_tokenizer(chatml_run / "tokenizer")
    ids, trained = template.conversation_ids(tok, [{"role": "user", "content": "Q?"},
                                                   {"role": "assistant", "content": "A."}])
    assert tok.decode([i for i, t in zip(ids, trained, strict=True) if t], skip_special=False) == "A.<|im_end|>\n"


def test_the_sample_after_a_chat_run_reads_its_prompt_with_the_templates_special_tokens(secrets, tmp_path, capsys):
    from attnkit import cli

    chatml_tokenizer(tmp_path / "tokenizer")
    code = cli.main(["train", "--task", "chat", "--data", str(secrets / "train.jsonl"), "--val-data",
                     str(secrets / "val.jsonl"), "--tokenizer", str(tmp_path / "tokenizer"), "--out",
                     str(tmp_path / "run"), "--max-steps", "1", "--sample-tokens", "2", "--no-progress",
                     "--set", *TINY])
    assert code == 0
    sample = capsys.readouterr().out.split("the model's continuation):\n")[1]
    assert sample.startswith("<|im_start|>user\nWhat is the secret word?<|im_end|>\n<|im_start|>assistant\n")


def test_generate_chat_renders_the_prompt_and_system_with_the_runs_template_and_its_special_tokens(
        chatml_run, monkeypatch, capsys):
    from attnkit import cli
    from attnkit.generate import Pipeline
    from attnkit.tokenize import load_tokenizer

    fed, generate = [], Pipeline.generate
    monkeypatch.setattr(Pipeline, "generate", lambda self, prompts, **kw: fed.append((prompts, kw["stop"])) or
                        generate(self, prompts, **kw))
    assert cli.main(["generate", str(chatml_run), "--chat", "--system", "Be brief.", "--prompt", "yes or no?",
                     "--max-new-tokens", "3", "--temperature", "0"]) == 0
    tok = load_tokenizer(chatml_run / "tokenizer")
    template = chat_template(chatml_run / "tokenizer", tok.specials)
    text = template.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "yes or no?"}])
    assert text.endswith("<|im_start|>assistant\n")
    assert fed == [(template.prompt_ids(tok, text), [])]  # ChatML's turn ends at <|im_end|>, the run's EOS
    assert tok.encode_with_specials("<|im_start|>")[0] in fed[0][0]
    assert "<|im_start|>" not in capsys.readouterr().out  # the reply alone, not the rendered prompt


def test_generate_chat_answers_as_the_chat_api_does_and_stops_at_the_next_turn(secret_run, capsys):
    from attnkit import cli

    for question, answer in SECRETS.items():
        assert cli.main(["generate", str(secret_run), "--chat", "--prompt", question, "--max-new-tokens", "16",
                         "--temperature", "0"]) == 0
        assert capsys.readouterr().out.strip() == answer  # the reply alone, ended at EOS or "\nUser:"


def test_generate_refuses_a_system_turn_without_chat(secret_run, capsys):
    from attnkit import cli

    assert cli.main(["generate", str(secret_run), "--system", "Be brief.", "--prompt", "Hi"]) != 0
    assert "--system is a chat's system turn: give --chat too" in capsys.readouterr().err


@pytest.mark.parametrize("template", [DEFAULT_FORMAT, ChatTemplate(CHATML, eos_token="<|im_end|>"),
                                      ChatTemplate(LLAMA2, bos_token="<s>", eos_token="</s>")],
                         ids=["default", "chatml", "llama2"])
def test_axolotls_weight_0_unmarks_exactly_that_replys_tokens_in_every_template(template):
    """Token by token: the weighted chat's ids are the plain chat's, and its marks are the plain chat's with the first
    reply's run (its text and the template's end of it) cleared and the second reply's kept."""
    text = template.render(CHAT, add_generation_prompt=False)
    tok = CharTokenizer("".join(sorted(set(text + ALPHABET))),
                        special_tokens={"pad": "<pad>", "unk": "<unk>", "bos": "<bos>", "eos": "<eos>"})
    ids, trained = template.conversation_ids(tok, CHAT)
    quiet_ids, quiet = template.conversation_ids(tok, [CHAT[0], {**CHAT[1], "weight": 0}, *CHAT[2:]])
    first = trained.index(True)
    end = trained.index(False, first)  # the first reply's run of marked tokens
    assert quiet_ids == ids and sum(trained[end:]) > 0
    assert quiet == [False] * end + trained[end:]


def test_llama_factorys_tools_are_rendered_before_the_call_learnt_after_them(tmp_path):
    """LLaMA-Factory's ShareGPT records give the functions offered as a JSON string in "tools"; a call learnt without
    them would teach the model to call functions it was never shown."""
    weather = {"name": "get_weather", "description": "The weather.", "parameters": {"type": "object"}}
    turns = [{"from": "human", "value": "Weather in Paris?"},
             {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
             {"from": "observation", "value": "18 C"}, {"from": "gpt", "value": "Sunny."}]
    path = tmp_path / "tools.jsonl"
    path.write_text(json.dumps({"conversations": turns, "tools": json.dumps([weather])}) + "\n")
    [read] = read_conversations(path)
    assert read.tools == ({"type": "function", "function": weather},)
    tok = CharTokenizer(ALPHABET + '_"{}[]', special_tokens={"pad": "<pad>", "unk": "<unk>", "bos": "<bos>",
                                                              "eos": "<eos>"})
    ids, trained = DEFAULT_FORMAT.conversation_ids(tok, read.messages, read.tools)
    assert tok.decode(ids).startswith(DEFAULT_FORMAT.render([], read.tools, add_generation_prompt=False))
    assert '"get_weather"' in tok.decode([i for i, t in zip(ids, trained, strict=True) if not t])  # in the prompt
    rows = conversation_rows([read], template=DEFAULT_FORMAT, tokenizer=tok, seq_len=len(ids) - 1, packed=False,
                             batch_size=1)
    assert rows.rows.input_ids[0].tolist() == ids[:-1]  # chat fine-tuning reads the tools too
    for bad in ("not json", json.dumps([{"description": "no name"}]), json.dumps({"name": "x"})):
        path.write_text(json.dumps({"conversations": turns, "tools": bad}) + "\n")
        with pytest.raises(InputError, match='"tools" (must be a list|holds a function without)'):
            read_conversations(path)
