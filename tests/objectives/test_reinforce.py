"""Hard attention's REINFORCE estimator (paper Eq. 12) against the exact gradient, and its baseline."""

import torch

from captioning.objectives.cross_entropy import caption_log_likelihood
from captioning.objectives.reinforce import reinforce_loss, update_baseline
from tests.helpers import exact_gradient, flat_grad, tiny_problem, z_scores


def estimates(dec, features, captions, lengths, batches=30, rows=400, lambda_r=1.0, baseline=-2.0):
    """Batch means of the estimator; each batch holds `rows` independent location samples."""
    out_list = []
    for _ in range(batches):
        out = dec(features.expand(rows, -1, -1), captions.expand(rows, -1), lengths.expand(rows), mode="sample")
        ll = caption_log_likelihood(out.logits, captions.expand(rows, -1)[:, 1:], out.mask)
        terms = reinforce_loss(
            ll,
            out.location_log_probs,
            out.entropies,
            out.mask,
            torch.tensor(baseline),
            lambda_r=lambda_r,
            lambda_e=0.0,
            reward_per_step=False,
        )
        surrogate = ll.mean() - terms.loss  # ascent direction: its gradient estimates d E[log p(y|s)]
        out_list.append(flat_grad(surrogate, list(dec.parameters())))
    return torch.stack(out_list)  # (batches, P)


def test_reinforce_matches_exact_gradient_within_standard_error():
    torch.manual_seed(1)
    dec, features, captions, lengths = tiny_problem()
    exact = exact_gradient(dec, features, captions, lengths)
    directions = torch.cat([exact.unsqueeze(0) / exact.norm(), torch.randn(3, exact.numel())])
    torch.manual_seed(2)
    z = z_scores(estimates(dec, features, captions, lengths), exact, directions)
    assert z.abs().max() < 4.0, z
    # The test can fail: without the score-function term the estimate is biased, and it sees that.
    torch.manual_seed(2)
    z_biased = z_scores(estimates(dec, features, captions, lengths, lambda_r=0.0), exact, directions)
    assert z_biased.abs().max() > 6.0, z_biased


def test_baseline_is_an_exponential_moving_average_and_reduces_variance():
    b = torch.tensor(0.0)
    rewards = [torch.tensor([-3.0, -1.0]), torch.tensor([-2.0]), torch.tensor([-4.0])]
    expected = 0.0
    for r in rewards:
        b = update_baseline(b, r, decay=0.9)
        expected = 0.9 * expected + 0.1 * r.mean().item()
        assert abs(b.item() - expected) < 1e-6
    # On a fixed batch, after the baseline has tracked the rewards, advantages vary less than rewards.
    torch.manual_seed(0)
    dec, features, captions, lengths = tiny_problem()
    rows = 256
    out = dec(features.expand(rows, -1, -1), captions.expand(rows, -1), lengths.expand(rows), mode="sample")
    ll = caption_log_likelihood(out.logits, captions.expand(rows, -1)[:, 1:], out.mask)
    b = torch.tensor(0.0)
    for _ in range(60):
        terms = reinforce_loss(ll, out.location_log_probs, out.entropies, out.mask, b)
        b = update_baseline(b, terms.reward)
    assert abs(b.item() - terms.reward.mean().item()) < 0.01 * abs(terms.reward.mean().item()) + 1e-3
    assert (terms.advantage**2).mean() < (terms.reward**2).mean() / 10


def test_baseline_lowers_the_variance_of_the_gradient_estimate():
    dec, features, captions, lengths = tiny_problem()
    rows = 512
    with torch.no_grad():
        out = dec(features.expand(rows, -1, -1), captions.expand(rows, -1), lengths.expand(rows), mode="sample")
        mean_reward = caption_log_likelihood(out.logits, captions.expand(rows, -1)[:, 1:], out.mask).mean().item()
    torch.manual_seed(5)
    plain = estimates(dec, features, captions, lengths, batches=20, rows=50, baseline=0.0)
    torch.manual_seed(5)
    with_baseline = estimates(dec, features, captions, lengths, batches=20, rows=50, baseline=mean_reward)
    assert with_baseline.var(0).sum() < plain.var(0).sum() / 2
