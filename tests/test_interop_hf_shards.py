"""`attnkit convert RUN --to-hf DIR --max-shard-size SIZE`: weights split as `save_pretrained(max_shard_size=...)`
splits them (huggingface_hub's split, the same files), loaded by `transformers` with the single file's logits, read
back by `--from-hf` (transformers' own shards too), written whole or not at all; a damaged index is refused naming
the fault and the fix."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
import torch
from export_runs import LAYOUTS, random_run
from interop_models import hf_model, transformers  # noqa: F401
from safetensors.torch import load_file, save_file

from attnkit.checkpoint import load_model
from attnkit.cli import main
from attnkit.errors import CheckpointError, InputError
from attnkit.interop import hf, hf_shards
from attnkit.interop.hf_shards import SAFETENSORS_INDEX, parse_shard_size, split_shards

SMALL = {**LAYOUTS["llama-gqa-untied"], "d_model": 32, "d_ff": 64}  # about 140 KB of float32 weights


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A run written whole (the default 5GB) and in shards of 30 KB."""
    root = tmp_path_factory.mktemp("shards")
    run = random_run(root, SMALL)
    assert main(["convert", str(run), "--to-hf", str(root / "single")]) == 0
    assert main(["convert", str(run), "--to-hf", str(root / "sharded"), "--max-shard-size", "30KB"]) == 0
    return run, root / "single", root / "sharded"


def test_small_models_get_one_file_and_large_ones_save_pretrained_s_shards(exported):
    from huggingface_hub import split_torch_state_dict_into_shards

    _, single, sharded = exported
    assert sorted(p.name for p in single.glob("model*")) == ["model.safetensors"]
    index = json.loads((sharded / SAFETENSORS_INDEX).read_text())
    files = sorted(p.name for p in sharded.glob("model*.safetensors"))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    whole = load_file(str(single / "model.safetensors"))
    assert sorted(index["weight_map"]) == sorted(whole)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in whole.values())
    for name in files:  # every tensor in the file the index names, with the single file's values, 30 KB at most
        shard = load_file(str(sharded / name))
        assert len(shard) == 1 or sum(t.numel() * t.element_size() for t in shard.values()) <= 30_000
        for tensor_name, tensor in shard.items():
            assert index["weight_map"][tensor_name] == name and torch.equal(tensor, whole[tensor_name])
    # the split huggingface_hub (save_pretrained's) makes of the same tensors in the same order
    for order in (sorted(whole), sorted(whole, reverse=True)):
        ordered = {name: whole[name] for name in order}
        reference = split_torch_state_dict_into_shards(ordered, max_shard_size="30KB")
        assert [list(shard) for shard in split_shards(ordered, 30_000)] == list(reference.filename_to_tensors.values())


def test_transformers_loads_the_shards_with_the_single_files_logits(exported):
    _, single, sharded = exported
    ids = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        one = transformers.AutoModelForCausalLM.from_pretrained(single).eval()(ids).logits
        many = transformers.AutoModelForCausalLM.from_pretrained(sharded).eval()(ids).logits
    assert torch.equal(one, many)


def test_from_hf_reads_attnkits_and_transformers_shards(exported, tmp_path):
    run, _, sharded = exported
    model, _ = load_model(run)
    assert main(["convert", "--from-hf", str(sharded), "--out", str(tmp_path / "back")]) == 0
    back, _ = load_model(tmp_path / "back")
    for (name, ours), theirs in zip(model.state_dict().items(), back.state_dict().values(), strict=True):
        assert torch.equal(ours, theirs), name

    reference = hf_model("llama", tmp_path / "hf")  # transformers writes its own shards
    reference.save_pretrained(tmp_path / "hf-sharded", max_shard_size="20KB")
    assert len(list((tmp_path / "hf-sharded").glob("model-*.safetensors"))) > 2
    loaded = hf.load(tmp_path / "hf-sharded")
    ids = torch.randint(3, 99, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-5)


def _damage(directory, how: str) -> None:
    path = directory / SAFETENSORS_INDEX
    index = json.loads(path.read_text())
    files = sorted(set(index["weight_map"].values()))
    if how == "a shard missing":
        (directory / files[1]).unlink()
    elif how == "a tensor in two shards":
        first = load_file(str(directory / files[0]))
        save_file({**load_file(str(directory / files[1])), **first}, str(directory / files[1]))
    elif how == "a tensor the index does not list":
        files_named = list(index["weight_map"].values())
        shared = [name for name, file in index["weight_map"].items() if files_named.count(file) > 1]
        del index["weight_map"][shared[0]]  # from a shard that the index still names
    elif how == "a tensor the shards do not hold":
        index["weight_map"]["lm_head.bias"] = files[0]
    elif how == "the total size":
        index["metadata"]["total_size"] += 4
    elif how == "not JSON":
        path.write_text(path.read_text()[:-20])
        return
    path.write_text(json.dumps(index))


@pytest.mark.parametrize(("how", "said"), [
    ("a shard missing", "names 1 shard file missing from"),
    ("a tensor in two shards", "not where the index puts them, each once: .* in model-00002"),
    ("a tensor the shards do not hold", "lists tensors its shards do not hold: lm_head.bias"),
    ("not JSON", "is not a shard index"),
])
def test_a_damaged_index_is_refused_in_one_line_naming_the_fault_and_the_fix(exported, tmp_path, capsys, how, said):
    copy = shutil.copytree(exported[2], tmp_path / "copy")
    _damage(copy, how)
    with pytest.raises(CheckpointError, match=said):
        hf.load(copy)
    assert main(["convert", "--from-hf", str(copy), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fetch or save the checkpoint again" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("how", ["a tensor the index does not list", "the total size"])
def test_what_transformers_loads_is_read_an_unlisted_tensor_and_any_total_size(exported, tmp_path, how):
    """transformers reads every tensor of every shard its index names and never checks metadata.total_size (which
    huggingface_hub counts by storage: tied tensors once), so neither is damage."""
    run, _, sharded = exported
    copy = shutil.copytree(sharded, tmp_path / "copy")
    _damage(copy, how)
    model, _ = load_model(run)
    ids = torch.randint(0, 300, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(hf.load(copy).model(ids).logits, model(ids).logits)
        assert torch.equal(transformers.AutoModelForCausalLM.from_pretrained(copy).eval()(ids).logits,
                           model(ids).logits)  # as transformers reads it


def test_transformers_4s_pickled_shards_of_a_tied_model_are_read(tmp_path):
    """save_pretrained(safe_serialization=False, max_shard_size=...) of transformers 4: a tied GPT-2's lm_head.weight
    shares the embedding's storage, so it is saved and listed, but total_size counts the storage once."""
    from huggingface_hub import split_torch_state_dict_into_shards

    reference = hf_model("gpt2", tmp_path / "hf")
    state = reference.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["transformer.wte.weight"].data_ptr()
    split = split_torch_state_dict_into_shards(state, filename_pattern="pytorch_model{suffix}.bin",
                                               max_shard_size="20KB")
    directory = tmp_path / "bin-shards"
    directory.mkdir()
    shutil.copy(tmp_path / "hf" / "config.json", directory)
    for file, names in split.filename_to_tensors.items():
        torch.save({name: state[name] for name in names}, directory / file)
    index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    assert len(split.filename_to_tensors) > 2 and "lm_head.weight" in split.tensor_to_filename
    assert split.metadata["total_size"] < sum(t.numel() * t.element_size() for t in state.values())
    ids = torch.randint(3, 99, (2, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(hf.load(directory, allow_pickle=True).model(ids).logits, reference(ids).logits,
                                   rtol=1e-5, atol=1e-5)


def test_max_shard_size_takes_transformers_forms():
    from transformers.utils.hub import convert_file_size_to_int

    for size in ("5GB", "500MB", "100KB", "2GiB", "512MiB", "1KiB", "8Gb", "10mb"):
        assert parse_shard_size(size) == convert_file_size_to_int(size), size
    assert parse_shard_size("1234") == parse_shard_size(1234) == 1234
    assert parse_shard_size("1.5GB") == 1_500_000_000  # huggingface_hub's parser takes a fraction too
    for bad in ("5XB", "GB", "-1", "0", "five GB", ""):
        with pytest.raises(InputError, match=r"\(--max-shard-size, max_shard_size=\)"):  # the flag and the keyword
            parse_shard_size(bad)


def test_the_split_is_huggingface_hubs_for_drawn_sizes_with_tensors_larger_than_a_shard():
    """A tensor past the size is a shard of its own, written where it is met, while the open shard stays open."""
    from huggingface_hub import split_torch_state_dict_into_shards

    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        sizes = torch.randint(1, 40, (int(torch.randint(1, 12, (), generator=generator)),), generator=generator)
        tensors = {f"t{i}": torch.zeros(int(n), dtype=torch.float16) for i, n in enumerate(sizes)}  # 2 bytes each
        ours = [list(shard) for shard in split_shards(tensors, 32)]
        reference = split_torch_state_dict_into_shards(tensors, max_shard_size=32)
        assert ours == list(reference.filename_to_tensors.values())


def test_a_bad_size_or_one_without_to_hf_is_refused_before_the_run_loads(tmp_path, capsys):
    (tmp_path / "run").mkdir()  # no model: it is never read
    run = str(tmp_path / "run")
    assert main(["convert", run, "--to-hf", str(tmp_path / "out"), "--max-shard-size", "5XB"]) == 2
    assert "the shard size '5XB' (--max-shard-size, max_shard_size=) is not a size" in capsys.readouterr().err
    assert main(["convert", run, "--to-gguf", str(tmp_path / "m.gguf"), "--max-shard-size", "1MB"]) == 2
    assert "--max-shard-size goes with --to-hf" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_full_disk_at_the_last_shard_leaves_no_directory(exported, tmp_path, capsys, monkeypatch):
    written = hf_shards.save_tensors

    def full_at_the_third(tensors, path, metadata=None):
        if path.name.startswith("model-00003"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        written(tensors, path, metadata=metadata)

    monkeypatch.setattr(hf_shards, "save_tensors", full_at_the_third)
    out = tmp_path / "out"
    assert main(["convert", str(exported[0]), "--to-hf", str(out), "--max-shard-size", "30KB"]) == 2
    assert "the disk is full" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no directory, no partial one beside it


def test_overwriting_a_single_file_directory_with_shards_leaves_no_stale_weights(exported, tmp_path):
    """transformers reads model.safetensors before an index: one left beside the shards would be loaded instead."""
    run, single, _ = exported
    target = shutil.copytree(single, tmp_path / "exported")
    assert main(["convert", str(run), "--to-hf", str(target), "--overwrite", "--max-shard-size", "30KB"]) == 0
    assert not (target / "model.safetensors").exists() and (target / SAFETENSORS_INDEX).is_file()
    assert main(["convert", str(run), "--to-hf", str(target), "--overwrite"]) == 0  # and back to one file
    assert sorted(p.name for p in target.glob("model*")) == ["model.safetensors"]


def test_saving_again_into_a_directory_removes_the_earlier_saves_weights(exported, tmp_path):
    """hf.save (the Python API) into a directory of an earlier save: its model.safetensors beside new shards would be
    read in their place, by transformers as by attnkit; its shards and index beside a new single file or fewer
    shards are left over. Each save leaves its own weight files alone, and they load."""
    model, config = load_model(exported[0])
    other, _ = load_model(random_run(tmp_path, SMALL, name="other", seed=1))
    out = tmp_path / "exported"
    ids = torch.randint(0, 300, (2, 7), generator=torch.Generator().manual_seed(2))
    for saved, size, files in ((other, "5GB", 1), (model, "30KB", None), (other, "60KB", None), (model, "5GB", 1)):
        hf.save(saved, out, config=config, max_shard_size=size)
        names = sorted(p.name for p in out.glob("model*"))
        shards = [name for name in names if name.startswith("model-")]
        if files == 1:
            assert names == ["model.safetensors"]
        else:
            assert names == [*shards, SAFETENSORS_INDEX] and len(shards) > 1
            assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
        with torch.no_grad():
            assert torch.equal(hf.load(out).model(ids).logits, saved(ids).logits), size
