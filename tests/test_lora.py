"""LoRA: the merged model equals base + adapters, only adapters train, adapters are saved beside the base and
folded in when a run is read (inference, `convert --to-hf`), and a target that names nothing is refused."""

import copy

import pytest
import torch
from safetensors.torch import load_file

from attnkit import build_model, presets
from attnkit.checkpoint import ADAPTERS_FILE, WEIGHTS_FILE, load_model, save_model
from attnkit.errors import ConfigError
from attnkit.layers.lora import LoRALinear
from attnkit.train.lora import apply_lora, load_adapters, merge_lora

RANK, ALPHA = 4, 8.0


def tiny_model(seed=0):
    config = presets.get("llama2-tiny", vocab_size=99, max_seq_len=32)
    torch.manual_seed(seed)
    return build_model(config).eval(), config


def adapted(seed=0, targets=("q_proj", "v_proj", "down_proj")):
    """A tiny Llama with adapters whose B is random too (B = 0 would make every comparison trivial)."""
    model, config = tiny_model(seed)
    base = copy.deepcopy(model)
    names = apply_lora(model, targets=targets, rank=RANK, alpha=ALPHA)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_b.normal_(0.0, 0.05)
    return model, base, config, names


def ids(seed=1):
    return torch.randint(0, 99, (2, 12), generator=torch.Generator().manual_seed(seed))


def test_adapters_start_at_zero_so_the_model_starts_as_the_base():
    model, config = tiny_model()
    before = model(ids()).logits
    apply_lora(model, targets=("q_proj", "v_proj"), rank=RANK, alpha=ALPHA)
    torch.testing.assert_close(model(ids()).logits, before, rtol=0, atol=0)


def test_merged_model_equals_base_plus_adapters():
    model, base, _, names = adapted()
    assert len(names) == 3 * 2  # two layers, three targets each
    with torch.no_grad():
        expected = model(ids()).logits
        merged = merge_lora(copy.deepcopy(model))
        assert not any(isinstance(m, LoRALinear) for m in merged.modules())
        torch.testing.assert_close(merged(ids()).logits, expected, atol=1e-5, rtol=1e-5)

    # each merged weight is W + alpha / r * B A, computed here in float64
    merged_state, base_state = merged.state_dict(), base.state_dict()
    for name in names:
        wrapper = model.get_submodule(name)
        delta = (wrapper.lora_b.double() @ wrapper.lora_a.double()) * (ALPHA / RANK)
        expected_weight = base_state[f"{name}.weight"].double() + delta
        torch.testing.assert_close(merged_state[f"{name}.weight"].double(), expected_weight)
    untouched = [k for k in base_state if not any(k.startswith(n + ".") for n in names)]
    assert untouched and all(torch.equal(merged_state[k], base_state[k]) for k in untouched)


def test_only_adapters_train():
    model, base, _, _ = adapted()
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(name.endswith((".lora_a", ".lora_b")) for name in trainable)

    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logits = model(ids()).logits
    torch.nn.functional.cross_entropy(logits.reshape(-1, 99), ids(2).reshape(-1)).backward()
    optimizer.step()
    after = model.state_dict()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed == {k for k in after if k.endswith((".lora_a", ".lora_b"))}


def test_adapters_are_saved_beside_the_base_and_folded_in_when_read(tmp_path):
    model, base, config, _ = adapted()
    save_model(model, config, tmp_path)
    saved_base = load_file(str(tmp_path / WEIGHTS_FILE))
    for name, tensor in base.state_dict().items():
        if name in saved_base:
            assert torch.equal(saved_base[name], tensor), name  # the base weights, untouched
    adapters = load_file(str(tmp_path / ADAPTERS_FILE))
    assert adapters and all(k.endswith((".lora_a", ".lora_b")) for k in adapters)
    assert not set(adapters) & set(saved_base)

    with torch.no_grad():
        expected = model(ids()).logits
        merged, _ = load_model(tmp_path)
        torch.testing.assert_close(merged(ids()).logits, expected, atol=1e-5, rtol=1e-5)
        plain, _ = load_model(tmp_path, merge_adapters=False)
        torch.testing.assert_close(plain(ids()).logits, base(ids()).logits, rtol=0, atol=0)

        # the base read alone, wrapped again and given the saved adapters, is the adapted model again
        apply_lora(plain, targets=("q_proj", "v_proj", "down_proj"), rank=RANK, alpha=ALPHA)
        load_adapters(plain, adapters, source=str(tmp_path / ADAPTERS_FILE))
        torch.testing.assert_close(plain(ids()).logits, expected, rtol=0, atol=0)


def test_convert_to_hf_writes_the_merged_weights(tmp_path):
    from interop_models import transformers

    from attnkit.interop import hf

    model, _, config, _ = adapted()
    save_model(model, config, tmp_path / "run")
    hf.convert_to_hf(tmp_path / "run", tmp_path / "hf")
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        torch.testing.assert_close(reference(input_ids=ids()).logits, model(ids()).logits, atol=1e-5, rtol=1e-5)


def test_a_target_that_names_no_module_is_refused_with_the_names_there_are():
    model, _ = tiny_model()
    with pytest.raises(ConfigError, match="'query' matches no linear module") as err:
        apply_lora(model, targets=("q_proj", "query"), rank=RANK, alpha=ALPHA)
    assert "q_proj" in str(err.value) and "down_proj" in str(err.value)
    with pytest.raises(ConfigError, match="lora_rank"):
        apply_lora(model, targets=("q_proj",), rank=0, alpha=ALPHA)


def test_a_tied_head_is_refused_naming_the_modules_an_adapter_can_take_or_that_there_are_none():
    decoder = build_model(presets.get("gpt2-tiny", vocab_size=20, max_seq_len=8))  # gpt2 ties its head
    with pytest.raises(ConfigError, match="other linear modules: down_proj, k_proj, o_proj, q_proj, up_proj, v_proj"):
        apply_lora(decoder, targets=("lm_head",), rank=RANK, alpha=ALPHA)
    conv = build_model(presets.get("gcnn-lm-tiny", vocab_size=20))  # its head is its one linear module, and tied
    with pytest.raises(ConfigError, match=r"no other linear module .* fine-tune it in full \(leave out --lora-rank"):
        apply_lora(conv, targets=("lm_head",), rank=RANK, alpha=ALPHA)


def test_a_glob_over_full_names_selects_one_layer():
    model, _ = tiny_model()
    names = apply_lora(model, targets=("stack.blocks.1.*",), rank=RANK, alpha=ALPHA)
    assert names and all(name.startswith("stack.blocks.1.") for name in names)
    assert not any(isinstance(m, LoRALinear) for m in model.get_submodule("stack.blocks.0").modules())


def test_adapters_off_computes_the_base_and_gives_the_adapters_back_on_an_error_and_after_a_nested_block():
    """`adapters_off` (DPO's reference without a second copy): the base's logits inside; after the block, also one
    left by an exception, the adapted logits again; a nested block leaves them off for the rest of the outer one."""
    from attnkit.layers.lora import adapters_off

    model, base, _, _ = adapted()
    with torch.no_grad():
        expected, adapted_logits = base(ids()).logits, model(ids()).logits
        assert not torch.allclose(expected, adapted_logits)
        with pytest.raises(RuntimeError, match="inside"), adapters_off(model) as has_adapters:
            assert has_adapters
            torch.testing.assert_close(model(ids()).logits, expected, rtol=0, atol=0)
            raise RuntimeError("inside")
        torch.testing.assert_close(model(ids()).logits, adapted_logits, rtol=0, atol=0)
        with adapters_off(model):
            with adapters_off(model):
                pass
            torch.testing.assert_close(model(ids()).logits, expected, rtol=0, atol=0)
        torch.testing.assert_close(model(ids()).logits, adapted_logits, rtol=0, atol=0)
        with adapters_off(base) as has_adapters:
            assert not has_adapters
