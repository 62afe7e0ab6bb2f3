"""Checkpoint ensembles (decoding/ensemble.py): the members' averaged log-probabilities through the
same search loops, the Captioner over several models and the CLI's repeated --checkpoint."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from captioning.decoding.ensemble import Ensemble
from captioning.decoding.generation import GenerationConfig
from captioning.errors import ConfigError
from captioning.fast import fast_model
from captioning.vocab import Vocabulary
from tests.helpers import TINY_PATH, fit_args, float32_tolerance

EOS = Vocabulary.eos_id
WORDS = ["a", "red", "blue", "green", "circle", "square", "triangle", "and", "on", "left", "right"]


def vocab(words=WORDS) -> Vocabulary:
    return Vocabulary.build([words], min_freq=1)


@pytest.fixture(scope="session")
def model_of(tiny_model):
    """``model_of(seed, kind="soft", image_size=32, hidden=16, words=WORDS)``: conftest's tiny_model with
    a two-stage CNN and a spec, sharper than at initialisation (captions that vary with the features
    and in length), in eval mode."""

    def make(seed: int, kind: str = "soft", image_size: int = 32, hidden: int = 16, words=WORDS):
        return tiny_model(
            kind,
            encoder={"channels": (4, 8)},
            vocab=vocab(words),
            seed=seed,
            image_size=image_size,
            generation=GenerationConfig(num_beams=3, max_new_tokens=12),
            eos=0.5,
            scale=5.0,
            hidden_dim=hidden,
        ).eval()

    return make


@pytest.fixture(scope="module")
def images():
    return torch.rand(5, 3, 32, 32, generator=torch.Generator().manual_seed(7))


def random_features(*models, seed: int = 3) -> list:
    """Annotation vectors (5, L, D) per model, random (a fresh encoder's barely vary with the image)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(5, (m.spec.image_size // 4) ** 2, m.encoder.out_dim, generator=g) for m in models]


CONFIGS = [GenerationConfig(num_beams=1, max_new_tokens=12), GenerationConfig(num_beams=3, max_new_tokens=12)]


def same(a, b):
    assert torch.equal(a.sequences, b.sequences)
    assert torch.equal(a.lengths, b.lengths)
    torch.testing.assert_close(a.scores, b.scores, **float32_tolerance(b.scores, TINY_PATH))
    torch.testing.assert_close(a.alphas, b.alphas, **float32_tolerance(1.0, TINY_PATH))


@pytest.mark.parametrize("config", CONFIGS, ids=["greedy", "beam3"])
def test_ensemble_of_one_is_the_model(images, config, model_of):
    m = model_of(3)
    one = Ensemble([m])
    fast = fast_model(m)  # an ensemble's members decode with their fast twins, as the commands' models do
    [f] = random_features(m)
    for out, ref in (
        (one.generate(features=[f], config=config), fast.generate(features=f, config=config)),
        (one.generate(images=images, config=config), fast.generate(images=images, config=config)),
    ):
        assert torch.equal(out.sequences, ref.sequences) and torch.equal(out.scores, ref.scores)
        assert torch.equal(out.alphas, ref.alphas) and torch.equal(out.locations, ref.locations)


@pytest.mark.parametrize(
    "config",
    CONFIGS + [GenerationConfig(num_beams=3, max_new_tokens=12, no_repeat_ngram_size=2, num_return_sequences=2)],
    ids=["greedy", "beam3", "options"],
)
def test_ensemble_of_a_model_with_itself_is_the_model(config, model_of):
    m = model_of(3)
    [f] = random_features(m)
    ref = m.generate(features=f, config=config)
    assert len(set(map(tuple, ref.sequences.tolist()))) > 1  # the captions vary
    same(Ensemble([m, m]).generate(features=[f, f], config=config), ref)


def test_beam_search_batched_equals_per_image(model_of):
    ens = Ensemble([model_of(3), model_of(4, hidden=12)], weights=[0.6, 0.4])
    features = random_features(*ens.members)
    config = CONFIGS[1]
    batched = ens.generate(features=features, config=config)
    assert len(set(map(tuple, batched.sequences.tolist()))) > 1
    for i in range(5):
        one = ens.generate(features=[f[i : i + 1] for f in features], config=config)
        n = int(one.lengths[0])
        assert torch.equal(one.sequences[0, :n], batched.sequences[i, :n])
        torch.testing.assert_close(one.scores[0], batched.scores[i], **float32_tolerance(batched.scores, TINY_PATH))


def test_scores_are_the_weighted_mean_of_the_members_log_probs(images, model_of):
    a, b = model_of(3), model_of(4)
    ens = Ensemble([a, b], weights=[3, 1])
    assert ens.weights == (0.75, 0.25)
    features = ens.encode(images)
    state = ens.decoder.initial_state(features)
    tokens = torch.full((images.size(0),), Vocabulary.bos_id)
    logp, _, glimpse = ens.decoder.step(tokens, state)
    la = a.decoder.step(tokens, a.decoder.initial_state(features[0]))[0]
    lb = b.decoder.step(tokens, b.decoder.initial_state(features[1]))[0]
    assert torch.allclose(logp, 0.75 * la + 0.25 * lb)
    assert torch.allclose(glimpse.alpha.sum(-1), torch.ones(images.size(0)))


@pytest.mark.parametrize("config", CONFIGS, ids=["greedy", "beam3"])
def test_weights_are_honoured(config, model_of):
    a, b = model_of(3), model_of(4)
    features = random_features(a, b)
    alone = [m.generate(features=f, config=config).sequences for m, f in zip((a, b), features)]
    assert not torch.equal(alone[0], alone[1])
    for weights, member in (([1.0, 1e-9], 0), ([1e-9, 1.0], 1)):
        out = Ensemble([a, b], weights=weights).generate(features=features, config=config)
        assert torch.equal(out.sequences, alone[member])


def test_bad_weights_are_one_line(model_of):
    for weights in ([1.0], [1.0, -1.0], [0.0, 0.0]):
        with pytest.raises(ConfigError) as err:
            Ensemble([model_of(3), model_of(4)], weights=weights)
        assert "\n" not in str(err.value)


def test_different_vocabularies_are_one_line(model_of):
    with pytest.raises(ConfigError) as err:
        Ensemble([model_of(3), model_of(4, words=WORDS + ["star"])], names=["a.ckpt", "b.ckpt"])
    message = str(err.value)
    assert "\n" not in message and "a.ckpt" in message and "b.ckpt" in message


@pytest.mark.parametrize(
    "config",
    CONFIGS
    + [
        GenerationConfig(num_beams=1, max_new_tokens=12, location_samples=3),
        GenerationConfig(num_beams=3, max_new_tokens=12, attention_mode="argmax"),
    ],
    ids=["greedy", "beam3", "best_of_3", "argmax"],
)
def test_soft_and_hard_members_of_different_sizes_decode_together(images, config, model_of):
    ens = Ensemble([model_of(3), model_of(2, kind="hard", image_size=48, hidden=20)])
    assert ens.attention_kind == "mixed" and ens.spec.image_size == 48
    out = ens.generate(images=images, config=config, generator=torch.Generator().manual_seed(0))
    assert out.sequences.size(0) == images.size(0)
    assert out.alphas.size(-1) == ens.members[0].encoder(images[:1]).size(1)  # the first member's grid
    assert torch.allclose(out.alphas[:, 0].sum(-1), torch.ones(images.size(0)), atol=1e-5)
    # per-member batches at their own sizes give the same captions as one batch resized
    sized = [
        images,
        torch.nn.functional.interpolate(images, size=(48, 48), mode="bilinear", align_corners=False, antialias=True),
    ]
    if not config.location_samples > 1:
        assert torch.equal(ens.generate(images=sized, config=config).sequences, out.sequences)


def test_captioner_over_checkpoints(tmp_path, model_of):
    from captioning.api import Captioner
    from captioning.storage.folder import save_folder

    a, b = model_of(3), model_of(4, kind="hard", image_size=48)
    paths = [save_folder(tmp_path / name, m, {}, m.spec) for name, m in (("a", a), ("b", b))]
    captioner = Captioner.from_checkpoints(paths, weights=[0.5, 0.5], device="cpu")
    images = [torch.rand(3, 40, 40, generator=torch.Generator().manual_seed(k)) for k in range(3)]
    [out] = captioner(images[:1], return_attention=True, num_beams=2)
    assert out["attention"].shape[1:] == (8, 8)  # the first member's grid (32 px / 4)
    assert len(out["locations"]) == len(out["tokens"])
    single = Captioner.from_checkpoints(paths[:1], device="cpu")
    assert single(images, num_beams=2) == Captioner.from_checkpoint(paths[0], "cpu")(images, num_beams=2)
    with pytest.raises(ValueError):
        captioner.save_pretrained(tmp_path / "c")


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "captioning.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.fixture(scope="module")
def second_checkpoint(tiny_shapes, tmp_path_factory) -> Path:
    """A second, different checkpoint of the tiny shapes data (another seed)."""
    from captioning.training.cli import run_lightning_cli

    root = tmp_path_factory.mktemp("fit2")
    cli = run_lightning_cli(fit_args(tiny_shapes, root, steps=3, extra=("--seed_everything", "5")))
    return Path(cli.trainer.checkpoint_callback.last_model_path)


def test_cli_with_two_checkpoints(tiny_checkpoint, second_checkpoint, tiny_shapes, tmp_path):
    image = next((Path(tiny_shapes).parent / "images").rglob("*.png"))
    two = run_cli(
        "caption",
        image,
        "--checkpoint",
        tiny_checkpoint,
        "--checkpoint",
        second_checkpoint,
        "--ensemble-weights",
        "0.7,0.3",
        "--num-beams",
        "2",
        "--json",
    )
    assert two.returncode == 0, two.stderr
    [row] = json.loads(two.stdout)
    assert row["generated_text"]
    out = tmp_path / "maps"
    attend = run_cli(
        "attend",
        image,
        "--checkpoint",
        tiny_checkpoint,
        "--checkpoint",
        second_checkpoint,
        "--out",
        out,
        "--format",
        "png",
    )
    assert attend.returncode == 0, attend.stderr
    assert list(out.glob("*.png"))
    metrics = tmp_path / "metrics.json"
    evaluate = run_cli(
        "evaluate",
        "--checkpoint",
        tiny_checkpoint,
        "--checkpoint",
        second_checkpoint,
        "--annotations",
        tiny_shapes,
        "--num-beams",
        "2",
        "--out",
        metrics,
    )
    assert evaluate.returncode == 0, evaluate.stderr
    assert "CIDEr" in json.loads(evaluate.stdout)
    bad = run_cli("caption", image, "--checkpoint", tiny_checkpoint, "--ensemble-weights", "0.7,0.3")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
