"""The components the LightningModule wires: configs, objectives, the seed of a step, the
parameter groups, grouped captions."""

import pytest
import torch

from captioning.decoding.search import GenerationConfig
from captioning.errors import ConfigError
from captioning.models.decoder import DecoderConfig
from captioning.models.encoders import EncoderConfig
from captioning.models.show_attend_tell import ShowAttendTell
from captioning.objectives import CrossEntropy, HardAttentionReinforce, objective_for, objective_from_spec
from captioning.training.guards import step_seed
from captioning.training.module import CaptioningModule
from captioning.training.optim import OptimizerConfig
from captioning.vocab import Vocabulary

VOCAB = Vocabulary.build([["a", "small", "red", "circle", "left", "of", "square"]], min_freq=1)


def caption_batch(make_batch, B: int) -> dict:
    """B captions of 5 tokens (BOS, 3 words of VOCAB, EOS)."""
    _, captions, lengths = make_batch(B=B, V=len(VOCAB), lengths=[5] * B)
    return {"captions": captions, "lengths": lengths}


def test_generation_config_checks_its_values():
    assert GenerationConfig().num_beams == 1  # Hugging Face's default: greedy
    for bad in (
        dict(num_beams=0),
        dict(max_new_tokens=-1),
        dict(temperature=0.0),
        dict(top_k=-2),
        dict(attention_mode="peek"),
        dict(do_sample=True, num_beams=3),
        dict(num_beams=2, num_return_sequences=3),
    ):
        with pytest.raises(ConfigError):
            GenerationConfig(**bad)
    base = GenerationConfig(num_beams=3, max_new_tokens=9)
    assert base.replace(num_beams=None, length_penalty=0.5) == GenerationConfig(
        num_beams=3, max_new_tokens=9, length_penalty=0.5
    )


def test_beam_search_returns_the_best_beams_in_order(tiny_model):
    model = tiny_model(hidden_dim=8).eval()
    images = torch.rand(3, 3, 32, 32)
    out = model.generate(images=images, config=GenerationConfig(num_beams=4, num_return_sequences=3, max_new_tokens=6))
    assert out.beam_sequences.shape[:2] == (3, 3) and out.beam_scores.shape == (3, 3)
    assert (out.beam_scores[:, :-1] >= out.beam_scores[:, 1:]).all()  # best first
    assert torch.equal(out.beam_sequences[:, 0], out.sequences) and torch.equal(out.beam_scores[:, 0], out.scores)
    single = model.generate(images=images, config=GenerationConfig(num_beams=4, max_new_tokens=6))
    assert torch.equal(single.sequences, out.sequences) and single.beam_sequences is None


def test_objective_must_train_the_decoders_attention_kind():
    assert isinstance(objective_for("soft"), CrossEntropy) and isinstance(objective_for("hard"), HardAttentionReinforce)
    with pytest.raises(ConfigError, match="does not train hard attention"):
        objective_for("hard", CrossEntropy())
    with pytest.raises(ConfigError, match="does not train soft attention"):
        CaptioningModule(decoder=DecoderConfig(attention_kind="soft"), objective=HardAttentionReinforce())
    spec = HardAttentionReinforce(lambda_r=0.3, num_samples=2).spec()
    rebuilt = objective_from_spec(spec)
    assert isinstance(rebuilt, HardAttentionReinforce) and rebuilt.lambda_r == 0.3 and rebuilt.num_samples == 2
    with pytest.raises(ConfigError, match="unknown objective"):
        objective_from_spec({"class_path": "builtins.eval", "init_args": {}})


def test_step_seed_differs_per_rank_and_step_and_repeats():
    seeds = {(step, rank): step_seed(7, step, rank) for step in range(50) for rank in range(4)}
    assert len(set(seeds.values())) == len(seeds)  # every (step, rank) its own stream
    assert step_seed(7, 12, 1) == seeds[(12, 1)] and step_seed(8, 12, 1) != seeds[(12, 1)]
    assert all(0 <= s < 2**63 for s in seeds.values())


def test_grouped_captions_take_their_images_features(tiny_model):
    model = tiny_model(hidden_dim=8)
    features = torch.randn(2, 16, 8)
    batch = {"features": features.half(), "image_index": torch.tensor([0, 0, 1, 0, 1])}
    rows = model.features(batch)
    assert rows.shape == (5, 16, 8) and rows.dtype == torch.float32
    for row, image in enumerate([0, 0, 1, 0, 1]):
        torch.testing.assert_close(rows[row], features[image].half().float())


def forwarded_batches(objective, model, batch, monkeypatch):
    """Run ``objective`` and return the keyword arguments and rows the decoder was called with."""
    calls = []
    forward = ShowAttendTell.forward

    def spy(self, features, captions, lengths, **kwargs):
        calls.append(dict(kwargs, rows=captions.size(0), captions=captions, features=features))
        return forward(self, features, captions, lengths, **kwargs)

    monkeypatch.setattr(ShowAttendTell, "forward", spy)
    out = objective(model, torch.randn(batch["captions"].size(0), 16, 8), batch)
    return calls[0], out


@pytest.mark.parametrize("per", ["batch", "image"])
def test_semi_sampling_draws_per_batch_or_per_image(per, monkeypatch, tiny_model, make_batch):
    model, batch = tiny_model("hard", hidden_dim=8), caption_batch(make_batch, B=64)
    torch.manual_seed(1)
    mixed = 0
    for _ in range(6):
        call, _ = forwarded_batches(
            HardAttentionReinforce(semi_sampling_p=0.5, semi_sampling_per=per), model, batch, monkeypatch
        )
        use = call["use_expected"]
        assert call["mode"] == "sample" and use.shape == (64,)
        mixed += int(use.any() and not use.all())
    if per == "batch":
        assert mixed == 0  # the whole batch takes the expected context, or none of it does
    else:
        assert mixed == 6  # 64 coins per batch: some of each


def test_several_location_samples_per_caption(monkeypatch, tiny_model, make_batch):
    model, batch = tiny_model("hard", hidden_dim=8), caption_batch(make_batch, B=3)
    call, out = forwarded_batches(HardAttentionReinforce(num_samples=4, semi_sampling_p=0.0), model, batch, monkeypatch)
    assert call["rows"] == 12 and out.batch_size == 12 and out.state["reward"].shape == (12,)
    assert torch.equal(call["captions"], batch["captions"].repeat_interleave(4, 0))  # each caption's samples together
    assert not call["use_expected"].any()


def test_pretrained_encoder_blocks_train_at_their_own_learning_rate():
    module = CaptioningModule(
        encoder=EncoderConfig("resnet50", pretrained=False, grid_size=2, fine_tune_blocks=1),
        decoder=DecoderConfig(8, 8, 8),
        optimizer=OptimizerConfig(lr=1e-3, encoder_lr=1e-5),
    )
    module.set_vocab(VOCAB)
    module.trainer = type("T", (), {"precision": "32-true"})()  # what configure_optimizers reads
    groups = module.configure_optimizers().param_groups
    assert [g["lr"] for g in groups] == [1e-3, 1e-5]
    encoder_params = {id(p) for p in module.model.encoder.parameters() if p.requires_grad}
    assert encoder_params and {id(p) for p in groups[1]["params"]} == encoder_params
    assert not any(id(p) in encoder_params for p in groups[0]["params"])
    assert sum(p.numel() for p in groups[1]["params"]) < sum(p.numel() for p in module.model.encoder.parameters())


def test_checkpoint_settings_are_plain_values():
    module = CaptioningModule(decoder=DecoderConfig(attention_kind="hard"))

    def plain(x):
        return (
            isinstance(x, (str, int, float, bool, type(None)))
            or (isinstance(x, (list, tuple)) and all(map(plain, x)))
            or (isinstance(x, dict) and all(map(plain, x.values())))
        )

    assert plain(dict(module.hparams))
    assert module.hparams["objective"]["class_path"].endswith("HardAttentionReinforce")
