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
# Each returns a function that builds afresh at each call (from its seed: the same weights each time);
# session-scoped, so that module-scoped fixtures can build with them too.
from tests.helpers import GRID, D, V  # noqa: E402 (after the thread setting above)


@pytest.fixture(scope="session")
def make_decoder():
    """``make_decoder(**settings)``: a small decoder in eval mode, float64 by default. ``settings`` are
    its config's: the LSTM's DecoderConfig (embed 6, hidden D, attention 8, dropout 0 unless given) or,
    with ``kind="transformer"``, TransformerConfig's (hidden D, 2 heads, 2 layers, dropout 0 unless
    given). ``sharpen`` scales the output layer's weights and ``eos`` raises EOS's bias (captions that
    end at different steps), ``bad_endings`` sets the decoder's bad-ending ids, ``cls`` builds a
    subclass of the config's decoder class instead."""
    import torch

    from captioning.models.kinds import decoder_config

    def make(
        dtype=torch.float64,
        seed=0,
        vocab_size=V,
        feature_dim=D,
        sharpen=1.0,
        eos=0.0,
        bad_endings=None,
        cls=None,
        **settings,
    ):
        torch.manual_seed(seed)
        if settings.get("kind", "lstm") == "lstm":
            defaults = {"embed_dim": 6, "hidden_dim": D, "attention_dim": 8, "dropout": 0.0}
        else:
            defaults = {"hidden_dim": D, "heads": 2, "layers": 2, "dropout": 0.0}
        config = decoder_config({**defaults, **settings})
        decoder = (cls(vocab_size, feature_dim, config) if cls else config.build(vocab_size, feature_dim)).to(dtype)
        output = decoder.out_logits if config.kind == "transformer" else decoder.L_o
        with torch.no_grad():
            output.weight.mul_(sharpen)
            output.bias[2] += eos
        decoder.bad_ending_ids = bad_endings
        return decoder.eval()

    return make


@pytest.fixture(scope="session")
def make_batch():
    """``make_batch(B=4, seed=0, dtype=float64, L=GRID * GRID, D=D, V=V, lengths=(7, 4, 6, 3, 5, 2))``:
    features (B, L, D) and captions (B, T + 1) of the first B of those token counts (BOS and EOS
    included; unsorted), with their lengths. The features are the generator's first draw: ``make_batch(
    seed=s)[0]`` is ``torch.randn(B, L, D, generator=torch.Generator().manual_seed(s))``."""
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


@pytest.fixture(scope="session")
def tiny_model():
    """``tiny_model(kind="soft", encoder=None, vocab=None, seed=0, image_size=None, generation=None,
    eos=0.0, scale=1.0, **decoder)``: a whole ShowAttendTell, float32, in train mode.

    ``kind``: "soft" or "hard" (the LSTM's attention; embed 8, hidden 16, attention 8, dropout 0 unless
    ``decoder`` says otherwise) or "transformer" (hidden 16, 2 heads, 2 layers, dropout 0).
    ``encoder``: an EncoderConfig, or settings of the small CNN (channels (4, 8, 8), D 8, no pretrained
    weights). ``vocab``: a Vocabulary or a list of words (default: seven shapes words). ``image_size``
    (and ``generation``) give the model a ModelSpec, as build_model does. ``eos`` raises the output
    layer's EOS bias, then ``scale`` multiplies every decoder weight (captions that vary and end)."""
    import torch

    from captioning.decoding.generation import GenerationConfig
    from captioning.models.decoder import DecoderConfig
    from captioning.models.encoders import EncoderConfig
    from captioning.models.show_attend_tell import ShowAttendTell
    from captioning.models.spec import ModelSpec
    from captioning.models.transformer import TransformerConfig
    from captioning.vocab import Vocabulary

    words = ["a", "small", "red", "circle", "left", "of", "square"]

    def make(
        kind="soft",
        encoder=None,
        vocab=None,
        seed=0,
        image_size=None,
        generation=None,
        eos=0.0,
        scale=1.0,
        **decoder,
    ):
        if kind == "transformer":
            config = TransformerConfig(**{"hidden_dim": 16, "heads": 2, "layers": 2, "dropout": 0.0, **decoder})
        else:
            settings = {"embed_dim": 8, "hidden_dim": 16, "attention_dim": 8, "dropout": 0.0, "attention_kind": kind}
            config = DecoderConfig(**{**settings, **decoder})
        if not isinstance(encoder, EncoderConfig):
            cnn = {"name": "small_cnn", "pretrained": False, "channels": (4, 8, 8), "dim": 8}
            encoder = EncoderConfig(**{**cnn, **(encoder or {})})
        if not isinstance(vocab, Vocabulary):
            vocab = Vocabulary.build([vocab or words], min_freq=1)
        spec = None
        if image_size is not None:
            spec = ModelSpec(
                encoder, config, image_size=image_size, generation=generation or GenerationConfig(num_beams=3)
            )
        torch.manual_seed(seed)
        model = ShowAttendTell(encoder, config, vocab, spec=spec)
        output = model.decoder.out_logits if kind == "transformer" else model.decoder.L_o
        with torch.no_grad():
            output.bias[Vocabulary.eos_id] += eos
            for p in model.decoder.parameters():
                p.mul_(scale)
        return model

    return make


@pytest.fixture(scope="session")
def tiny_layered_model(tiny_model):
    """``tiny_layered_model(kind="transformer")``: an untrained 2-layer transformer (``kind="lstm"``: an
    LSTM) over a 32-pixel image, in eval mode, for the tests of a transformer's chosen layer; the same
    weights each call."""
    from captioning.decoding.generation import GenerationConfig

    words = ["a", "red", "blue", "green", "circle", "square", "triangle", "and", "on", "left", "right"]

    def make(kind="transformer"):
        return tiny_model(
            "transformer" if kind == "transformer" else "soft",
            encoder={"channels": (4, 8)},
            vocab=words,
            image_size=32,
            generation=GenerationConfig(num_beams=1, max_new_tokens=5, min_new_tokens=4),
        ).eval()

    return make
