"""The Transformer decoder (models/transformer.py): the cached step against the teacher-forced pass,
the causal mask, beam search with the cache against recomputing, the options' one-line errors,
state-dict and model-folder round trips, ensembles mixing it with the LSTM."""

import pytest
import torch

from captioning.decoding.ensemble import Ensemble
from captioning.decoding.generation import GenerationConfig
from captioning.decoding.search import generate
from captioning.errors import ConfigError
from captioning.models.decoder import DecoderConfig, Glimpse
from captioning.models.kinds import decoder_config
from captioning.models.transformer import TransformerConfig, TransformerDecoder, TransformerStates
from captioning.vocab import Vocabulary

BOS, EOS = Vocabulary.bos_id, Vocabulary.eos_id
V, D, L = 23, 12, 16


def config(**changes) -> TransformerConfig:
    return decoder_config({"kind": "transformer", "hidden_dim": 16, "heads": 4, "layers": 2, "dropout": 0.0, **changes})


@pytest.fixture(scope="session")
def decoder(make_decoder):
    """``decoder(seed=0, **changes)``: conftest's make_decoder of kind transformer at this file's sizes
    (float64, 4 heads), sharper than at initialisation and the image weighing more: captions that vary."""

    def make(seed: int = 0, **changes) -> TransformerDecoder:
        dec = make_decoder(
            seed=seed, vocab_size=V, feature_dim=D, kind="transformer", hidden_dim=16, heads=4, **changes
        )
        with torch.no_grad():
            dec.out_logits.bias[EOS] += 1.0
            for p in dec.parameters():
                p.mul_(2.0)
            dec.embedding.weight.mul_(0.5)
            dec.out_logits.bias[EOS] += 1.0
            for layer in dec.layers:
                layer.cross_attention.output.weight.mul_(4.0)
        return dec

    return make


@pytest.fixture(scope="session")
def captions(make_batch):
    """``captions(B=3, T=9, seed=1)``: captions (B, T + 1) of T + 1, T - 2 and 4 tokens (conftest's
    make_batch's) and their lengths."""
    return lambda B=3, T=9, seed=1: make_batch(B, seed, L=L, D=D, V=V, lengths=(T + 1, T - 2, 4))[1:]


@pytest.fixture(scope="session")
def features(make_batch):
    """``features(B=3, seed=2)``: annotation vectors (B, L, D), float64 (conftest's make_batch's)."""
    return lambda B=3, seed=2: make_batch(B, seed, L=L, D=D, V=V)[0]


@pytest.mark.parametrize(
    "changes", [{}, {"aoa": True}, {"positions": "learned", "tie_embeddings": True}, {"refiner_layers": 1}]
)
def test_the_cached_step_equals_the_teacher_forced_pass_at_every_position(changes, decoder, captions, features):
    dec = decoder(**changes)
    f, (caps, lengths) = features(), captions()
    out = dec(f, caps, lengths, static=True)  # logits (B, T, V), every position
    state = dec.initial_state(f, max_steps=caps.size(1))
    for t in range(caps.size(1) - 1):
        logp, state, g = dec.step(caps[:, t], state)
        torch.testing.assert_close(logp, out.logits[:, t].log_softmax(-1), rtol=0, atol=1e-12)
        real = out.mask[:, t]
        torch.testing.assert_close(g.alpha[real], out.alphas[real, t], rtol=0, atol=1e-12)
        torch.testing.assert_close(g.head_alpha[real], out.head_alphas[real, t], rtol=0, atol=1e-12)
    # the packed logits are the static ones at the real steps
    torch.testing.assert_close(dec(f, caps, lengths).logits, out.logits[out.mask])


def test_the_cache_reordered_with_beams_reads_each_row_its_own_history(decoder, captions, features):
    dec = decoder()
    f, (caps, _) = features(2), captions(2)
    K = 3
    state = dec.initial_state(f, max_steps=8).expand_beams(K)
    rows = caps.repeat_interleave(K, 0)
    for t in range(3):
        _, state, _ = dec.step(rows[:, t], state)
    parent = torch.tensor([2, 2, 0, 4, 3, 3])  # each beam takes another beam of its image as parent
    state = TransformerStates.state(
        TransformerStates.reorder(TransformerStates.carried(state), parent), [state.memory], K
    )
    rows = rows[parent]
    logp, _, _ = dec.step(rows[:, 3], state)
    ref = dec(f.repeat_interleave(K, 0), rows[:, :5], torch.full((2 * K,), 5), static=True).logits[:, 3]
    torch.testing.assert_close(logp, ref.log_softmax(-1), rtol=0, atol=1e-12)


def test_a_future_word_changes_no_earlier_logit(decoder, captions, features):
    dec = decoder(aoa=True)
    f, (caps, lengths) = features(), captions()
    before = dec(f, caps, lengths, static=True).logits
    for t in (3, 6):
        changed = caps.clone()
        changed[:, t] = (changed[:, t] + 1 - 4) % (V - 4) + 4
        after = dec(f, changed, lengths, static=True).logits
        assert torch.equal(after[:, :t], before[:, :t])
        assert not torch.allclose(after[:, t], before[:, t])


class WordsState(tuple):
    """(position (N,), the words so far (N, T), features (B, L, D), beams)."""

    def expand_beams(self, K):
        position, words, feats, _ = self
        return WordsState((position.repeat_interleave(K, 0), words.repeat_interleave(K, 0), feats, K))


class Recomputing:
    """The transformer decoding without a cache: each step runs the teacher-forced pass over every
    word so far (its state: the words, carried and reordered by the loops like the cache)."""

    attention_kind, bad_ending_ids = "soft", None

    def __init__(self, dec: TransformerDecoder):
        self.dec, self.vocab_size = dec, dec.vocab_size
        self.state_layout = self

    n_carried, n_constants = 2, 1

    def initial_state(self, features, max_steps=None):
        B = features.size(0)
        return WordsState((torch.zeros(B, dtype=torch.long), torch.zeros(B, max_steps, dtype=torch.long), features, 1))

    def carried(self, state):
        return list(state[:2])

    def constants(self, state):
        return [state[2]]

    def state(self, carried, constants, beams=1):
        return (*carried, *constants, beams)

    def reorder(self, carried, rows):
        return [x[rows] for x in carried]

    def step(self, tokens, state, mode=None, attention_temperature=1.0):
        position, words, feats, beams = state
        here = torch.arange(words.size(1)) == position.unsqueeze(1)
        words = torch.where(here, tokens.unsqueeze(1), words)
        logits, maps = self.dec.run(feats.repeat_interleave(beams, 0), words)
        rows = torch.arange(tokens.size(0))
        heads = maps[rows, self.dec.attention_layer, :, position]  # (N, h, L)
        logp = logits[rows, position].log_softmax(-1)
        alpha = heads.mean(1)
        new = (position + 1, words, feats, beams)
        return logp, new, Glimpse(None, alpha, alpha.argmax(-1), head_alpha=heads)


@pytest.mark.parametrize(
    "gen",
    [
        GenerationConfig(num_beams=3, max_new_tokens=8),
        GenerationConfig(num_beams=4, num_beam_groups=2, diversity_penalty=0.7, max_new_tokens=8),
        GenerationConfig(num_beams=3, max_new_tokens=8, no_repeat_ngram_size=2, length_penalty=0.5),
        GenerationConfig(num_beams=1, max_new_tokens=8, repetition_penalty=1.3),
    ],
)
def test_search_with_the_cache_equals_search_recomputing_every_word(gen, decoder, features):
    dec = decoder(aoa=True)
    f = features(4)
    cached = generate(dec, f, gen)
    recomputed = generate(Recomputing(dec), f, gen)
    assert torch.equal(cached.sequences, recomputed.sequences)
    torch.testing.assert_close(cached.scores, recomputed.scores, rtol=0, atol=1e-10)
    torch.testing.assert_close(cached.alphas, recomputed.alphas, rtol=0, atol=1e-10)
    assert len(set(cached.lengths.tolist())) > 1 and (cached.sequences != cached.sequences[:1]).any()  # varied


def test_sampling_runs_through_the_same_loop(decoder, features):
    dec = decoder()
    gen = GenerationConfig(do_sample=True, top_p=0.9, temperature=0.8, max_new_tokens=8)
    a = generate(dec, features(), gen, torch.Generator().manual_seed(0))
    b = generate(dec, features(), gen, torch.Generator().manual_seed(0))
    assert torch.equal(a.sequences, b.sequences) and a.sequences.size(1) <= 8


@pytest.mark.parametrize(
    "changes, words",
    [
        (
            dict(kind="lstm", layers=2),
            "model.decoder.layers: an option of decoder kind 'transformer'; this decoder is kind 'lstm'",
        ),
        (
            dict(kind="lstm", tie_embeddings=True),
            "model.decoder.tie_embeddings: an option of decoder kind 'transformer'",
        ),
        (
            dict(placement="luong"),
            "model.decoder.placement: an option of decoder kind 'lstm'; this decoder is kind 'transformer'",
        ),
        (dict(attention_kind="hard"), "model.decoder.attention_kind: an option of decoder kind 'lstm'"),
        (dict(score="dot"), "model.decoder.score: an option of decoder kind 'lstm'"),
        (dict(heads=3), "model.decoder.heads: the transformer's width hidden_dim (16) must be a multiple of heads (3)"),
        (dict(embed_dim=8), "model.decoder.embed_dim: an option of decoder kind 'lstm'"),
        (dict(attention_layer=2), "model.decoder.attention_layer: expected a layer in 0..1 (the model has 2)"),
        (
            dict(attention_layer="last"),
            "model.decoder.attention_layer: expected a layer in 0..1 (the model has 2) or 'mean'",
        ),
        (dict(positions="relative"), "model.decoder.positions: expected one of 'sinusoidal', 'learned'"),
    ],
)
def test_an_option_of_the_other_kind_is_one_line(changes, words):
    with pytest.raises(ConfigError) as err:
        if changes.get("kind") == "lstm":
            decoder_config(changes)
        else:
            config(**changes)
    assert str(err.value).startswith(words) and "\n" not in str(err.value)


def test_learned_positions_beyond_their_count_are_one_line(decoder, captions, features):
    dec = decoder(positions="learned", max_positions=6)
    with pytest.raises(ConfigError, match="model.decoder.max_positions: this model's learned positions end at 6"):
        generate(dec, features(), GenerationConfig(max_new_tokens=9))
    with pytest.raises(ConfigError, match="7 tokens are more"):
        dec(features(), *captions(T=7))


WORDS = ["a", "red", "blue", "green", "circle", "square", "triangle", "and", "on", "left", "right"]


@pytest.fixture(scope="session")
def built(tiny_model):
    """``built(seed, kind="transformer", sharpen=True, **changes)``: conftest's tiny_model (2 heads) with
    a two-stage CNN over 32-pixel images, this file's words, beam 3 and 10 tokens by default, in eval
    mode; sharper than at initialisation (EOS raised, every decoder weight x3) unless ``sharpen`` is false."""

    def make(seed: int, kind: str = "transformer", sharpen: bool = True, **changes):
        return tiny_model(
            kind,
            encoder={"channels": (4, 8)},
            vocab=WORDS,
            seed=seed,
            image_size=32,
            generation=GenerationConfig(num_beams=3, max_new_tokens=10),
            eos=0.5 if sharpen else 0.0,
            scale=3.0 if sharpen else 1.0,
            **changes,
        ).eval()

    return make


def test_state_dict_and_model_folder_round_trips(tmp_path, built):
    from captioning.storage.folder import save_folder
    from captioning.storage.load import load_model

    model = built(0, tie_embeddings=True, positions="learned", aoa=True)
    assert model.decoder.out_logits.weight is model.decoder.embedding.weight
    twin = built(1, tie_embeddings=True, positions="learned", aoa=True)
    twin.load_state_dict(model.state_dict())
    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    expected = model.generate(images, config=model.spec.generation)
    assert torch.equal(twin.generate(images, config=model.spec.generation).sequences, expected.sequences)

    loaded = load_model(save_folder(tmp_path / "folder", model))
    assert loaded.spec == model.spec and loaded.spec.decoder.kind == "transformer"
    assert loaded.decoder.out_logits.weight is loaded.decoder.embedding.weight
    out = loaded.generate(images, config=model.spec.generation)
    assert torch.equal(out.sequences, expected.sequences)
    torch.testing.assert_close(out.scores, expected.scores)


def test_an_ensemble_mixes_transformer_and_lstm_members(built):
    transformer, lstm = built(0), built(1, kind="soft", sharpen=False)
    images = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    for gen in (GenerationConfig(num_beams=3, max_new_tokens=10), GenerationConfig(max_new_tokens=10)):
        alone = transformer.generate(images, config=gen)
        for members, weights in (([transformer, lstm], [1.0, 0.0]), ([lstm, transformer], [0.0, 1.0])):
            mixed = Ensemble(members, weights=weights).generate(images, config=gen)
            assert torch.equal(mixed.sequences, alone.sequences)
            torch.testing.assert_close(mixed.scores, alone.scores)
        both = Ensemble([transformer, lstm]).generate(images, config=gen)
        assert both.sequences.size(0) == 4 and both.head_alphas.shape[2] == 2


def test_the_aoa_refiner_layer_is_attention_on_attention_over_the_grid():
    from captioning.models.attention.refiner import GridRefiner

    torch.manual_seed(0)
    refiner = GridRefiner(8, 1, 2, 0.0, aoa=True).double().eval()
    layer = refiner.layers[0]
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    y = layer.norm_attention(x)
    attention = layer.attention
    q = y @ attention.query.weight.T + attention.query.bias
    w_k, w_v = attention.key_value.weight.chunk(2)
    b_k, b_v = attention.key_value.bias.chunk(2)
    k, v = y @ w_k.T + b_k, y @ w_v.T + b_v
    heads = [
        torch.softmax(q[..., h * 4 : (h + 1) * 4] @ k[..., h * 4 : (h + 1) * 4].transpose(1, 2) / 2.0, -1)
        @ v[..., h * 4 : (h + 1) * 4]
        for h in range(2)
    ]
    info, gate = (torch.cat([*heads, y], -1) @ layer.attention.output.weight.T + layer.attention.output.bias).chunk(
        2, -1
    )
    x1 = x + info * torch.sigmoid(gate)  # AoA: i * sigmoid(g) from [v^; q]
    expected = x1 + layer.feed_forward(layer.norm_ff(x1))
    torch.testing.assert_close(layer(x), expected)
    with pytest.raises(ConfigError, match="model.decoder.refiner_aoa: an option of the grid refiner"):
        DecoderConfig(refiner_aoa=True)


# ------------------------------------------------------------------ focus (decoding/steering.py)
def cross_attention_maps(model):
    """Every layer's cross-attention weights of every step, recorded: a list of (B, heads, rows, L)."""
    maps = []
    hooks = [
        layer.cross_attention.register_forward_hook(lambda m, i, out: maps.append(out[1].detach()))
        for layer in model.decoder.layers
    ]
    return maps, hooks


def box_cells(box, width: int, height: int, L: int) -> torch.Tensor:
    """The grid cells ``box`` touches: (L,) bool."""
    from captioning.common import grid_shape
    from captioning.decoding.steering import cell_coverage

    return cell_coverage(box, width, height, *grid_shape(L)) > 0


@pytest.fixture(scope="module")
def focus_model(built):
    from captioning.api import Captioner

    model = built(0, sharpen=False, layers=3, heads=4)  # as initialised (scores of a trained model's size)
    return model, Captioner.from_model(model, "cpu")


@pytest.fixture(scope="module")
def shapes_images(tiny_shapes):
    """[(path, record)] of the tiny shapes data's one-object and two-object images."""
    import json

    data = json.loads(tiny_shapes.read_text())
    path = lambda i: str(tiny_shapes.parent / i["filepath"] / i["filename"])  # noqa: E731
    one = [(path(i), i) for i in data["images"] if len(i["objects"]) == 1]
    two = [(path(i), i) for i in data["images"] if len(i["objects"]) == 2]
    return one, two


def test_a_transformer_takes_a_focus_and_strength_zero_changes_nothing(focus_model, shapes_images, decoder, features):
    from captioning.decoding.steering import Focused, steer_problem

    model, captioner = focus_model
    assert steer_problem(model.decoder) is None
    paths = [p for p, _ in shapes_images[1][:4]]
    for beams in (1, 3):
        plain = captioner(paths, num_beams=beams, return_attention=True)
        zero = captioner(paths, num_beams=beams, return_attention=True, focus=(0, 0, 16, 16), focus_strength=0)
        for a, b in zip(plain, zero):
            assert a["tokens"] == b["tokens"] and a["score"] == b["score"]
            assert (a["attention"] == b["attention"]).all() and (a["head_attention"] == b["head_attention"]).all()
    # a prior of zeros through the steered decoder is bit-identical too (the prior's path adds exactly nothing)
    f = features(4)
    dec = decoder(aoa=True)
    for gen in (GenerationConfig(max_new_tokens=8), GenerationConfig(num_beams=3, max_new_tokens=8)):
        a, b = generate(dec, f, gen), generate(Focused(dec, torch.zeros(4, L, dtype=torch.float64)), f, gen)
        assert torch.equal(a.sequences, b.sequences) and torch.equal(a.scores, b.scores)
        assert torch.equal(a.alphas, b.alphas) and torch.equal(a.head_alphas, b.head_alphas)


def test_a_strong_focus_on_an_empty_corner_still_ends(focus_model, shapes_images):
    model, captioner = focus_model
    path, image = shapes_images[0][0]
    x0, y0, x1, y1 = image["objects"][0]["bbox"]
    W, H = image["width"], image["height"]
    corner = (0, 0, 8, 8) if x0 + x1 > W and y0 + y1 > H else (W - 8, H - 8, W, H)  # away from the object
    for beams in (1, 3):
        maps, hooks = cross_attention_maps(model)
        out = captioner([path], num_beams=beams, return_attention=True, focus=corner, focus_strength=1e6)[0]
        for h in hooks:
            h.remove()
        assert out["tokens"][-1] == Vocabulary.EOS or len(out["tokens"]) == captioner.generation.max_new_tokens
        assert np_finite(out["score"]) and np_finite(out["attention"]) and np_finite(out["head_attention"])
        inside = box_cells(corner, W, H, maps[0].size(-1))
        for w in maps:  # every layer, head and step reads the corner only
            assert torch.isfinite(w).all() and w[..., inside].sum(-1).min() > 0.99


def np_finite(x) -> bool:
    return bool(torch.isfinite(torch.as_tensor(x)).all())


def test_a_focus_on_one_object_moves_every_layers_cross_attention_into_its_box(focus_model, shapes_images):
    """Two-object images: with the box of one object (at the default strength), every layer's and
    head's cross-attention puts its mass in that box's cells at every step (without the focus it
    does not), almost none on the other object's."""
    model, captioner = focus_model
    for path, image in shapes_images[1][:3]:
        W, H = image["width"], image["height"]
        for target, other in ((0, 1), (1, 0)):
            box = tuple(image["objects"][target]["bbox"])
            for beams in (1, 3):
                steered, hooks = cross_attention_maps(model)
                captioner([path], num_beams=beams, focus=box)
                for h in hooks:
                    h.remove()
                plain, hooks = cross_attention_maps(model)
                captioner([path], num_beams=beams)
                for h in hooks:
                    h.remove()
                L = steered[0].size(-1)
                inside = box_cells(box, W, H, L)
                elsewhere = box_cells(tuple(image["objects"][other]["bbox"]), W, H, L) & ~inside
                mass = torch.stack([w[..., inside].sum(-1).min() for w in steered])  # per layer: the least
                before = torch.stack([w[..., inside].sum(-1).mean() for w in plain])
                # the default strength (10): > 0.98 of every map in the box, 0.91 for an object within
                # one cell (its cells' few scores against 60 others' at -10); unsteered 0.06-0.31
                assert mass.min() > 0.9 and before.max() < 0.35, (mass, before)
                assert max(float(w[..., elsewhere].sum(-1).max()) for w in steered) < 0.02


def test_an_ensemble_of_a_transformer_and_an_lstm_is_steered_member_by_member(built):
    from captioning.api import Captioner

    transformer, lstm = built(0), built(1, kind="soft", sharpen=False)
    images = [torch.rand(3, 40, 40, generator=torch.Generator().manual_seed(k)) for k in range(3)]
    ensemble = Captioner(Ensemble([transformer, lstm]), device="cpu")
    box = (0, 0, 20, 20)  # the top-left quarter: cells 0-3 x 0-3 of the 8 x 8 grids
    for beams in (1, 3):
        for out in ensemble(images, num_beams=beams, return_attention=True, focus=box, focus_strength=1e4):
            maps = torch.tensor(out["member_attention"])  # (T, members, 8, 8)
            assert maps.shape[1] == 2 and maps[..., :4, :4].sum((-1, -2)).min() > 0.99
            assert np_finite(out["score"])
    # a transformer alone in the ensemble is steered as the transformer
    alone, one = Captioner.from_model(transformer, "cpu"), Captioner(Ensemble([transformer]), device="cpu")
    kwargs = dict(focus=box, num_beams=3, max_new_tokens=10)
    for a, b in zip(alone(images, **kwargs), one(images, **kwargs)):
        assert a["tokens"] == b["tokens"] and a["score"] == pytest.approx(b["score"], abs=1e-6)
