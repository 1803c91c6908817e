"""Shared test settings: one torch thread, so tiny models are not slowed by thread hand-offs on small machines; a
kept tuning profile, so no test measures the machine on first use; a small disk that fills up for real; tests marked
`gpu` skipped, with the reason, where torch sees no CUDA device."""

import dataclasses
import os
import shutil
import subprocess

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    no_cuda = pytest.mark.skip(reason="needs a CUDA device; torch sees none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(no_cuda)


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True, scope="session")
def _kept_profile(tmp_path_factory):
    """A kept profile for this CPU (the documented defaults), so that no test measures the machine for seconds on
    the inference plan's first use (`tune.machine_profile`); subprocesses inherit it. The test of first use points
    the profile elsewhere itself."""
    from attnkit.machine import DEFAULT_PROFILE, PROFILE_ENV, CpuCapabilities

    path = tmp_path_factory.mktemp("profile") / "profile.json"
    kept = dataclasses.replace(DEFAULT_PROFILE, cpu=CpuCapabilities.detect(), torch_version=torch.__version__)
    path.write_text(kept.to_json())
    previous = os.environ.get(PROFILE_ENV)
    os.environ[PROFILE_ENV] = str(path)
    yield
    if previous is None:
        del os.environ[PROFILE_ENV]
    else:
        os.environ[PROFILE_ENV] = previous


@pytest.fixture
def small_disk(tmp_path):
    """A directory on a 64 KiB tmpfs, where writing more gives the kernel's own "No space left on device". Skipped
    where a tmpfs cannot be mounted (not root, no `mount`, a container that forbids it)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    folder = tmp_path / "small-disk"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)
