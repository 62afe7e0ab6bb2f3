"""Training curves: a scalar logged too few times is named with its values, not drawn; float noise
(a BLEU-4 of 1e-13 against 6e-11) is no axis."""

import numpy as np
import pytest

from captioning.viz.curves import MIN_POINTS, plot_curves, too_few_points, value_range

CURVE = (70, 130, 200)  # the colour curves are drawn in


def write_run(folder, losses: int, scores: int, score=lambda k: 1e-13 * 10**k):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    for k in range(losses):
        writer.add_scalar("train/loss", 3.0 - 0.1 * k, 10 * (k + 1))
    for k in range(scores):
        writer.add_scalar("val/BLEU-4", score(k), 10 * (k + 1))
    writer.close()
    return folder


def curve_pixels(picture) -> int:
    return int((np.asarray(picture) == CURVE).all(-1).sum())


def test_a_short_run_says_too_few_points(tmp_path):
    """A 20-step run logged one loss point and two tiny BLEU values: no curve is drawn from them."""
    picture = plot_curves(write_run(tmp_path / "short", losses=1, scores=2), tmp_path / "curves.png")
    assert curve_pixels(picture) == 0 and (tmp_path / "curves.png").is_file()
    assert too_few_points(np.array([20]), np.array([2.5])) == "too few points for a curve\n1 point: 2.5 at step 20"
    assert too_few_points(np.array([10, 20]), np.array([1.97e-13, 6.2e-11])).endswith("0 at step 10, 0 at step 20")


def test_enough_points_are_drawn(tmp_path):
    picture = plot_curves(write_run(tmp_path / "long", losses=30, scores=MIN_POINTS), tmp_path / "curves.png")
    assert curve_pixels(picture) > 100


@pytest.mark.parametrize(
    "values, expected",
    [
        ([1.97e-13, 6.2e-11, 3e-12], (-0.5, 0.5)),  # noise around 0: a unit range around 0
        ([0.25, 0.25, 0.25], (-0.25, 0.75)),
        ([0.1, 0.3, 0.2], (0.1, 0.3)),
    ],
)
def test_the_axis_ignores_float_noise(values, expected):
    assert value_range(np.array(values)) == pytest.approx(expected)
