"""The loss plot's averaged training curve: each mean drawn at the middle of the steps it averages, so it follows a
falling loss instead of trailing above it."""

import numpy as np

from attnkit.train.plots import moving_average


def test_the_averaged_training_loss_lies_on_a_straight_falling_loss():
    steps = np.arange(1, 101) * 10  # logged every 10 steps
    losses = 5.0 - 0.001 * steps
    at, mean = moving_average(steps, losses, 25)
    np.testing.assert_allclose(mean, 5.0 - 0.001 * at, atol=1e-12)  # on the line, not half a window behind it
    assert at[-1] == np.mean(steps[-25:]) and at[0] == steps[0]


def test_the_average_is_the_mean_of_the_last_window_of_losses():
    rng = np.random.default_rng(0)
    losses = rng.normal(3.0, 0.5, 40)
    _, mean = moving_average(np.arange(40), losses, 7)
    assert np.isclose(mean[-1], np.mean(losses[-7:]))
    np.testing.assert_allclose(mean[:7], np.cumsum(losses[:7]) / np.arange(1, 8))
