"""Shared fixtures: tiny shapes datasets and a briefly trained checkpoint, made once per session."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("PYTHONWARNINGS", "ignore")


def threads_per_worker() -> int:
    """The cores of the machine split between pytest-xdist's workers (all of them without xdist)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


# Workers that each used every core would fight over them (torch's threads spin while they wait).
# Set before torch is imported, and inherited by the servers and training runs the tests start.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_worker()))


@pytest.fixture(scope="session")
def tiny_shapes(tmp_path_factory) -> Path:
    """A shapes dataset of 40/8/8 images at 64 px; returns the annotation file."""
    from captioning.data.shapes import generate

    return generate(
        tmp_path_factory.mktemp("shapes"), n_train=40, n_val=8, n_test=8, seed=3, image_size=64, progress=False
    )


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_shapes, tmp_path_factory) -> Path:
    """A soft-attention checkpoint after a few training steps on the tiny shapes data."""
    from captioning.training.cli import run_lightning_cli
    from tests.helpers import fit_args

    root = tmp_path_factory.mktemp("fit")
    cli = run_lightning_cli(fit_args(tiny_shapes, root, steps=3))
    path = Path(cli.trainer.checkpoint_callback.last_model_path)
    assert path.is_file()
    return path


@pytest.fixture(scope="session")
def tiny_shapes_zh(tmp_path_factory) -> Path:
    """The tiny shapes dataset's images with Chinese captions (make-shapes --language zh)."""
    from captioning.data.shapes import generate

    return generate(
        tmp_path_factory.mktemp("shapes_zh"),
        n_train=40,
        n_val=8,
        n_test=8,
        seed=3,
        image_size=64,
        progress=False,
        language="zh",
    )


@pytest.fixture(scope="session")
def tiny_zh_checkpoint(tiny_shapes_zh, tmp_path_factory) -> Path:
    """A Chinese soft-attention checkpoint (configs/shapes_soft_zh.yaml, one token per character:
    no optional package needed) after a few training steps."""
    from captioning.training.cli import run_lightning_cli
    from tests.helpers import fit_args

    root = tmp_path_factory.mktemp("fit_zh")
    cli = run_lightning_cli(
        fit_args(tiny_shapes_zh, root, config="shapes_soft_zh.yaml", steps=3, extra=["--data.tokenizer", "chars"])
    )
    path = Path(cli.trainer.checkpoint_callback.last_model_path)
    assert path.is_file()
    return path


# ---------------------------------------------------------------------- builders shared by the tests
from tests.helpers import GRID, D, V  # noqa: E402 (after the thread setting above)


@pytest.fixture
def make_decoder():
    """``make_decoder(**settings)``: a small LSTM decoder (models/decoder.py) in eval mode, float64 by
    default; ``settings`` are DecoderConfig's (embed 6, hidden D, attention 8, dropout 0 unless given),
    ``sharpen`` scales L_o and ``eos`` raises EOS's bias (captions that end at different steps),
    ``bad_endings`` sets the decoder's bad-ending ids."""
    import torch

    from captioning.models.decoder import DecoderConfig

    def make(
        dtype=torch.float64, seed=0, vocab_size=V, feature_dim=D, sharpen=1.0, eos=0.0, bad_endings=None, **settings
    ):
        torch.manual_seed(seed)
        config = DecoderConfig(**{"embed_dim": 6, "hidden_dim": D, "attention_dim": 8, "dropout": 0.0, **settings})
        decoder = config.build(vocab_size, feature_dim).to(dtype).eval()
        with torch.no_grad():
            decoder.L_o.weight.mul_(sharpen)
            decoder.L_o.bias[2] += eos
        decoder.bad_ending_ids = bad_endings
        return decoder

    return make


@pytest.fixture
def make_batch():
    """``make_batch(B=4, seed=0, dtype=float64, L=GRID * GRID, D=D, V=V, lengths=(7, 4, 6, 3))``: features
    (B, L, D) and captions (B, T + 1) of those token counts (BOS and EOS included; unsorted), with their lengths."""
    import torch

    from captioning.vocab import Vocabulary

    def make(B=4, seed=0, dtype=torch.float64, L=GRID * GRID, D=D, V=V, lengths=(7, 4, 6, 3, 5, 2)):
        g = torch.Generator().manual_seed(seed)
        features = torch.randn(B, L, D, generator=g, dtype=dtype)
        lengths = torch.tensor(list(lengths)[:B])
        captions = torch.full((B, int(lengths.max())), Vocabulary.pad_id, dtype=torch.long)
        for b, n in enumerate(lengths.tolist()):
            captions[b, 0] = Vocabulary.bos_id
            captions[b, 1 : n - 1] = torch.randint(4, V, (n - 2,), generator=g)
            captions[b, n - 1] = Vocabulary.eos_id
        return features, captions, lengths

    return make


@pytest.fixture
def tiny_model():
    """``tiny_model(kind="soft", encoder=None, vocab=None, **decoder)``: a whole ShowAttendTell with a
    tiny CNN encoder and a small decoder (DecoderConfig settings in ``decoder``), float32, seed 0."""
    import torch

    from captioning.models.decoder import DecoderConfig
    from captioning.models.encoders import EncoderConfig
    from captioning.models.show_attend_tell import ShowAttendTell
    from captioning.vocab import Vocabulary

    words = [["a", "small", "red", "circle", "left", "of", "square"]]

    def make(kind="soft", encoder=None, vocab=None, **decoder):
        torch.manual_seed(0)
        settings = {"embed_dim": 8, "hidden_dim": 16, "attention_dim": 8, "dropout": 0.0, "attention_kind": kind}
        return ShowAttendTell(
            encoder or EncoderConfig(name="small_cnn", pretrained=False, channels=(4, 8, 8), dim=8),
            DecoderConfig(**{**settings, **decoder}),
            vocab or Vocabulary.build(words, min_freq=1),
        )

    return make
