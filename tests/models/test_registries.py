"""The models' extension points: attention scores, encoders and decoder kinds are registries.

A name that is not registered is a one-line ConfigError naming the field and every registered name;
a score, encoder or decoder kind registered outside the package (here, in the test) is usable by
name everywhere a built-in one is: configs, the spec, training and decoding."""

import ast
import dataclasses
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from captioning.decoding.search import GenerationConfig
from captioning.errors import ConfigError
from captioning.fast import fast_decoder
from captioning.fast.lstm import FastLSTM
from captioning.models import decoder, encoders
from captioning.models.decoder import SCORES, DecoderConfig, Score, ShowAttendTellDecoder, load_variants
from captioning.models.encoders import ENCODERS, EncoderConfig, SmallCNN, build_encoder, list_encoders
from captioning.models.kinds import DECODERS, list_decoders
from captioning.models.show_attend_tell import ShowAttendTell
from captioning.models.spec import ModelSpec, build_model
from captioning.objectives.cross_entropy import CrossEntropy
from captioning.vocab import Vocabulary

V, D, L = 12, 10, 9
load_variants()
VOCAB = Vocabulary(list(Vocabulary.SPECIALS) + [f"w{i}" for i in range(V - 4)])


@pytest.fixture
def registries(monkeypatch):
    """The registries as they are, restored after the test (what a test registers does not stay)."""
    for registry in (SCORES, ENCODERS, DECODERS):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))


@pytest.mark.parametrize(
    "make,field,names",
    [
        (lambda: DecoderConfig(score="cosine"), "model.decoder.score", SCORES.names),
        (lambda: DecoderConfig(kind="gru"), "model.decoder.kind", list_decoders),
        (lambda: EncoderConfig("alexnet"), "model.encoder.name", list_encoders),
    ],
)
def test_an_unknown_name_is_one_line_listing_the_registered_names(make, field, names):
    registered = names()  # (list_decoders imports every built-in kind first)
    with pytest.raises(ConfigError) as info:
        make()
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{field}: unknown ")
    assert registered and all(name in message for name in registered)


def test_the_lists_are_the_registries():
    assert SCORES.names() == ["additive", "concat", "dot", "general", "scaled_dot", "uniform"]
    assert sorted(list_decoders()) == ["conv", "lstm", "transformer"] and DECODERS.get("lstm") is DecoderConfig
    assert list_encoders()[0] == "small_cnn" and {"resnet101", "vgg19", "efficientnet_lite0"} <= set(list_encoders())
    assert "timm:<model> or open_clip:<model>" in str(encoders.ENCODERS.unknown("x", extra=encoders.PREFIXED_FORMS))
    for name in SCORES.names():  # each name builds its own class, which states the Score interface
        f_att = DecoderConfig(score=name, hidden_dim=D).build(V, D).f_att
        assert isinstance(f_att, Score) and SCORES.get(name) is type(f_att)


class CosineScore(Score):
    """e_ti = 5 cos(W_q h, W_k a_i): a score defined outside the package."""

    def __init__(self, feature_dim: int, hidden_dim: int, attention_dim: int, heads: int = 1):
        super().__init__()
        self.keys = nn.Linear(feature_dim, attention_dim)
        self.W_q = nn.Linear(hidden_dim, attention_dim)

    def project(self, features: Tensor) -> Tensor:
        return nn.functional.normalize(self.keys(features), dim=-1)  # (B, L, A)

    def query(self, h: Tensor) -> Tensor:
        return self.W_q(h)

    def scores(self, keys: Tensor, query: Tensor, beams: int = 1) -> Tensor:
        B, L_, A = keys.shape
        q = nn.functional.normalize(query, dim=-1).view(B, beams, A)
        return 5 * torch.bmm(q, keys.transpose(1, 2)).reshape(B * beams, L_)


def test_a_registered_score_trains_and_decodes_by_name(registries, make_batch):
    SCORES.register("cosine")(CosineScore)
    assert "cosine" in SCORES.names()
    spec = ModelSpec.from_dict(
        {
            "encoder": {"name": "small_cnn", "pretrained": False, "channels": [4], "dim": D},
            "decoder": {"embed_dim": 6, "hidden_dim": 8, "attention_dim": 8, "score": "cosine"},
            "image_size": 16,
        }
    )
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    torch.manual_seed(0)
    model = build_model(spec, VOCAB)
    assert isinstance(model.decoder.f_att, CosineScore)
    features, captions, lengths = make_batch(B=3, dtype=torch.float32, L=L, D=D, V=V, lengths=(5, 3, 4))
    twin = fast_decoder(model.decoder)  # the fast path takes a score it does not know through its contract
    assert isinstance(twin, FastLSTM)
    model.eval()  # (no dropout: the same function)
    torch.testing.assert_close(
        CrossEntropy()(twin, features, {"captions": captions, "lengths": lengths}).loss,
        CrossEntropy()(model.decoder, features, {"captions": captions, "lengths": lengths}).loss,
    )
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.decoder.f_att.keys.weight.detach().clone()
    loss = CrossEntropy()(model.decoder, features, {"captions": captions, "lengths": lengths}).loss
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and not torch.equal(before, model.decoder.f_att.keys.weight)
    out = model.generate(features=features, config=GenerationConfig(num_beams=2, max_new_tokens=4))
    assert out.sequences.shape[0] == 3 and torch.allclose(out.alphas.sum(-1)[:, 0], torch.ones(3))


def test_a_registered_encoder_builds_by_name(registries):
    @ENCODERS.register("tiny_cnn")
    class TinyCNN(SmallCNN):
        @classmethod
        def from_config(cls, config: EncoderConfig) -> SmallCNN:
            return cls((4,), config.dim, grid_size=3)

    config = EncoderConfig("tiny_cnn", dim=D)
    assert "tiny_cnn" in list_encoders() and isinstance(build_encoder(config), TinyCNN)
    model = ShowAttendTell(config, DecoderConfig(embed_dim=6, hidden_dim=8, attention_dim=8), VOCAB)
    assert model.encoder(torch.rand(2, 3, 24, 24)).shape == (2, L, D)


def test_a_registered_decoder_kind_is_what_the_model_builds(registries):
    class Twin(ShowAttendTellDecoder):
        pass

    @DECODERS.register("lstm_twin")
    @dataclasses.dataclass
    class TwinConfig(DecoderConfig):
        kind: str = "lstm_twin"

        def build(self, vocab_size, feature_dim):
            return Twin(vocab_size, feature_dim, self)

    config = TwinConfig(embed_dim=6, hidden_dim=8, attention_dim=8)
    model = ShowAttendTell(EncoderConfig("small_cnn", channels=(4,), dim=D), config, VOCAB)
    assert type(model.decoder) is Twin and model.decoder.bad_ending_ids is not None
    assert config.variant == "lstm_twin+additive" and DecoderConfig().variant == "additive"


def test_decoder_kind_defaults_to_lstm_and_round_trips():
    assert DecoderConfig().kind == "lstm"
    old = {"encoder": {"name": "small_cnn"}, "decoder": {"hidden_dim": 8}, "image_size": 32}  # a file from before kinds
    spec = ModelSpec.from_dict(old)
    assert spec.decoder.kind == "lstm" and spec.to_dict()["decoder"]["kind"] == "lstm"
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    assert "kind" in spec.architecture()["decoder"]
    with pytest.raises(ConfigError, match="model.decoder.kind"):
        ModelSpec.from_dict({**old, "decoder": {"kind": "gru"}})


def test_declared_attributes_have_their_defaults():
    """What others set on the model is declared where the model is made (no getattr with a default)."""
    assert ShowAttendTellDecoder(V, D, DecoderConfig(8, 8, 8)).bad_ending_ids is None
    model = ShowAttendTell(EncoderConfig("small_cnn", channels=(4,), dim=D), DecoderConfig(8, 8, 8), VOCAB)
    assert model.source is None and model.card is None
    assert {f.name for f in dataclasses.fields(DecoderConfig)} >= {"score", "kind"}


def test_models_import_nothing_from_viz():
    """grid_shape lives on the ground floor (captioning.common): models/ draws no pictures."""
    for path in Path(decoder.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("captioning.viz"), path.name
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("captioning.viz") for a in node.names), path.name
