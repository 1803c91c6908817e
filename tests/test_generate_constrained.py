"""Grammar-constrained decoding (generate/constrained.py): whatever the weights, every text follows its JSON schema and
ends; a char tokenizer's vocabulary and a byte-level BPE's both work; what cannot be written is refused by name."""

from __future__ import annotations

import io
import json
import re
import sys

import pytest
import torch

pytest.importorskip("llguidance", reason="structured output needs the structured extra: pip install "
                    "'attnkit[structured]'")
jsonschema = pytest.importorskip("jsonschema")

from generate_models import tiny_model  # noqa: E402

from attnkit.errors import ConfigError, InputError  # noqa: E402
from attnkit.generate import generate_tokens  # noqa: E402
from attnkit.generate.constrained import Grammar, GrammarMask, Matcher  # noqa: E402
from attnkit.generate.sampling import SamplingConfig  # noqa: E402
from attnkit.tokenize import CharTokenizer, train_bpe  # noqa: E402

JSON_CHARS = 'abcdefghijklmnopqrstuvwxyz .,:\n{}[]"0123456789-'
# every text this schema allows is short (strings of at most 4 characters, bounded numbers, an enum): with enough
# tokens, generation always ends with the grammar complete
BOUNDED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 4},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    },
    "required": ["name", "age", "kind", "tags"],
    "additionalProperties": False,
}
SMALL = dict(d_model=16, n_heads=2, d_ff=32, n_layers=1)  # the tiniest model: the grammar, not the weights, decides
BOUND_TOKENS = 72  # more characters than any text BOUNDED allows


def sampled(mask: GrammarMask, vocab_size: int, tokenizer, *, steps: int, seed: int) -> list[str]:
    """Texts drawn from random logits (widths past the tokenizer's: a padded vocabulary) through the mask."""
    generator = torch.Generator().manual_seed(seed)
    rows = len(mask)
    texts, done = [[] for _ in range(rows)], [False] * rows
    for _ in range(steps):
        logits = mask(torch.randn(rows, vocab_size, generator=generator) * 3)
        tokens = torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0].tolist()
        for row, token in enumerate(tokens):
            if done[row]:
                continue
            assert token < tokenizer.vocab_size
            if token == tokenizer.eos_id:
                done[row] = True
                continue
            texts[row].append(token)
            done[row] = mask.advance(row, token)
        if all(done):
            return [tokenizer.decode(t) for t in texts]
    raise AssertionError(f"the grammar did not end within {steps} tokens")


@pytest.mark.parametrize("kind", ["char", "char, unknown characters refused", "bpe"])
def test_random_logits_through_the_mask_give_valid_json(kind):
    tokenizer = (CharTokenizer(JSON_CHARS) if kind == "char"
                 else CharTokenizer(JSON_CHARS, unknown="error") if kind.startswith("char")
                 else train_bpe(['{"name": "ab", "age": 12, "kind": "cat", "tags": [true]}\n'] * 20, vocab_size=300))
    mask = GrammarMask.of(Grammar.json_schema(BOUNDED), tokenizer, 6)
    texts = sampled(mask, tokenizer.vocab_size + 7, tokenizer, steps=BOUND_TOKENS, seed=0)
    for text in texts:
        jsonschema.validate(json.loads(text), BOUNDED)
    assert len(set(texts)) > 1  # the rows drew their own texts


def test_a_random_model_writes_valid_json_and_stops():
    tokenizer = CharTokenizer(JSON_CHARS)
    model, config = tiny_model(vocab_size=tokenizer.vocab_size + 3, max_seq_len=96, **SMALL)  # a padded vocabulary
    grammar = GrammarMask.of(Grammar.json_schema(BOUNDED), tokenizer, 3)
    prompts = [tokenizer.encode(p) for p in ("a", "person:", "{")]
    new = generate_tokens(model, prompts, max_new_tokens=BOUND_TOKENS, context_len=config.max_seq_len,
                          sampling=SamplingConfig(temperature=1.0), generator=torch.Generator().manual_seed(1),
                          stop_ids={tokenizer.eos_id}, grammar=grammar)
    for tokens, matcher in zip(new, grammar.matchers, strict=True):
        jsonschema.validate(json.loads(tokenizer.decode(tokens)), BOUNDED)
        assert matcher.finished and len(tokens) < BOUND_TOKENS


def test_greedy_json_object_is_one_object():
    tokenizer = CharTokenizer(JSON_CHARS)
    model, config = tiny_model(vocab_size=tokenizer.vocab_size, max_seq_len=64, **SMALL)
    grammar = GrammarMask.of(Grammar.json_object(), tokenizer, 1)
    tokens = generate_tokens(model, [tokenizer.encode("a")], max_new_tokens=40, context_len=config.max_seq_len,
                             stop_ids={tokenizer.eos_id}, grammar=grammar)[0]
    text = tokenizer.decode(tokens)
    assert text.startswith("{")
    if grammar.matchers[0].finished:  # a greedy random model may write a long object: only a complete one parses
        assert isinstance(json.loads(text), dict)


def test_a_grammar_the_tokenizer_cannot_write_is_refused():
    no_braces = CharTokenizer("abcdefghijklmnopqrstuvwxyz .,:\n")
    with pytest.raises(InputError, match="cannot start.*char tokenizer"):
        GrammarMask.of(Grammar.json_object(), no_braces, 1)
    no_z = CharTokenizer('{}"abc')
    mask = GrammarMask.of(Grammar.json_schema({"enum": ["zz"]}), no_z, 1)  # it starts: '"' is there
    with pytest.raises(InputError, match="cannot go on after '\"' with this char tokenizer"):
        sampled(mask, no_z.vocab_size, no_z, steps=3, seed=0)


def test_bad_schemas_and_tokens_are_refused_by_name():
    tokenizer = CharTokenizer(JSON_CHARS)
    with pytest.raises(InputError, match="Invalid type: bogus"):
        Matcher(Grammar.json_schema({"type": "bogus"}), tokenizer)
    with pytest.raises(InputError, match="not JSON"):
        Grammar.json_schema("{not json")
    with pytest.raises(InputError, match="JSON object, not list"):
        Grammar.json_schema([1, 2])
    matcher = Matcher(Grammar.json_object(), tokenizer)
    with pytest.raises(InputError, match="cannot start.*doesn't satisfy the grammar"):
        matcher.advance(tokenizer.encode("a")[0])


def test_free_rows_beside_constrained_ones_are_untouched():
    tokenizer = CharTokenizer(JSON_CHARS)
    constrained = GrammarMask.of(Grammar.json_object(), tokenizer, 1)
    mask = GrammarMask.joined([(2, None), (1, constrained)])
    logits = torch.randn(3, tokenizer.vocab_size)
    masked = mask(logits)
    torch.testing.assert_close(masked[:2], logits[:2])
    assert masked[2].isfinite().nonzero().flatten().tolist() == tokenizer.encode("{")
    assert GrammarMask.joined([(2, None)]) is None


def test_copied_matchers_move_on_apart_over_many_tokens_and_to_their_ends():
    """A request's choices share one matcher copied (`Matcher.copy`, llguidance's deep_copy): driven apart token by
    token, each copy allows what its own text allows next, one reaching the grammar's end leaves the others open, and
    a copy of a matcher that has moved on starts where it stood."""
    tokenizer = CharTokenizer("abc")
    a, b, c = tokenizer.encode("abc")
    first = Matcher(Grammar.regex("(ab|ba)+c"), tokenizer)
    first.allowed()
    other, untouched = first.copy(), first.copy()

    def allowed(matcher: Matcher) -> set[int]:
        return set(matcher.allowed().nonzero()[0].tolist()) - {tokenizer.eos_id}

    assert not first.advance(a) and not other.advance(b)
    assert allowed(first) == {b} and allowed(other) == {a} and allowed(untouched) == {a, b}
    assert not first.advance(b) and not other.advance(a)
    middle = other.copy()  # after "ba": may go on or end
    assert first.advance(c) and first.finished
    assert not other.finished and allowed(other) == {a, b, c}
    assert not middle.advance(b) and allowed(middle) == {a} and allowed(other) == {a, b, c}
    assert (first.tokens, other.tokens, middle.tokens, untouched.tokens) == ([a, b, c], [b, a], [b, a, b], [])


def test_missing_library_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)
    with pytest.raises(ConfigError, match=r"pip install 'attnkit\[structured\]'"):
        Grammar.json_object()


@pytest.fixture(scope="module")
def json_run(tmp_path_factory):
    """A random tiny decoder run whose char tokenizer can write JSON."""
    from attnkit import build_model
    from attnkit.checkpoint import save_model
    from attnkit.config import ModelConfig

    tokenizer = CharTokenizer(JSON_CHARS)
    torch.manual_seed(0)
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, max_seq_len=96, **SMALL)
    directory = tmp_path_factory.mktemp("json-run")
    save_model(build_model(config).eval(), config, directory)
    tokenizer.save(directory / "tokenizer")
    return directory


def test_pipeline_generate_with_a_json_schema_streams_valid_json(json_run):
    import attnkit

    lm = attnkit.load(json_run, device="cpu")
    pieces: dict[int, str] = {}
    texts = lm.generate("record:", json_schema=json.dumps(BOUNDED), max_new_tokens=BOUND_TOKENS, num_samples=2, seed=4,
                        on_text=lambda i, piece: pieces.__setitem__(i, pieces.get(i, "") + piece))
    for text in texts:
        jsonschema.validate(json.loads(text), BOUNDED)
    assert [pieces[0], pieces[1]] == texts
    with pytest.raises(InputError, match="not json_schema and grammar together"):
        lm.generate("x", json_schema={"type": "object"}, grammar=Grammar.json_object())


def test_a_text_cut_before_its_schema_is_complete_is_said_to_not_parse(json_run, caplog):
    import attnkit

    lm = attnkit.load(json_run, device="cpu")
    with caplog.at_level("WARNING", logger="attnkit.generate.pipeline"):
        whole = lm.generate("x", json_schema=BOUNDED, max_new_tokens=BOUND_TOKENS, seed=2)
    assert "do not parse" not in caplog.text
    jsonschema.validate(json.loads(whole[0]), BOUNDED)
    with caplog.at_level("WARNING", logger="attnkit.generate.pipeline"):
        cut = lm.generate(["x", "y"], json_schema=BOUNDED, max_new_tokens=3, seed=2)
    assert all(text.startswith("{") and len(text) <= 3 for text in cut)
    assert "text(s) [0, 1] ended before their JSON schema was complete" in caplog.text
    assert "max_new_tokens=3" in caplog.text


def test_cli_generate_json_schema_and_json(json_run, tmp_path, capsys):
    from attnkit import cli

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(BOUNDED))
    common = ["generate", str(json_run), "--prompt", "", "--max-new-tokens", str(BOUND_TOKENS), "--seed", "1"]
    assert cli.main([*common, "--json-schema", str(schema), "--num-samples", "2"]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("---")]
    assert len(printed) == 2
    for line in printed:
        jsonschema.validate(json.loads(line), BOUNDED)
    assert cli.main([*common, "--json", "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.startswith("{")
    schema.write_text("[1, 2]")
    for bad in (["--json-schema", str(schema)], ["--json-schema", str(tmp_path / "absent.json")],
                ["--json", "--json-schema", str(schema)]):
        assert cli.main([*common, *bad]) == 2
    assert "not --json and --json-schema together" in capsys.readouterr().err


def test_cli_generate_no_echo_prints_the_json_alone_so_that_it_pipes_into_a_parser(json_run, tmp_path, capsys):
    from attnkit import cli

    common = ["generate", str(json_run), "--prompt", "record:", "--max-new-tokens", str(BOUND_TOKENS), "--seed", "3",
              "--json-schema"]
    schema = tmp_path / "bounded.json"
    schema.write_text(json.dumps(BOUNDED))
    for stream in ("--stream", "--no-stream"):
        assert cli.main([*common, str(schema), stream]) == 0
        echoed = capsys.readouterr().out
        assert echoed.startswith("record:{")  # the prompt first, as by default
        assert cli.main([*common, str(schema), stream, "--no-echo"]) == 0
        alone = capsys.readouterr().out
        assert alone == echoed.removeprefix("record:")
        jsonschema.validate(json.loads(alone), BOUNDED)


def test_a_streamed_text_cut_before_its_schema_is_complete_ends_its_line_before_the_warning(json_run, tmp_path,
                                                                                           monkeypatch):
    """Streaming, the warning that a text does not parse came on the text's own line in a terminal (stdout and stderr
    in one place): 'x{"ntext(s) [0] ended before...'. Now the text's line ends first, on stderr, and stdout alone
    still holds the text and one newline."""
    import logging
    import os
    import select

    from attnkit import cli

    schema = tmp_path / "bounded.json"
    schema.write_text(json.dumps(BOUNDED))
    argv = ["generate", str(json_run), "--prompt", "x", "--max-new-tokens", "3", "--seed", "2", "--json-schema",
            str(schema)]
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as out, open(os.ttyname(slave), "w") as err:  # one terminal, two streams
        handler = logging.StreamHandler(err)
        logging.getLogger().addHandler(handler)
        try:
            monkeypatch.setattr(sys, "stdout", out)
            assert cli.main(argv) == 0
            out.flush()
        finally:
            logging.getLogger().removeHandler(handler)
        received = b""
        while select.select([master], [], [], 0.5)[0]:  # everything the terminal was sent, in as many reads
            received += os.read(master, 1 << 16)
        terminal = received.decode().replace("\r\n", "\n")
    os.close(master)
    stdout = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    assert cli.main(argv) == 0
    text = stdout.getvalue()
    assert text.startswith("x{") and text.endswith("\n") and text.count("\n") == 1
    lines = terminal.splitlines()
    warning = next(i for i, line in enumerate(lines) if "ended before their JSON schema was complete" in line)
    assert lines[warning].startswith("text(s) [0] ended before")
    assert lines[warning - 1] == text.rstrip("\n")
    assert "\n\n" not in terminal


def test_a_record_logged_mid_text_never_writes_to_a_redirected_stdout():
    """stdout is the data channel: with it redirected (`> out.txt`), a record logged between two streamed pieces
    (an INFO line under -v, a warning) left a newline in the file, 'abf\\n564\\n' for 'abf564\\n'. The record
    goes to stderr alone, as it came."""
    import logging

    from attnkit.tasks.lm import StreamedText

    stdout, stderr = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(stderr)
    logger = logging.getLogger()
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "stdout", stdout)
            streamed = StreamedText("ab")
            with streamed.own_lines():
                streamed.write(0, "f")
                logging.getLogger(__name__).info("compiling the step")
                streamed.write(0, "564")
            streamed.finish()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert stdout.getvalue() == "abf564\n"
    assert stderr.getvalue() == "compiling the step\n"


@pytest.mark.parametrize(("how", "source"), [
    ("regex", "(cat|dog)-[0-9]{2,3}"),
    ("lark", 'start: NAME ": " NUM\nNAME: /[a-e]{1,4}/\nNUM: /-?[0-9]{1,3}/'),
])
def test_generate_follows_a_regular_expression_or_a_lark_grammar_and_streams_it(json_run, how, source):
    """vLLM's guided regex and grammar: every text, sampled or greedy, is one the expression or grammar matches
    whole, and its streamed pieces add up to it."""
    import attnkit

    whole = re.compile("(cat|dog)-[0-9]{2,3}" if how == "regex" else "[a-e]{1,4}: -?[0-9]{1,3}")
    lm = attnkit.load(json_run, device="cpu")
    pieces: dict[int, str] = {}
    texts = lm.generate("x", max_new_tokens=20, num_samples=4, seed=1, **{how: source},
                        on_text=lambda i, piece: pieces.__setitem__(i, pieces.get(i, "") + piece))
    texts += lm.generate("x", max_new_tokens=20, temperature=0, **{how: source})
    for text in texts:
        assert whole.fullmatch(text), text
    assert [pieces[i] for i in range(4)] == texts[:4]
    assert len(set(texts)) > 1
    with pytest.raises(InputError, match="not regex and lark together"):
        lm.generate("x", regex="a", lark="start: \"a\"")
    with pytest.raises(InputError, match="not json_schema, regex and lark together"):  # three: not "both"
        lm.generate("x", json_schema={"type": "object"}, regex="a", lark="start: \"a\"")


def test_cli_generate_regex_and_grammar(json_run, tmp_path, capsys):
    from attnkit import cli

    grammar = tmp_path / "pair.lark"
    grammar.write_text('start: "[" NUM ", " NUM "]"\nNUM: /[0-9]{1,2}/\n')
    common = ["generate", str(json_run), "--prompt", "", "--max-new-tokens", "20", "--seed", "3"]
    assert cli.main([*common, "--regex", "[a-c]{3}-[0-9]{2}"]) == 0
    out = capsys.readouterr().out
    assert re.fullmatch("[a-c]{3}-[0-9]{2}\n", out)
    assert cli.main([*common, "--grammar", str(grammar), "--no-stream"]) == 0
    pair = json.loads(capsys.readouterr().out)
    assert len(pair) == 2 and all(0 <= n < 100 for n in pair)
    assert cli.main([*common, "--regex", "[a-c"]) == 2
    assert "the regular expression cannot be followed" in capsys.readouterr().err
    assert cli.main([*common, "--regex", "a", "--grammar", str(grammar)]) == 2
    assert "not --regex and --grammar together" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--regex", "--grammar"])
def test_cli_generate_checks_its_regex_or_grammar_once(json_run, tmp_path, capsys, monkeypatch, flag):
    """attnkit generate checked its --regex or --grammar before the model loaded, and the pipeline checked the same
    text again as it built its grammar: llguidance checks it once."""
    from attnkit import cli, grammars

    real = grammars.llguidance()
    checks = []

    class Counting:  # llguidance, with its checks of a grammar counted
        class LLMatcher:
            grammar_from_regex = staticmethod(real.LLMatcher.grammar_from_regex)
            grammar_from_lark = staticmethod(real.LLMatcher.grammar_from_lark)

            @staticmethod
            def validate_grammar(source):
                checks.append(source)
                return real.LLMatcher.validate_grammar(source)

    monkeypatch.setattr(grammars, "llguidance", lambda: Counting)
    grammar = tmp_path / "once.lark"
    grammar.write_text('start: "[" NUM "]"\nNUM: /[0-9]{3}/\n')  # texts no other test checks: none is known yet
    given = "[b-c]{2}-[0-9]{3}" if flag == "--regex" else str(grammar)
    assert cli.main(["generate", str(json_run), "--prompt", "", "--max-new-tokens", "8", flag, given]) == 0
    assert re.fullmatch(r"[b-c]{2}-[0-9]{3}\n" if flag == "--regex" else r"\[[0-9]{3}\]\n", capsys.readouterr().out)
    assert len(checks) == 1


def test_a_schema_file_that_is_not_utf8_is_refused_without_naming_a_flag_generate_lacks(json_run, tmp_path, capsys):
    from attnkit import cli

    schema = tmp_path / "schema.json"
    schema.write_bytes(b'{"type": "obj\xffect"}')
    assert cli.main(["generate", str(json_run), "--prompt", "", "--json-schema", str(schema)]) == 2
    error = capsys.readouterr().err
    assert f"{schema} is not valid UTF-8: byte 0xff at offset 13" in error
    assert "--encoding-errors" not in error  # generate has no such option: a schema is read as UTF-8 or not at all


def test_a_briefly_trained_model_writes_valid_json():
    """A model trained for a moment on JSON records: its constrained texts validate as a random model's do."""
    import random

    tokenizer = CharTokenizer(JSON_CHARS)
    draw = random.Random(0)
    records = [json.dumps({"name": "".join(draw.choices("abcde", k=draw.randint(0, 4))), "age": draw.randint(0, 120),
                           "kind": draw.choice(["cat", "dog"]), "tags": [draw.random() < 0.5] * draw.randint(0, 2)})
               for _ in range(200)]
    stream = torch.tensor(tokenizer.encode("\n".join(records)))
    model, config = tiny_model(vocab_size=tokenizer.vocab_size, max_seq_len=96, **SMALL)
    model = model.float().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        starts = torch.randint(0, len(stream) - 33, (8,), generator=generator)
        window = torch.stack([stream[s:s + 33] for s in starts.tolist()])  # (B, 33)
        loss = model(window[:, :-1], labels=window[:, 1:]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    grammar = GrammarMask.of(Grammar.json_schema(BOUNDED), tokenizer, 4)
    new = generate_tokens(model, [tokenizer.encode("\n")] * 4, max_new_tokens=BOUND_TOKENS,
                          context_len=config.max_seq_len, sampling=SamplingConfig(temperature=0.8),
                          generator=torch.Generator().manual_seed(1), stop_ids={tokenizer.eos_id}, grammar=grammar)
    for tokens in new:
        jsonschema.validate(json.loads(tokenizer.decode(tokens)), BOUNDED)


@pytest.mark.parametrize(("make", "source"), [("regex", "[a-c"), ("lark", "start: foo")])
def test_a_malformed_expression_or_grammar_is_refused_as_it_is_made_before_any_tokenizer(make, source):
    """A malformed --regex or --grammar was found only by the matcher, after the model and its tokenizer had loaded;
    Grammar.regex and Grammar.lark now refuse it as they are made, with llguidance's reason."""
    with pytest.raises(InputError, match="(?s)cannot be followed: .*(unclosed|unknown name)"):
        getattr(Grammar, make)(source)


@pytest.mark.parametrize(("flag", "source", "reason"), [("--regex", "(", "unclosed group"),
                                                         ("--grammar", "start: foo\n", 'unknown name: "foo"')])
def test_cli_refuses_a_malformed_regex_or_grammar_before_the_model_loads(json_run, tmp_path, capsys, flag, source,
                                                                          reason):
    """--regex and --grammar were checked only once the model had loaded; now a malformed one is refused first, in
    one line naming the flag and llguidance's reason, on a run whose weights are damaged (a late check would stop
    at the weights)."""
    import shutil

    from attnkit import cli

    damaged = tmp_path / "damaged"
    shutil.copytree(json_run, damaged)
    for weights in damaged.glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:64])
    grammar = tmp_path / "bad.lark"
    grammar.write_text(source)
    common = ["generate", str(damaged), "--prompt", ""]
    assert cli.main([*common, flag, source if flag == "--regex" else str(grammar)]) == 2
    error = capsys.readouterr().err.strip()
    named = "--regex: the regular expression" if flag == "--regex" else f"--grammar {grammar}: the grammar"
    assert "\n" not in error and f"{named} cannot be followed: " in error and reason in error, error
    assert cli.main([*common, "--regex", "a"]) != 0  # a well-formed expression reaches the damaged weights
    assert "cannot be followed" not in capsys.readouterr().err
