"""Tiny runs to serve, and a server on 127.0.0.1 on a free port, started and stopped around a test module."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

TEXT_CHARS = "abcdefghijklmnopqrstuvwxyz .,:!?\n"
BPE_TEXT = "the cat sat on the mat. a dog ran to the park, and the cat saw it!\n"


def tiny_run(root: Path, family: str = "decoder", *, sharpen: float = 1.0, tokenizer: str = "char", **changes
             ) -> Path:
    """A random tiny run of `family` with a char tokenizer (and BOS/EOS), or a byte-level BPE of 300 tokens trained
    on a short text (`tokenizer="bpe"`: as real runs tokenize, in Rust), under root/family. `sharpen` multiplies the
    query and key projections, so that the heads' attention is peaked and differs from head to head (a random
    model's is nearly uniform)."""
    import torch

    from attnkit import build_model
    from attnkit.checkpoint import record_checksums, save_model
    from attnkit.config import ModelConfig
    from attnkit.tokenize import CharTokenizer, train_bpe

    if tokenizer == "bpe":
        specials = {role: f"<{role}>" for role in ("pad", "unk", "bos", "eos")}
        tokenizer = train_bpe([BPE_TEXT * 50], vocab_size=300, special_tokens=specials)
    else:
        tokenizer = CharTokenizer(TEXT_CHARS)
    torch.manual_seed(0)
    sizes = {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "max_seq_len": 96} | changes
    config = ModelConfig(family=family, vocab_size=tokenizer.vocab_size, **sizes)
    directory = root / family
    model = build_model(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                parameter.mul_(sharpen)
    save_model(model, config, directory)
    tokenizer.save(directory / "tokenizer")
    record_checksums(directory)  # the tokenizer's too, as a trained run's: loading it warns of nothing unverified
    return directory


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_up(server, url: str, bound: float) -> None:
    """Wait for the `attnkit serve` process `server` (a subprocess.Popen) to answer /health at `url`, within `bound`
    seconds; fails where it exits or does not answer in time."""
    import httpx

    deadline = time.monotonic() + bound
    while True:
        try:
            httpx.get(f"{url}/health", timeout=1)
            return
        except httpx.TransportError:
            assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)


@contextmanager
def running_server(run: Path, **settings):
    """Serve `run` on 127.0.0.1 on a free port in a thread, its connections as `attnkit serve` keeps them (a request's
    head has --timeout to arrive, `serve.server.head_deadline`); yields (base URL, app); stops the server after."""
    import uvicorn

    from attnkit.serve import ServeSettings, build_app
    from attnkit.serve.server import head_deadline

    port = free_port()
    served = ServeSettings(run=str(run), port=port, **settings)
    app = build_app(served)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                          http=head_deadline(served.timeout)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start within 60 s")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=30)
