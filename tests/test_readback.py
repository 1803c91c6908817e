"""Files attnkit reads back are checked before use (`attnkit.readback`): the tuning profile field by field (bad
UTF-8, "abc" for a number, negative limits, unknown layouts each refused naming file, field and fix), and the
captured decoding steps of the compile cache by the digest recorded at capture (a damaged package is captured
again, never handed to the loader)."""

from __future__ import annotations

import json

import pytest
from generate_models import tiny_model

from attnkit import readback
from attnkit.errors import InputError
from attnkit.generate import captured_step as captured
from attnkit.machine import DEFAULT_PROFILE, PROFILE_VERSION, CpuCapabilities, Profile, load_profile
from attnkit.readback import FileFields


@pytest.fixture
def profile_path(tmp_path):
    """A profile as `attnkit tune` writes it, measured on this machine."""
    import dataclasses

    import torch

    profile = dataclasses.replace(DEFAULT_PROFILE, cpu=CpuCapabilities.detect(), torch_version=torch.__version__,
                                  dtype_speed={"fp32": 1.0, "bf16": 1.4})
    path = tmp_path / "profile.json"
    path.write_text(profile.to_json())
    return path


def edited(path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_a_profile_as_tune_writes_it_is_read_as_measured(profile_path):
    profile, why = load_profile(profile_path)
    assert "measured on this machine" in why and profile.attention == DEFAULT_PROFILE.attention
    assert profile.dtype_speed == {"fp32": 1.0, "bf16": 1.4}


@pytest.mark.parametrize(("edit", "said"), [
    (lambda d: d["attention"]["bf16"].update(decode_keys="abc"), "attention.bf16.decode_keys='abc' must be a whole"),
    (lambda d: d["attention"]["bf16"].update(pass_keys=-128), "attention.bf16.pass_keys=-128 must be at least 0"),
    (lambda d: d["attention"]["bf16"].update(decode_keys=1.5), "decode_keys=1.5 must be a whole number"),
    (lambda d: d["decode_linear"].update(bf16="fastest"), "decode_linear.bf16='fastest' must be one of plain"),
    (lambda d: d["dtype_speed"].update(bf16=-2), "dtype_speed.bf16=-2 must be above 0"),
    (lambda d: d["dtype_speed"].update(bf16="1.2"), "dtype_speed.bf16='1.2' must be a finite number"),
    (lambda d: d.update(attention=[1, 2]), "attention=[1, 2] must be a JSON object"),
    (lambda d: d.update(version="1"), f"version='1' must be {PROFILE_VERSION}"),
    (lambda d: d.pop("decode_linear"), "lacks the field decode_linear"),
])
def test_a_profile_with_a_wrong_field_is_refused_naming_file_field_and_fix(profile_path, edit, said):
    edited(profile_path, edit)
    with pytest.raises(InputError) as refusal:
        load_profile(profile_path)
    message = str(refusal.value)
    assert said in message and str(profile_path) in message and "attnkit tune" in message, message


@pytest.mark.parametrize(("content", "said"), [(b'{"version": 1, "a": "caf\xe9"}', "is not UTF-8 text (byte 0xe9"),
                                               (b"{not json", "is not valid JSON"),
                                               (b"[" * 100_000, "is not valid JSON"),
                                               (b"[1, 2]", "must be a JSON object")])
def test_a_profile_that_is_not_a_json_object_in_utf8_is_one_line(tmp_path, content, said):
    path = tmp_path / "profile.json"
    path.write_bytes(content)
    with pytest.raises(InputError) as refusal:
        load_profile(path)
    assert said in str(refusal.value) and "\n" not in str(refusal.value)


def test_a_refused_profile_is_one_line_on_the_command_line(profile_path, monkeypatch, capsys, tmp_path):
    from attnkit import cli
    from attnkit.checkpoint import save_model
    from attnkit.tokenize import CharTokenizer

    edited(profile_path, lambda d: d["attention"]["bf16"].update(decode_keys=-5))
    monkeypatch.setenv("ATTNKIT_PROFILE", str(profile_path))
    tokenizer = CharTokenizer("abcdefgh ")
    model, config = tiny_model("decoder", vocab_size=tokenizer.vocab_size, position="rope", seed=1)
    save_model(model, config, tmp_path / "run")
    tokenizer.save(tmp_path / "run" / "tokenizer")
    assert cli.main(["generate", "--run", str(tmp_path / "run"), "--prompt", "ab", "--max-new-tokens", "2",
                     "--dtype", "bf16", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "decode_keys=-5 must be at least 0" in err and err.count("\n") == 1


def test_file_fields_take_no_bool_for_a_number_and_name_nested_fields():
    fields = FileFields({"a": True, "b": {"c": "x"}}, "f.json", fix="fix it")
    with pytest.raises(InputError, match=r"f.json: a=True must be a finite number; fix it"):
        fields.number("a")
    with pytest.raises(InputError, match=r"f.json: b.c='x' must be a whole number"):
        fields.mapping("b").integer("c")
    assert fields.number("absent", default=3) == 3 and Profile  # the default is handed back unchecked


def test_file_fields_hand_out_rows_of_values_and_refuse_a_row_that_says_nothing():
    rows = [{"x": 1, "y": None}, {"x": None, "y": float("nan")}, {"x": "diverged", "y": float("nan")}]
    fields = FileFields({"rows": rows, "bad": "abc", "nested": [{"x": [1]}]}, "r.json", fix="rerun it")
    first, empty, diverged = fields.records("rows")
    assert first.scalars() == {"x": 1, "y": None} and diverged.scalars()["x"] == "diverged"  # NaN: a value missing
    with pytest.raises(InputError, match=r"r.json: rows\[1\] holds no value \(every field missing or null\); rerun it"):
        empty.scalars()
    with pytest.raises(InputError, match="r.json: bad='abc' must be a list of JSON objects"):
        fields.records("bad")
    with pytest.raises(InputError, match=r"r.json: nested\[0\].x=\[1\] must be a number, a string, true/false or null"):
        fields.records("nested")[0].scalars()


# The compile cache ------------------------------------------------------------------------------------------------
@pytest.fixture
def fake_capture(monkeypatch):
    """capture_step writing a stand-in package (no C++ compiler run), load_step returning a stand-in step; the
    list records each capture."""
    captures = []

    def capture(model, path, form="one-row"):
        captures.append(form)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"PK\x03\x04 a package" + bytes(64))
        captured.atomic_write(captured.digest_path(path), captured.digest(path) + "\n")

    def load(path, model):
        assert captured.kept_package(path), "a package was loaded without being verified"
        return lambda inputs: inputs

    monkeypatch.setattr(captured, "capture_step", capture)
    monkeypatch.setattr(captured, "load_step", load)
    return captures


@pytest.mark.parametrize("damage", ["truncated", "emptied", "flipped", "digest lost"])
def test_a_damaged_kept_step_is_captured_again(tmp_path, fake_capture, caplog, damage):
    model, _ = tiny_model(position="rope")
    first = captured.CapturedDecoding(model, package_dir=tmp_path)
    path = first.package_paths["one-row"]
    assert fake_capture == ["one-row"] and path.is_file()
    captured.CapturedDecoding(model, package_dir=tmp_path)
    assert fake_capture == ["one-row"]  # whole: loaded, not captured again
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "emptied":
        path.write_bytes(b"")
    elif damage == "flipped":
        path.write_bytes(data[:10] + bytes([data[10] ^ 1]) + data[11:])
    else:
        captured.digest_path(path).unlink()
    with caplog.at_level("WARNING"):
        captured.CapturedDecoding(model, package_dir=tmp_path)
    assert fake_capture == ["one-row", "one-row"]
    assert "is damaged" in caplog.text and "capturing it again" in caplog.text
    assert captured.kept_package(path)


class _CountedKey(str):
    """A JSON key that counts the comparisons made with it."""

    comparisons = 0

    def __eq__(self, other):
        type(self).comparisons += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_keys_given_twice_are_found_in_one_pass_over_the_object():
    """The repeated keys of an object are counted once each (a count per key compared every key with every other:
    an object of 100,000 keys took minutes), and each repeated one is named."""
    pairs = [(_CountedKey(f"k{i}"), i) for i in range(2000)] + [(_CountedKey("k5"), 0), (_CountedKey("k7"), 0)]
    _CountedKey.comparisons = 0
    with pytest.raises(ValueError, match="names k5, k7 twice"):
        readback._unique_keys(pairs)
    assert _CountedKey.comparisons <= len(pairs)
