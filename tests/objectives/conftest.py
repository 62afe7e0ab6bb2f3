"""The objectives' tests' own fixture: the hard-attention problem small enough to enumerate."""

import pytest


@pytest.fixture(scope="session")
def tiny_problem(make_decoder):
    """``tiny_problem()``: a hard-attention decoder (in train mode) of HARD_V words over HARD_L locations
    of HARD_D-wide features (tests/helpers.py), one image and a caption of two words' steps (BOS, a
    word, EOS): 3^2 = 9 location sequences. Returns (decoder, features, captions, lengths)."""
    import torch

    from captioning.vocab import Vocabulary
    from tests.helpers import HARD_D, HARD_L, HARD_V

    def make():
        dec = make_decoder(
            dtype=torch.float32,
            vocab_size=HARD_V,
            feature_dim=HARD_D,
            embed_dim=4,
            hidden_dim=6,
            attention_dim=4,
            attention_kind="hard",
        ).train()
        features = torch.randn(1, HARD_L, HARD_D) * 2
        captions = torch.tensor([[Vocabulary.bos_id, 4, Vocabulary.eos_id]])
        return dec, features, captions, torch.tensor([3])

    return make
