"""The decoder's teacher-forced pass: shapes, masking, and agreement with a plain step-by-step loop."""

import torch

from captioning.models.decoder import DecoderConfig, ShowAttendTellDecoder
from captioning.objectives.cross_entropy import caption_log_likelihood, doubly_stochastic_penalty
from captioning.vocab import Vocabulary

PAD, BOS, EOS = Vocabulary.pad_id, Vocabulary.bos_id, Vocabulary.eos_id


def make_batch(B=4, L=6, D=10, V=15, seed=0):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(B, L, D, generator=g)
    lengths = torch.tensor([7, 3, 5, 4][:B])  # tokens incl. BOS and EOS, deliberately unsorted
    T1 = int(lengths.max())
    captions = torch.full((B, T1), PAD)
    for b, n in enumerate(lengths.tolist()):
        captions[b, 0] = BOS
        captions[b, 1 : n - 1] = torch.randint(3, V, (n - 2,), generator=g)
        captions[b, n - 1] = EOS
    return features, captions, lengths


def make_decoder(D=10, V=15, attention="soft", dropout=0.0):
    torch.manual_seed(0)
    return ShowAttendTellDecoder(
        V, D, DecoderConfig(embed_dim=8, hidden_dim=12, attention_dim=9, dropout=dropout, attention_kind=attention)
    )


def test_shapes_and_masking():
    features, captions, lengths = make_batch()
    dec = make_decoder()
    out = dec(features, captions, lengths)
    B, T = captions.size(0), captions.size(1) - 1
    assert out.mask.shape == (B, T) and out.mask.sum(1).tolist() == (lengths - 1).tolist()
    assert out.logits.shape == (int((lengths - 1).sum()), 15)
    assert out.alphas.shape == (B, T, 6)
    real = out.alphas[out.mask].sum(-1)
    torch.testing.assert_close(real, torch.ones_like(real))  # alpha_t sums to one at real steps
    assert out.alphas[~out.mask].abs().sum() == 0  # and is zero at padded steps
    assert ((out.betas > 0) & (out.betas < 1))[out.mask].all()  # one gate scalar per step


def reference_log_likelihood(dec, features, captions, lengths):
    """A plain loop: one caption at a time, one step at a time, through the generation step."""
    totals = []
    for b in range(captions.size(0)):
        state = dec.initial_state(features[b : b + 1])
        total = 0.0
        for t in range(int(lengths[b]) - 1):
            logp, state, _ = dec.step(captions[b : b + 1, t], state)
            total = total + logp[0, captions[b, t + 1]]
        totals.append(total)
    return torch.stack(totals)


def test_fast_pass_equals_step_by_step_reference_in_value_and_gradient():
    features, captions, lengths = make_batch()
    dec = make_decoder()
    out = dec(features, captions, lengths)
    fast = caption_log_likelihood(out.logits, captions[:, 1:], out.mask)
    fast_grads = torch.autograd.grad(fast.sum(), list(dec.parameters()), allow_unused=True)
    slow = reference_log_likelihood(dec, features, captions, lengths)
    slow_grads = torch.autograd.grad(slow.sum(), list(dec.parameters()), allow_unused=True)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    for (name, _), gf, gs in zip(dec.named_parameters(), fast_grads, slow_grads):
        if gf is None or gs is None:
            assert gf is None and gs is None, name
            continue
        torch.testing.assert_close(gf, gs, rtol=1e-4, atol=1e-5, msg=name)


def test_padding_does_not_change_results():
    features, captions, lengths = make_batch()
    dec = make_decoder()
    out = dec(features, captions, lengths)
    padded = torch.cat([captions, torch.full((captions.size(0), 3), PAD)], 1)
    out2 = dec(features, padded, lengths)
    torch.testing.assert_close(out.logits, out2.logits)


def test_doubly_stochastic_penalty_by_hand():
    # Two images, three steps, two locations; image 1 has only two real steps.
    alphas = torch.tensor(
        [
            [[0.5, 0.5], [0.2, 0.8], [1.0, 0.0]],
            [[0.3, 0.7], [0.6, 0.4], [0.9, 0.1]],
        ]
    )
    mask = torch.tensor([[True, True, True], [True, True, False]])
    # image 0: coverage (1.7, 1.3): (1-1.7)^2 + (1-1.3)^2 = 0.49 + 0.09 = 0.58
    # image 1: coverage (0.9, 1.1) (the padded step is ignored): 0.01 + 0.01 = 0.02
    torch.testing.assert_close(doubly_stochastic_penalty(alphas, mask), torch.tensor([0.58, 0.02]))


def test_hard_attention_sampling_pass():
    features, captions, lengths = make_batch()
    dec = make_decoder(attention="hard")
    use_expected = torch.tensor([False, True, False, False])
    out = dec(features, captions, lengths, mode="sample", use_expected=use_expected)
    assert out.location_log_probs.shape == out.mask.shape
    assert (out.location_log_probs[1] == 0).all()  # the row using the expected context samples nothing
    assert (out.location_log_probs[0][out.mask[0]] < 0).all()
    assert (out.entropies[out.mask] > 0).all() and (out.entropies[~out.mask] == 0).all()
    assert ((out.locations >= 0) & (out.locations < features.size(1))).all()


def test_parameter_names_are_the_checkpoints_keys():
    """The cells hold the decoder's layers and own none: the state_dict keys are those every
    checkpoint has (the paper's model and the Luong / local / multi-head variant)."""
    paper = ShowAttendTellDecoder(20, 16, DecoderConfig(8, 12, 10))
    assert list(paper.state_dict()) == [
        "embedding.weight",
        "init_state.weight",
        "init_state.bias",
        "f_att.feature_proj.weight",
        "f_att.feature_proj.bias",
        "f_att.score.weight",
        "f_att.score.bias",
        "from_hidden.weight",
        "from_hidden.bias",
        "embed_gates.weight",
        "context_gates.weight",
        "out_hidden.weight",
        "out_hidden.bias",
        "out_context.weight",
        "out_context.bias",
        "out_logits.weight",
        "out_logits.bias",
    ]
    luong = ShowAttendTellDecoder(
        20, 16, DecoderConfig(8, 12, 10, score="scaled_dot", heads=2, placement="luong", window="local")
    )
    assert [k for k in luong.state_dict() if not k.startswith(("embedding", "init_state", "out_"))] == [
        "f_att.key_proj.weight",
        "f_att.key_proj.bias",
        "lstm.weight_ih_l0",
        "lstm.weight_hh_l0",
        "lstm.bias_ih_l0",
        "lstm.bias_hh_l0",
        "from_output.weight",
        "from_output.bias",
        "combine.weight",
        "combine.bias",
        "local_centre.v_p.weight",
        "local_centre.v_p.bias",
        "head_proj.weight",
    ]
