"""What the machine's capabilities decide outside the inference plan: training in bf16 on a CPU without oneDNN's bf16
kernels is warned about, with what is faster there."""

import logging
from pathlib import Path

from attnkit import ModelConfig, build_model
from attnkit.machine import CpuCapabilities
from attnkit.train.trainer import bf16_cost_warning

AVX2 = CpuCapabilities(isa="AVX2", flags=frozenset({"avx2"}))
AVX512 = CpuCapabilities(isa="AVX512", flags=frozenset({"avx512_f", "avx512_bw", "avx512_vl", "avx512_dq"}))


def test_bf16_training_is_warned_about_only_where_the_cpu_has_no_bf16_kernels():
    warning = bf16_cost_warning(AVX2)
    assert warning is not None and "AVX2" in warning and "--dtype fp32" in warning
    assert bf16_cost_warning(AVX512) is None
    assert bf16_cost_warning(CpuCapabilities(isa="AVX2", flags=frozenset({"avx_ne_convert"}))) is None


def test_the_trainer_says_it_when_training_starts_on_such_a_cpu(tmp_path, caplog):
    from attnkit.train.trainer import TrainConfig, Trainer

    class Task:  # the trainer reads these at construction; nothing trains here
        name, metric, higher_is_better = "lm", "val_loss", False

    config = ModelConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=8)
    with caplog.at_level(logging.WARNING, logger="attnkit.train.trainer"):
        Trainer(model=build_model(config), config=config, task=Task(), settings=TrainConfig(dtype="bf16"),
                run_dir=tmp_path, tokenizer=None)
    expected = bf16_cost_warning(CpuCapabilities.detect())
    if expected is None:  # this CPU has bf16 kernels: nothing to warn about
        assert "--dtype fp32" not in caplog.text
    else:
        assert expected in caplog.text


def test_without_torchs_capability_report_linuxs_flags_stand_in(monkeypatch):
    import pytest
    import torch

    from attnkit.machine import reported_capabilities

    reported = dict(torch.cpu.get_capabilities())
    if not Path("/proc/cpuinfo").is_file():
        pytest.skip("no /proc/cpuinfo on this system (Linux only)")
    monkeypatch.setattr(torch.cpu, "get_capabilities", None)
    fallback = reported_capabilities()
    for flag in ("avx2", "avx512_f", "avx512_bw", "avx512_bf16"):
        assert fallback.get(flag, False) == reported.get(flag, False), flag
