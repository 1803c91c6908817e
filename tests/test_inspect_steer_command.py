"""`attnkit inspect RUN steer`: each continuation is the one attnkit.generate's decoder writes with and without the
same steering (greedy), one seed gives both sampled continuations (coefficient 0: the same text), the two are logged
side by side, a padded vocabulary's ids are never written, a temperature near 0 draws the greedy text, and bad
flags are refused by name before or as the model loads."""

import json
import logging

import pytest
import torch
from cli_helpers import tiny_runs

from attnkit.checkpoint import load_model
from attnkit.cli import main
from attnkit.errors import InputError
from attnkit.generate.decoder import generate_tokens
from attnkit.inspect.command import InspectSettings, run_inspect
from attnkit.inspect.report import markdown
from attnkit.inspect.steering import contrast_vector, steering
from attnkit.tokenize import load_tokenizer


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tiny_runs(tmp_path_factory.mktemp("runs"))  # "lm": a one-block decoder, "clf": an encoder classifier


@pytest.fixture(scope="module")
def run(runs):
    return runs["lm"]


def _steer(run, tmp_path, **fields):
    paths = run_inspect(InspectSettings(run=str(run), analysis="steer", out=str(tmp_path), **fields))
    assert [p.name for p in paths] == ["steer.json", "steer.md", "steer.png"]
    return json.loads(paths[0].read_text())


def test_greedy_continuations_are_generate_tokens_with_and_without_the_steering(run, tmp_path, caplog):
    model, _ = load_model(run)
    model.eval()
    tokenizer = load_tokenizer(run / "tokenizer")
    with caplog.at_level(logging.INFO):
        report = _steer(run, tmp_path, text=("abc de",), steer=("gggggg", "aaaaaa"), layer=0, coeff=30.0, tokens=12,
                        temperature=0.0)
    positive, negative = (torch.tensor([tokenizer.encode(t)]) for t in ("gggggg", "aaaaaa"))
    vector = contrast_vector(model, "blocks.0.resid_pre", positive, negative)
    prompt = [tokenizer.encode("abc de")]
    plain = generate_tokens(model, prompt, max_new_tokens=12, context_len=24)[0]
    with steering(model, "blocks.0.resid_pre", vector, coeff=30.0):
        steered = generate_tokens(model, prompt, max_new_tokens=12, context_len=24)[0]
    (row,) = report["rows"]
    assert row == {"prompt": "abc de", "unsteered": tokenizer.decode(plain), "steered": tokenizer.decode(steered)}
    assert row["steered"] != row["unsteered"]
    assert report["summary"]["point"] == "blocks.0.resid_pre"
    logged = caplog.text
    assert "unsteered" in logged and "+30 x ('gggggg' - 'aaaaaa') at blocks.0.resid_pre" in logged


def test_a_pipeline_writes_the_same_steered_text(run):
    """`steering` takes a pipeline from attnkit.load as it takes its model; Pipeline.generate decodes through it."""
    from attnkit.generate import load

    pipeline = load(run, device="cpu")
    tokenizer = pipeline.tokenizer
    pair = [torch.tensor([tokenizer.encode(t)]) for t in ("gggggg", "aaaaaa")]
    vector = contrast_vector(pipeline, "blocks.0.resid_pre", *pair)
    with steering(pipeline, "blocks.0.resid_pre", vector, coeff=30.0):
        text = pipeline.generate("abc de", max_new_tokens=12, temperature=0, stop_at_eos=False)[0]
        tokens = generate_tokens(pipeline.model, [tokenizer.encode("abc de")], max_new_tokens=12, context_len=24)[0]
    assert text == tokenizer.decode(tokens)
    assert text != pipeline.generate("abc de", max_new_tokens=12, temperature=0, stop_at_eos=False)[0]


def test_beam_search_and_speculative_decoding_write_the_steered_models_texts(run):
    """Beams: the texts of a reference hook adding the pair at the prompt's columns in its one prefill call.
    A draft: the steered model's own greedy text, its rejected drafts computed (and steered) again."""
    from attnkit.generate import load

    pipeline, draft = load(run, device="cpu"), load(run, device="cpu")
    pair = [torch.tensor([pipeline.tokenizer.encode(t)]) for t in ("gggggg", "aaaaaa")]
    vector = contrast_vector(pipeline, "blocks.0.resid_pre", *pair)  # (6, C)

    def add_front(module, args):  # block 0's input (B, T, C) in the prefill: + 30 v at columns 0..5
        x = args[0]
        return None if x.shape[1] == 1 else (torch.cat([x[:, :6] + 30.0 * vector, x[:, 6:]], dim=1), *args[1:])

    beams = {"num_beams": 3, "num_return_sequences": 2, "max_new_tokens": 10, "stop_at_eos": False}
    handle = pipeline.model.stack.blocks[0].register_forward_pre_hook(add_front)
    try:
        expected = pipeline.generate("abc de", **beams)
    finally:
        handle.remove()
    greedy = {"max_new_tokens": 12, "temperature": 0, "stop_at_eos": False}
    with steering(pipeline, "blocks.0.resid_pre", vector, coeff=30.0):
        assert pipeline.generate("abc de", **beams) == expected
        alone = pipeline.generate("abc de", **greedy)
        assert pipeline.generate("abc de", draft=draft, draft_tokens=3, **greedy) == alone
    assert expected != pipeline.generate("abc de", **beams)
    assert alone != pipeline.generate("abc de", **greedy)


def test_a_compiled_pipeline_is_refused(run):
    from attnkit.generate import load

    pipeline = load(run, device="cpu", compile=True)  # the step compiles at its first call: nothing compiled yet
    with pytest.raises(InputError, match="loaded with compile=True.*load it without compile"):
        steering(pipeline, "blocks.0.resid_pre", torch.zeros(16)).__enter__()


def test_one_seed_gives_both_continuations(run, tmp_path):
    """Sampled, coefficient 0: the two texts are the same draw."""
    report = _steer(run, tmp_path, text=("abc", "hij"), steer=("ggg", "aaa"), coeff=0.0, tokens=10, seed=3)
    assert [r["steered"] for r in report["rows"]] == [r["unsteered"] for r in report["rows"]]
    again = _steer(run, tmp_path, text=("abc",), steer=("ggg", "aaa"), coeff=0.0, tokens=10, seed=4)
    assert again["rows"][0]["unsteered"] != report["rows"][0]["unsteered"]  # the seed decides the draw


def test_the_cli_prints_the_three_files_it_writes(run, tmp_path, capsys):
    assert main(["inspect", str(run), "steer", "--text", "abc", "--steer", "ggg", "aaa", "--layer", "0",
                 "--coeff", "3", "--tokens", "5", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / f"steer.{s}") for s in ("json", "md", "png")]


@pytest.mark.parametrize(("fields", "says"), [
    ({"steer": ("gg", "aaa")}, r"become 2 and 3 tokens .*add spaces to the shorter"),
    ({"layer": 1}, r"--layer 1: the run has 1 block, so give 0..0"),
    ({"steer": ("ggg",)}, "two texts POSITIVE NEGATIVE"),
    ({"coeff": float("inf")}, "finite"),
    ({"tokens": 0}, "1 or more"),
    ({"tokens": 23}, "give --tokens 20 or a shorter text"),
    ({"analysis": "logit-lens", "coeff": 2.0}, "--coeff: steer's flags; logit-lens takes none"),
])
def test_bad_flags_are_refused_by_name(run, tmp_path, fields, says):
    settings = {"text": ("abcd",), "steer": ("ggg", "aaa"), "analysis": "steer", **fields}
    with pytest.raises(InputError, match=says):
        run_inspect(InspectSettings(run=str(run), out=str(tmp_path), **settings))


def test_an_encoder_run_is_refused(runs, tmp_path):
    with pytest.raises(InputError, match="steer continues a text, which a decoder run does; this run is .encoder."):
        run_inspect(InspectSettings(run=str(runs["clf"]), analysis="steer", text=("abc",), steer=("ab", "cd"),
                                    out=str(tmp_path)))


def test_a_line_break_in_a_cell_keeps_the_markdown_row_whole():
    """A continuation is text with line breaks; each would end its table row in steer.md."""
    table = markdown("t", {}, [{"prompt": "a", "steered": "x\ny"}]).splitlines()
    assert table[-1] == "| a | x<br>y |"


def test_a_bar_in_a_cell_is_escaped():
    """A continuation such as `a | b` would otherwise split its cell in two and shift the row's columns."""
    table = markdown("t", {}, [{"prompt": "a|b", "steered": "x || y"}]).splitlines()
    assert table[-1] == "| a\\|b | x \\|\\| y |"


def test_a_padded_vocabulary_writes_and_lists_only_the_tokenizers_ids(tmp_path):
    """A model whose vocabulary is padded past its tokenizer's (ids that name no text): neither continuation draws
    a padding id and the raised and lowered tokens are the tokenizer's, where decoding one was refused."""
    from attnkit import build_model
    from attnkit.checkpoint import save_model
    from attnkit.config import ModelConfig
    from attnkit.tokenize import CharTokenizer

    tokenizer = CharTokenizer("abcdefgh ")
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size + 40, d_model=16, n_layers=1, n_heads=2,
                         d_ff=32, max_seq_len=32)
    torch.manual_seed(0)
    save_model(build_model(config).eval(), config, tmp_path / "run")
    tokenizer.save(tmp_path / "run" / "tokenizer")
    report = _steer(tmp_path / "run", tmp_path / "out", text=("abc",), steer=("ggg", "aaa"), coeff=5.0, tokens=20)
    written = report["rows"][0]["steered"] + report["rows"][0]["unsteered"]
    assert written and set(written) <= set("abcdefgh ")
    pieces = set(tokenizer.pieces(range(tokenizer.vocab_size)))
    listed = report["summary"]["raised most"] + ", " + report["summary"]["lowered most"]
    assert {name.rsplit(" (", 1)[0].strip("'") for name in listed.split(", ")} <= pieces


def test_a_tiny_temperature_draws_the_greedy_text(run, tmp_path):
    """logits / 1e-300 overflow float32 (inf - inf: nan probabilities); the draw is the likeliest token's, as at 0."""
    flags = {"text": ("abc",), "steer": ("ggg", "aaa"), "coeff": 8.0, "tokens": 10}
    tiny = _steer(run, tmp_path / "tiny", temperature=1e-300, **flags)["rows"]
    assert tiny == _steer(run, tmp_path / "greedy", temperature=0.0, **flags)["rows"]
