"""attnkit's sparse autoencoders against SAELens where both reach, on the same weights and activations: an SAE attnkit
saves is read by SAELens's `SAE.load_from_disk` and encodes, decodes and rebuilds as attnkit's does (standard and
TopK); the first training step's loss is SAELens's `training_forward_pass` loss terms (MSE, the L1 penalty, TopK's
AuxK) in attnkit's scale-free units; L0, the dead features and the explained variance (normalised MSE) are those
SAELens's features and `evals.ExplainedVarianceCalculator` give; and on a tiny GPT-2 trained to count, loaded by
attnkit and by TransformerLens's bridge, the losses clean, with the SAE spliced in and zero-ablated, and the loss
recovered, are SAELens's `get_downstream_reconstruction_metrics` (its `ce_loss_score`) on the same tokens. Skipped
where SAELens is not installed (it needs transformer-lens < 4 and wandb among others, which attnkit does not; to run
it, install it beside the environment: `pip install --target /tmp/saepkgs sae-lens` and `PYTHONPATH=/tmp/saepkgs`).

What differs by design is in docs/user-guide/inspect.md ("Against SAELens")."""

import math

import pytest
import torch

sae_lens = pytest.importorskip("sae_lens", reason=(
    "SAELens is not installed (pip install sae-lens; it brings transformer-lens < 4, wandb and other packages attnkit "
    "does not need, so it is not among attnkit's extras)"))

from sae_lens.evals import ExplainedVarianceCalculator, get_downstream_reconstruction_metrics  # noqa: E402
from sae_lens.saes.sae import TrainStepInput  # noqa: E402
from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig  # noqa: E402
from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig  # noqa: E402
from sae_lens.training.activation_scaler import ActivationScaler  # noqa: E402
from transformer_lens_pairs import lens_pair  # noqa: E402

import attnkit.inspect.sae as sae_module  # noqa: E402
from attnkit.inspect import lm_batch  # noqa: E402
from attnkit.inspect.sae import (  # noqa: E402
    SAEConfig,
    SparseAutoencoder,
    evaluate,
    point_activations,
    save_sae,
    spliced_loss,
    train_sae,
)

D_IN, D_SAE, K = 16, 64, 4
WEIGHTS = ("W_enc", "b_enc", "W_dec", "b_dec")


def activations(seed: int = 0, n: int = 256) -> torch.Tensor:
    """(N, C): sparse sums of a few fixed directions, off-centre, with noise: what an SAE is for."""
    generator = torch.Generator().manual_seed(seed)
    directions = torch.randn(32, D_IN, generator=generator)
    codes = torch.rand(n, 32, generator=generator) * (torch.rand(n, 32, generator=generator) < 0.1)
    return codes @ directions + 0.5 + 0.05 * torch.randn(n, D_IN, generator=generator)


def attnkit_sae(architecture: str, seed: int = 0) -> SparseAutoencoder:
    """An SAE with every parameter moved off its start (biases too, so that each one matters), decoder rows unit."""
    config = SAEConfig(D_IN, D_SAE, architecture, K if architecture == "topk" else None,
                       hook_name="blocks.0.resid_post")
    sae = SparseAutoencoder(config, generator=torch.Generator().manual_seed(seed))
    generator = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        for name in WEIGHTS:
            getattr(sae, name).add_(0.3 * torch.randn(getattr(sae, name).shape, generator=generator))
        sae.normalise_decoder()
    return sae.eval()


def lens_sae(sae: SparseAutoencoder, *, aux_weight: float = 0.0):
    """SAELens's training SAE of the same architecture and weights (decoder norms not folded into the activations)."""
    if sae.config.architecture == "standard":
        lens = StandardTrainingSAE(StandardTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, apply_b_dec_to_input=True))
    else:
        lens = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, k=K, apply_b_dec_to_input=True,
                                                     aux_loss_coefficient=aux_weight,
                                                     rescale_acts_by_decoder_norm=False))
    with torch.no_grad():
        for name in WEIGHTS:
            getattr(lens, name).copy_(getattr(sae, name))
    return lens.eval()


def step_input(x: torch.Tensor, l1: float, dead: torch.Tensor | None = None) -> TrainStepInput:
    return TrainStepInput(sae_in=x, coefficients={"l1": l1}, dead_neuron_mask=dead, n_training_steps=0,
                          is_logging_step=False)


@pytest.mark.parametrize("architecture", ["standard", "topk"])
def test_an_sae_attnkit_saves_is_read_by_sae_lens_and_encodes_and_decodes_the_same(architecture, tmp_path):
    sae = attnkit_sae(architecture)
    x = activations()
    lens = sae_lens.SAE.load_from_disk(str(save_sae(sae, tmp_path / "sae")))
    assert lens.cfg.d_in == D_IN and lens.cfg.d_sae == D_SAE and lens.cfg.architecture() == architecture
    with torch.no_grad():  # the same float32 operations in the same order: equal to the bit, as the guide records
        features = sae.encode(x)  # (N, F)
        torch.testing.assert_close(lens.encode(x), features, rtol=0, atol=0)
        torch.testing.assert_close(lens.decode(features), sae.decode(features), rtol=0, atol=0)
        torch.testing.assert_close(lens(x), sae(x), rtol=0, atol=0)
    assert 0 < float((features > 0).float().sum(-1).mean()) <= (K if architecture == "topk" else D_SAE)


def test_the_standard_loss_is_sae_lens_mse_and_l1_terms_in_units_of_the_activations_variance():
    """attnkit's first step scores the SAE it starts from: ||x - x^||^2 / var + l1 * sum|f| / sqrt(var), with var the
    batch's sum ||x - mean||^2 / N; SAELens's terms are ||x - x^||^2 and its coefficient times sum|f| ||W_dec row||
    (rows of norm 1 here), so with the coefficient l1 / sqrt(var) the two losses are one number."""
    x, l1, seed = activations(1), 0.3, 3
    config = SAEConfig(D_IN, D_SAE, "standard", l1_coefficient=l1)
    losses = train_sae(config, lambda: [x], steps=1, seed=seed)[1]
    start = SparseAutoencoder(config, generator=torch.Generator().manual_seed(seed))  # the SAE the step scored
    with torch.no_grad():
        start.b_dec.copy_(x.mean(0))
    variance = float((x - x.mean(0)).pow(2).sum(-1).mean())
    with torch.no_grad():
        out = lens_sae(start).training_forward_pass(step_input(x, l1 / math.sqrt(variance)))
    assert set(out.losses) == {"mse_loss", "l1_loss"}
    expected = float(out.losses["mse_loss"]) / variance + float(out.losses["l1_loss"])
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    assert float(out.losses["l1_loss"]) > 0.05 * expected  # the L1 term is a real share of the loss


def test_the_topk_loss_with_every_feature_dead_is_sae_lens_mse_and_auxk_terms(monkeypatch):
    """With every feature counted dead (DEAD_AFTER below 0), AuxK's top d_in / 2 dead features rebuild the residual
    in both (SAELens scales its term by min(dead / k_aux, 1), which is 1 here); attnkit's loss is SAELens's total
    over the variance. Both take the top pre-activations as they are only where they are positive: attnkit passes
    them through a ReLU, SAELens does not, so the inputs are checked to be such."""
    monkeypatch.setattr(sae_module, "DEAD_AFTER", -1)
    x, seed = activations(2), 4
    config = SAEConfig(D_IN, D_SAE, "topk", K)
    losses = train_sae(config, lambda: [x], steps=1, seed=seed)[1]
    start = SparseAutoencoder(config, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        start.b_dec.copy_(x.mean(0))
        pre = start.pre_activation(x)  # (N, F)
    assert bool((pre.topk(D_IN // 2, dim=-1).values > 0).all()), "the comparison needs positive top pre-activations"
    variance = float((x - x.mean(0)).pow(2).sum(-1).mean())
    lens = lens_sae(start, aux_weight=sae_module.AUX_K_WEIGHT)
    with torch.no_grad():
        out = lens.training_forward_pass(step_input(x, 0.0, dead=torch.ones(D_SAE, dtype=torch.bool)))
    aux = float(out.losses["auxiliary_reconstruction_loss"])
    assert aux > 0.01 * float(out.losses["mse_loss"])  # AuxK is a real share of the loss
    assert losses[0] == pytest.approx(float(out.loss) / variance, rel=1e-5)


@pytest.mark.parametrize("architecture", ["standard", "topk"])
def test_l0_dead_features_and_explained_variance_are_those_of_sae_lens_features_and_calculator(architecture):
    """L0 counts SAELens's nonzero features per activation, the dead features those it never fires on, and the
    explained variance (1 - normalised MSE) is its ExplainedVarianceCalculator's over the same batches."""
    sae = attnkit_sae(architecture, seed=5)
    with torch.no_grad():
        sae.b_enc[:6] = -1e3  # six features that can never fire
    lens = lens_sae(sae)
    batches = [activations(6), activations(7, n=100)]
    metrics = evaluate(sae, batches)
    calculator, fired, nonzero, count = ExplainedVarianceCalculator(), torch.zeros(D_SAE, dtype=torch.bool), 0.0, 0
    with torch.no_grad():
        for x in batches:
            features = lens.encode(x)
            calculator.add_batch(lens.decode(features), x)
            fired |= (features != 0).any(0)
            nonzero += float((features != 0).sum())
            count += x.shape[0]
    dead = int((~fired).sum())
    assert dead >= 6 and metrics.dead_share == pytest.approx(dead / D_SAE)
    assert metrics.l0 == pytest.approx(nonzero / count)
    # SAELens sums the squared errors in float32, attnkit in float64: equal to float32's precision
    assert metrics.explained_variance == pytest.approx(calculator.compute(), rel=1e-6)
    assert metrics.normalised_mse == pytest.approx(1 - calculator.compute(), rel=1e-6)


CYCLE, LENGTH = 24, 16  # the counting task: token t + 1 follows token t, over ids 4 .. 27


def counting(generator: torch.Generator, rows: int) -> torch.Tensor:
    """(rows, LENGTH) ids counting up from random starts, wrapping after CYCLE."""
    starts = torch.randint(CYCLE, (rows, 1), generator=generator)
    return 4 + (starts + torch.arange(LENGTH)) % CYCLE


def train_to_count(model: torch.nn.Module) -> None:
    """60 Adam steps on the counting task, so that the residual stream carries what the next token needs."""
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torch.enable_grad():
        for _ in range(60):
            ids = counting(generator, 16)
            loss = model(ids, labels=ids).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


@pytest.fixture(scope="module")
def counting_pair(tmp_path_factory):
    return lens_pair("gpt2", tmp_path_factory.mktemp("gpt2"), prepare=train_to_count)


class Tokens:
    """The one part of SAELens's ActivationsStore its evaluation reads: the next batch of token ids."""

    def __init__(self, batches: list[torch.Tensor]) -> None:
        self.batches = iter(batches)

    def get_batch_tokens(self, rows: int) -> torch.Tensor:
        batch = next(self.batches)
        assert batch.shape[0] == rows
        return batch


@pytest.mark.parametrize("architecture", ["standard", "topk"])
def test_the_spliced_loss_and_loss_recovered_are_sae_lens_evaluation(architecture, counting_pair, tmp_path):
    """An SAE attnkit trained on block 0's output, spliced in by each library on the same tokens: the clean, spliced
    and zero-ablated losses and the share recovered are SAELens's `ce_loss_without_sae`, `ce_loss_with_sae`,
    `ce_loss_with_ablation` and `ce_loss_score` (every next-token loss of the rows, averaged over all batches)."""
    model, bridge = counting_pair
    generator = torch.Generator().manual_seed(1)
    train_ids, held_out = counting(generator, 64), [counting(generator, 4) for _ in range(3)]
    point = "blocks.0.resid_post"
    train = [lm_batch(ids) for ids in train_ids.split(16)]
    config = SAEConfig(32, 64, architecture, K if architecture == "topk" else None, l1_coefficient=0.05,
                       hook_name=point)
    sae = train_sae(config, lambda: point_activations(model, train, point), steps=60, lr=1e-2)[0].eval()
    batches = [lm_batch(ids) for ids in held_out]
    evaluation = torch.cat(list(point_activations(model, batches, point)))
    reference = torch.cat(list(point_activations(model, train, point)))
    ours = spliced_loss(model, sae, batches, evaluate(sae, [evaluation]), reference)

    lens = sae_lens.SAE.load_from_disk(str(save_sae(sae, tmp_path / "sae")))
    lens.cfg.metadata.hook_name = "blocks.0.hook_resid_post"  # TransformerLens's name for the same point
    theirs = get_downstream_reconstruction_metrics(
        lens, bridge, Tokens(held_out), ActivationScaler(), compute_kl=False, compute_ce_loss=True, n_batches=3,
        eval_batch_size_prompts=4)
    assert ours.clean_loss < 0.5 * ours.zero_ablated_loss  # the model counts, and needs the point to
    assert ours.clean_loss < ours.spliced_loss < ours.zero_ablated_loss  # the SAE loses some, not all
    # here the mean costs more than 0 does (6.55 against 5.54 nats), where test_inspect_sae.py's decoder is the other
    # way round: neither share of loss recovered is bound to read higher (docs/user-guide/inspect.md)
    assert ours.ablated_loss > ours.zero_ablated_loss
    assert ours.clean_loss == pytest.approx(theirs["ce_loss_without_sae"], rel=1e-5)
    assert ours.spliced_loss == pytest.approx(theirs["ce_loss_with_sae"], rel=1e-5)
    assert ours.zero_ablated_loss == pytest.approx(theirs["ce_loss_with_ablation"], rel=1e-5)
    assert ours.loss_recovered_zero == pytest.approx(theirs["ce_loss_score"], rel=1e-4)
    assert 0 < ours.loss_recovered_zero < 1
