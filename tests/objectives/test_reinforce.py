"""Hard attention's REINFORCE estimator (paper Eq. 12) against the exact gradient, and its baseline."""

import pytest
import torch

from captioning.objectives.cross_entropy import caption_log_likelihood
from captioning.objectives.reinforce import reinforce_loss, update_baseline
from tests.helpers import exact_gradient, flat_grad, z_scores


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


def test_reinforce_matches_exact_gradient_within_standard_error(tiny_problem):
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


def test_baseline_is_an_exponential_moving_average_and_reduces_variance(tiny_problem):
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


def test_baseline_lowers_the_variance_of_the_gradient_estimate(tiny_problem):
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


# ---------------------------------------------------------------------- label smoothing on the likelihood term
class _FixedPass(torch.nn.Module):
    """A stand-in decoder whose teacher-forced pass is fixed: word probabilities ``probs`` (T, V) at
    the T steps of one caption, and attention scores ``theta`` (T, L) (zeros: uniform alpha) from
    which the cells ``cells`` (T,) are "sampled"."""

    def __init__(self, probs, cells, L=4):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.tensor(probs, dtype=torch.float64).log())
        self.theta = torch.nn.Parameter(torch.zeros(len(cells), L, dtype=torch.float64))
        self.cells = torch.tensor([cells])

    def forward(self, features, captions, lengths, mode=None, use_expected=None, static=False, **_):
        from captioning.models.decoder import DecoderOutput

        T = self.logits.size(0)
        log_alpha = torch.log_softmax(self.theta, -1).unsqueeze(0)  # (1, T, L)
        sampled = ~use_expected.view(-1, 1)  # the location term only where the caption sampled
        return DecoderOutput(
            logits=self.logits,
            mask=torch.ones(1, T, dtype=torch.bool),
            alphas=log_alpha.exp(),
            betas=torch.ones(1, T, dtype=torch.float64),
            locations=self.cells,
            location_log_probs=log_alpha.gather(2, self.cells.unsqueeze(2)).squeeze(2) * sampled,
            entropies=-(log_alpha.exp() * log_alpha).sum(2),
        )


def _fixed_step(label_smoothing=None, lambda_r=0.5):
    """One step of HardAttentionReinforce on the fixed pass: caption BOS, word 0, word 1 (V = 3), every
    caption sampling its locations (p = 0), no penalty or entropy bonus."""
    from captioning.objectives.reinforce import HardAttentionReinforce

    model = _FixedPass(probs=[[0.5, 0.25, 0.25], [0.2, 0.6, 0.2]], cells=[0, 2])
    extra = {} if label_smoothing is None else {"label_smoothing": label_smoothing}
    objective = HardAttentionReinforce(
        doubly_stochastic=0.0, lambda_r=lambda_r, lambda_e=0.0, semi_sampling_p=0.0, semi_sampling_per="image", **extra
    )
    batch = {"captions": torch.tensor([[1, 0, 1]]), "lengths": torch.tensor([3])}
    out = objective(model, torch.zeros(1, 4, 2, dtype=torch.float64), batch)
    out.loss.backward()
    objective.commit(out)
    return objective, out, model


def test_label_smoothing_smooths_the_likelihood_term_and_not_the_reward():
    """A case computed by hand: T = 2 steps, V = 3 words, L = 4 cells, epsilon 0.1, lambda_r 0.5."""
    import math

    eps, lambda_r = 0.1, 0.5
    objective, out, model = _fixed_step(eps, lambda_r)
    log_py = math.log(0.5) + math.log(0.6)  # log p(y | s, a): the caption's words 0 then 1
    uniform = -(math.log(0.5) + 2 * math.log(0.25)) / 3 - (2 * math.log(0.2) + math.log(0.6)) / 3
    reward = log_py / 2  # the plain log-likelihood per step; the baseline starts at 0
    log_ps = 2 * math.log(0.25)  # two cells drawn from uniform alpha over 4
    expected = -((1 - eps) * log_py - eps * uniform) - lambda_r * reward * log_ps
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)
    assert out.logs["reward"].item() == pytest.approx(reward, abs=1e-12)  # not the smoothed one
    assert objective.baseline.item() == pytest.approx(0.1 * reward, abs=1e-7)  # b = 0.9 * 0 + 0.1 * R (float32)
    # d loss / d logits = p - the smoothed target (1 - eps on the word, eps / V on each): the reward carries no gradient
    probs = torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.6, 0.2]], dtype=torch.float64)
    target = torch.full((2, 3), eps / 3, dtype=torch.float64)
    target[0, 0] += 1 - eps
    target[1, 1] += 1 - eps
    assert torch.allclose(model.logits.grad, probs - target, atol=1e-12)
    # d loss / d theta_t = -lambda_r * R * (onehot(s_t) - alpha_t): the location term, unchanged by smoothing
    onehot = torch.zeros(2, 4, dtype=torch.float64)
    onehot[0, 0] = onehot[1, 2] = 1
    assert torch.allclose(model.theta.grad, -lambda_r * reward * (onehot - 0.25), atol=1e-12)


def test_label_smoothing_zero_is_the_paper_objective_bit_for_bit(tiny_problem):
    """epsilon 0 (given or left out) gives the loss, reward and gradients of the plain likelihood
    term, the same bits; and epsilon 0.1 changes the loss but neither the reward nor the location term."""
    import math

    runs = [_fixed_step(eps) for eps in (None, 0.0, 0.1)]
    (_, plain, m0), (_, zero, m1), (_, smooth, m2) = runs
    assert torch.equal(plain.loss, zero.loss) and torch.equal(plain.logs["reward"], zero.logs["reward"])
    assert torch.equal(m0.logits.grad, m1.logits.grad) and torch.equal(m0.theta.grad, m1.theta.grad)
    log_py = math.log(0.5) + math.log(0.6)
    assert plain.loss.item() == pytest.approx(-log_py - 0.5 * (log_py / 2) * 2 * math.log(0.25), abs=1e-12)
    assert not torch.equal(smooth.loss, plain.loss)
    assert torch.equal(smooth.logs["reward"], plain.logs["reward"]) and torch.equal(m2.theta.grad, m0.theta.grad)
    # on a real decoder too: the same draws give the same bits with epsilon left out or 0
    from captioning.objectives.reinforce import HardAttentionReinforce

    dec, features, captions, lengths = tiny_problem()
    batch = {"captions": captions.expand(8, -1), "lengths": lengths.expand(8)}
    grads = []
    for extra in ({}, {"label_smoothing": 0.0}):
        objective = HardAttentionReinforce(semi_sampling_per="image", **extra)
        dec.zero_grad()
        torch.manual_seed(3)
        out = objective(dec, features.expand(8, -1, -1), batch)
        out.loss.backward()
        grads.append((out.loss.detach(), [p.grad.clone() for p in dec.parameters()]))
    assert torch.equal(grads[0][0], grads[1][0])
    assert all(torch.equal(a, b) for a, b in zip(grads[0][1], grads[1][1]))


def test_label_smoothing_out_of_range_is_a_config_error():
    from captioning.errors import ConfigError
    from captioning.objectives.reinforce import HardAttentionReinforce

    with pytest.raises(ConfigError, match="label_smoothing: expected a number in"):
        HardAttentionReinforce(label_smoothing=1.0)
