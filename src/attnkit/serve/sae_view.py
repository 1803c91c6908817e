"""The explorer's SAE panel: a sparse autoencoder that `attnkit inspect RUN sae` trained and saved (`OUT/sae/`, given
as `attnkit serve RUN --sae DIR`) read on the page's text. Each token's activation at the SAE's hook point is encoded
(f = act((x - b_dec) W_enc + b_enc), `attnkit.inspect.sae`), and the panel lists each token's most active features
beside each feature's top-activating contexts on the texts it was evaluated on (`features.json`, saved with it).

The text is read as `attnkit inspect` reads it (`attnkit.inspect.command.text_batch`: an encoder's [CLS] text [SEP],
a translation run's source and target), a decoder's whole text as it is typed (refused, not cut, beyond the
context).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from attnkit.errors import InputError
from attnkit.inspect.command import Loaded, text_batch
from attnkit.inspect.points import hook_points
from attnkit.inspect.sae import load_features, load_sae
from attnkit.inspect.tracing import trace
from attnkit.serve.inspect_view import pair_line
from attnkit.tasks.reading import Frame
from attnkit.tokenize import Tokenizer
from attnkit.viz.labels import token_labels

TOP_FEATURES = 5  # features listed per token at most


class SAEView:
    """One saved SAE over the served model. Raises CheckpointError for a directory that is not an SAE (or whose
    features.json is malformed) and InputError for an SAE of a point or width this model has not."""

    def __init__(self, directory: Path, model: nn.Module, tokenizer: Tokenizer, *, family: str, max_len: int,
                 frame: Frame = "attnkit") -> None:
        device = next(model.parameters()).device
        self.sae = load_sae(directory).to(device)
        self.point = self.sae.config.hook_name
        if self.point not in hook_points(model):
            raise InputError(f"--sae {directory} was trained at {self.point or 'no named point'}, which this run has "
                             "not: give the SAE that attnkit inspect wrote for this run (OUT/sae)")
        self.features = {f.index: f for f in load_features(directory, self.sae.config.d_sae)}
        self.loaded = Loaded(model, tokenizer, family, max_len, device, frame=frame)  # framed as the run's text

    def read(self, text: str, target: str | None = None) -> dict:
        """Each token of `text` (a translation run's source; `target`, its translation, None: the model's own) with
        its top features, and those features' saved contexts. Raises InputError for a text the model cannot read or
        an activation of another width than the SAE's."""
        if not text.strip():
            raise InputError("the Text box is empty: type a text")
        ids, activations = self._activations(text, target)  # (T,), (T, C)
        if activations.shape[-1] != self.sae.config.d_in:
            raise InputError(f"{self.point} is {activations.shape[-1]} wide in this model; the SAE reads "
                             f"{self.sae.config.d_in}: give the SAE that attnkit inspect wrote for this run")
        with torch.no_grad():
            found = self.sae.encode(activations.float())  # (T, F)
        top = found.topk(min(TOP_FEATURES, found.shape[-1]), dim=-1)  # (T, k) each
        per_token = [[{"feature": i, "activation": round(v, 4)} for v, i in zip(values, indices, strict=True) if v > 0]
                     for values, indices in zip(top.values.tolist(), top.indices.tolist(), strict=True)]
        shown = sorted({entry["feature"] for row in per_token for entry in row} & self.features.keys())
        return {"point": self.point, "architecture": self.sae.config.architecture, "d_sae": self.sae.config.d_sae,
                "tokens": token_labels(self.loaded.tokenizer, ids), "per_token": per_token,
                "features": {str(i): {"frequency": self.features[i].frequency,
                                      "top": [[round(v, 4), c] for v, c in self.features[i].top]} for i in shown},
                "contexts_saved": bool(self.features)}

    def _activations(self, text: str, target: str | None) -> tuple[list[int], torch.Tensor]:
        """The ids the point reads and its activations there, (T, C), for batch row 0."""
        loaded = self.loaded
        if loaded.causal:  # the whole text, as typed: a prompt, as attnkit inspect's logit lens reads one
            ids = text_batch(loaded, text, prompt=True).args[0]  # (1, T); InputError beyond the context, never cut
            return ids[0].tolist(), trace(loaded.model, ids, names=[self.point])[self.point][0]
        batch = text_batch(loaded, pair_line(text, target) if loaded.translates else text)
        read = batch.args[-1] if self.point.startswith("decoder.") else batch.args[0]  # (1, T): the ids it reads
        return read[0].tolist(), batch.run(loaded.model, names=[self.point])[self.point][0]
