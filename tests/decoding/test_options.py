"""Decoding options with Hugging Face's names (decoding/generation.py, processors.py, search.py): diverse beam
search, n-gram blocking, repetition penalty, top-p, min_new_tokens, suppress_tokens; their checks,
their metadata and their CLI flags (the ONNX captioner's numpy twin: tests/export/test_onnx_parity.py)."""

import math

import numpy as np
import pytest
import torch

from captioning.cli import main
from captioning.decoding.generation import GenerationConfig, generation_option, generation_options
from captioning.decoding.processors import ngram_bans, top_p_filter
from captioning.decoding.search import beam_search, generate, greedy_search
from captioning.errors import ConfigError
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.vocab import Vocabulary
from tests.helpers import TINY_PATH, float32_tolerance

PAD, BOS, EOS, UNK = Vocabulary.pad_id, Vocabulary.bos_id, Vocabulary.eos_id, Vocabulary.unk_id
V, D, L = 12, 10, 6


@pytest.fixture
def decoder_of(make_decoder):
    """conftest's make_decoder at this file's sizes, float32, sharper words (captions of varied lengths)."""
    return lambda eos=2.5: make_decoder(
        dtype=torch.float32,
        vocab_size=V,
        feature_dim=D,
        sharpen=3.0,
        eos=eos,
        bad_endings=(5, 6),
        embed_dim=8,
        hidden_dim=16,
    )


class CycleDecoder(ShowAttendTellDecoder):
    """A decoder that favours the cycle 4 -> 5 -> 6 -> 4 ... (by ``strength``) and almost never ends:
    every n-gram repeats."""

    strength = 6.0

    def step(self, tokens, state, mode=None, attention_temperature=1.0):
        logp, state, g = super().step(tokens, state, mode, attention_temperature)
        favoured = torch.where(tokens >= 4, 4 + (tokens - 4 + 1) % 3, torch.full_like(tokens, 4))
        bias = torch.zeros_like(logp).scatter(1, favoured.unsqueeze(1), self.strength)
        bias[:, EOS] = -6.0
        return torch.log_softmax(logp + bias, -1), state, g


@pytest.fixture
def cycle_decoder(make_decoder):
    """``cycle_decoder(strength=6.0)``: a CycleDecoder at this file's sizes, float32."""

    def make(strength: float = 6.0) -> CycleDecoder:
        dec = make_decoder(
            dtype=torch.float32,
            vocab_size=V,
            feature_dim=D,
            embed_dim=8,
            hidden_dim=16,
            bad_endings=(5, 6),
            cls=CycleDecoder,
        )
        dec.strength = strength
        return dec

    return make


@pytest.fixture
def features():
    return torch.randn(5, L, D, generator=torch.Generator().manual_seed(1))


def ngrams(tokens: list, n: int) -> list:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def caption(out, i: int) -> list:
    return out.sequences[i, : int(out.lengths[i])].tolist()


# ---------------------------------------------------------------------- the checks
@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(num_beams=4, num_beam_groups=3, diversity_penalty=1.0), "must divide num_beams"),
        (dict(num_beams=4, num_beam_groups=0), "num_beam_groups: expected an integer >= 1"),
        (dict(num_beams=4, num_beam_groups=2), "needs diversity_penalty > 0"),
        (dict(num_beams=4, diversity_penalty=0.5), "set num_beam_groups > 1"),
        (
            dict(num_beams=4, num_beam_groups=2, diversity_penalty=float("nan")),
            "diversity_penalty: expected a finite number",
        ),
        (dict(num_beams=4, num_beam_groups=2, diversity_penalty=-1.0), "diversity_penalty: expected a finite number"),
        (dict(num_beams=2, num_beam_groups=2, diversity_penalty=1.0, do_sample=True), "do_sample works with one beam"),
        (dict(num_beam_groups=1, do_sample=True, top_p=0.0), "top_p: expected a finite number in (0, 1], got 0.0"),
        (dict(do_sample=True, top_p=1.5), "top_p: expected a finite number in (0, 1], got 1.5"),
        (dict(do_sample=True, top_p=float("inf")), "top_p: expected a finite number in (0, 1], got inf"),
        (dict(top_p=0.9), "top_p (0.9) applies to sampling"),
        (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size: expected an integer >= 0"),
        (dict(no_repeat_ngram_size=2.5), "no_repeat_ngram_size: expected an integer >= 0"),
        (dict(repetition_penalty=0.0), "repetition_penalty: expected a finite number > 0"),
        (dict(repetition_penalty=float("nan")), "repetition_penalty: expected a finite number > 0"),
        (dict(min_new_tokens=-2), "min_new_tokens: expected an integer >= 0"),
        (dict(min_new_tokens=30, max_new_tokens=30), "must be below max_new_tokens"),
        (dict(suppress_tokens=(-1,)), "suppress_tokens: expected token ids >= 0"),
        (dict(suppress_tokens=(EOS,)), "cannot be suppressed"),
        (dict(suppress_tokens=("<end>",)), "cannot be suppressed"),
        (dict(suppress_tokens=(1.5,)), "suppress_tokens: expected token ids"),
    ],
)
def test_impossible_settings_are_one_line(fields, message):
    with pytest.raises(ConfigError) as err:
        GenerationConfig(**fields)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_do_sample_with_groups_is_refused():
    with pytest.raises(ConfigError, match="do_sample|one beam"):
        GenerationConfig(num_beams=1, num_beam_groups=1, do_sample=True).replace(
            num_beams=2, num_beam_groups=2, diversity_penalty=1.0
        )


def test_suppress_words_resolve_through_the_vocabulary(decoder_of):
    vocab = Vocabulary(list(Vocabulary.SPECIALS) + ["a", "dog", "cat"])
    config = GenerationConfig(suppress_tokens=["<unk>", "dog", 6])
    assert config.suppress_tokens == ("<unk>", "dog", 6)
    assert config.resolve_tokens(vocab).suppress_tokens == (UNK, 5, 6)
    with pytest.raises(ConfigError, match="'horse' is not a word"):
        GenerationConfig(suppress_tokens=("horse",)).resolve_tokens(vocab)
    with pytest.raises(ConfigError, match="id 9 is beyond the vocabulary"):
        GenerationConfig(suppress_tokens=(9,)).resolve_tokens(vocab)
    with pytest.raises(ConfigError, match="need the model's vocabulary"):
        generate(decoder_of(), torch.randn(1, L, D), GenerationConfig(suppress_tokens=("dog",)))


# ---------------------------------------------------------------------- the options' metadata
def test_every_field_is_an_option_with_help():
    import dataclasses

    options = generation_options()
    assert [o.name for o in options] == [f.name for f in dataclasses.fields(GenerationConfig)]
    for o in options:
        assert o.help and "\n" not in o.help and o.flag == "--" + o.name.replace("_", "-"), o.name
        assert o.check(o.default) == o.default, o.name  # each default passes its own check
        assert o.type in (int, float, bool, str, tuple)
        assert (o.choices is not None) == (o.type is str), o.name
    assert GenerationConfig() == GenerationConfig(**{o.name: o.default for o in options})
    assert {"temperature", "top_k"} <= {o.name for o in options if o.cli}  # flags because the fields exist


@pytest.mark.parametrize("name", [o.name for o in generation_options() if o.type is float])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused_everywhere(name, bad):
    """Every float option is meant finite: the config, a parsed text (CLI, web form) refuse nan and inf alike."""
    for where in (lambda: GenerationConfig(**{name: bad}), lambda: generation_option(name).parse(str(bad))):
        with pytest.raises(ConfigError) as err:
            where()
        message = str(err.value)
        assert message.startswith(f"{name}: expected a finite number") and "\n" not in message, message


@pytest.mark.parametrize("option", [o for o in generation_options() if o.type in (int, float)], ids=lambda o: o.name)
def test_bounds_are_the_metadatas(option):
    """A value just past a bound is refused with the field named; the bound itself as the metadata says."""
    for bound, inclusive, step in ((option.min, option.min_inclusive, -1), (option.max, option.max_inclusive, 1)):
        if bound is None:
            continue
        past = bound + step * (1 if option.type is int else 0.5)
        with pytest.raises(ConfigError, match=f"^{option.name}: expected "):
            option.check(option.type(past))
        assert (option.problem(option.type(bound)) is None) == inclusive, (option.name, bound)
        assert option.parse(str(option.type(bound))) == bound if inclusive else True
    if option.type is int:
        with pytest.raises(ConfigError, match=f"^{option.name}: expected an integer"):
            option.check(1.5)
        with pytest.raises(ConfigError, match=f"^{option.name}: expected an integer, got 'two'"):
            option.parse("two")
    with pytest.raises(ConfigError, match=f"^{option.name}: expected"):
        option.check(True)  # a boolean is not a number here


def test_a_parsed_text_and_a_config_refuse_in_the_same_words():
    for name, text, value in (
        ("num_beams", "0", 0),
        ("top_p", "1.5", 1.5),
        ("attention_mode", "peek", "peek"),
        ("suppress_tokens", "-4", (-4,)),
        ("do_sample", "maybe", "maybe"),
    ):
        with pytest.raises(ConfigError) as parsed:
            generation_option(name).parse(text)
        with pytest.raises(ConfigError) as built:
            GenerationConfig(**{name: value})
        assert str(parsed.value).split(", got")[0] == str(built.value).split(", got")[0], (parsed.value, built.value)
    assert generation_option("do_sample").parse(" Yes ") is True and generation_option("do_sample").parse("0") is False
    assert generation_option("suppress_tokens").parse("<unk>, 3") == ("<unk>", 3)
    assert generation_option("attention_mode").choices == ("expected", "argmax", "sample")


def test_an_unknown_option_lists_the_fields():
    with pytest.raises(ConfigError) as err:
        generation_option("beams")
    assert "unknown decoding option 'beams'" in str(err.value) and "num_beams, max_new_tokens" in str(err.value)


# ---------------------------------------------------------------------- defaults: today's search
def reference_greedy(decoder, features, max_new_tokens):
    """Greedy decoding written out plainly, one image at a time: what the loops computed before any option."""
    rows = []
    for f in features:
        state = decoder.initial_state(f[None])
        token, words = torch.tensor([BOS]), []
        for _ in range(max_new_tokens):
            logp, state, _ = decoder.step(token, state)
            token = logp.argmax(-1)
            words.append(int(token))
            if words[-1] == EOS:
                break
        rows.append(words)
    return rows


def test_defaults_give_todays_captions(decoder_of, features):
    decoder = decoder_of()
    out = generate(decoder, features, GenerationConfig(max_new_tokens=15))
    assert [caption(out, i) for i in range(len(features))] == reference_greedy(decoder, features, 15)
    neutral = dict(no_repeat_ngram_size=0, repetition_penalty=1.0, min_new_tokens=0, suppress_tokens=())
    for beams in (1, 3):
        a = generate(decoder, features, GenerationConfig(num_beams=beams, max_new_tokens=15))
        b = generate(
            decoder, features, GenerationConfig(num_beams=beams, max_new_tokens=15, num_beam_groups=1, **neutral)
        )
        assert (
            torch.equal(a.sequences, b.sequences)
            and torch.equal(a.scores, b.scores)
            and torch.equal(a.alphas, b.alphas)
        )


# ---------------------------------------------------------------------- diverse beam search
def test_one_group_is_plain_beam_search(decoder_of, features):
    decoder = decoder_of()
    a = beam_search(decoder, features, GenerationConfig(num_beams=4, num_return_sequences=4, max_new_tokens=15))
    b = beam_search(
        decoder, features, GenerationConfig(num_beams=4, num_beam_groups=1, num_return_sequences=4, max_new_tokens=15)
    )
    assert torch.equal(a.beam_sequences, b.beam_sequences) and torch.equal(a.beam_scores, b.beam_scores)


def test_diverse_groups_choose_different_words(decoder_of, features):
    decoder = decoder_of(eos=-3.0)
    plain = beam_search(decoder, features, GenerationConfig(num_beams=3, num_return_sequences=3, max_new_tokens=8))
    out = beam_search(
        decoder,
        features,
        GenerationConfig(
            num_beams=3, num_beam_groups=3, diversity_penalty=100.0, num_return_sequences=3, max_new_tokens=8
        ),
    )
    for i in range(len(features)):
        beams = out.beam_sequences[i].tolist()  # (3, T): one beam per group
        assert len({tuple(b) for b in beams}) == 3
        for t in range(min(int(n) for n in out.beam_lengths[i])):
            assert len({b[t] for b in beams}) == 3, f"image {i}, step {t}: groups chose the same word"
    # plain beam search's beams share their first words; the groups' do not
    assert any(len({b[0] for b in plain.beam_sequences[i].tolist()}) < 3 for i in range(len(features)))


def test_diverse_penalty_enters_the_scores_as_huggingface(decoder_of):
    decoder = decoder_of(eos=-3.0)
    features = torch.randn(2, L, D, generator=torch.Generator().manual_seed(3))
    small = beam_search(
        decoder,
        features,
        GenerationConfig(
            num_beams=2,
            num_beam_groups=2,
            diversity_penalty=1e-4,
            num_return_sequences=2,
            max_new_tokens=6,
            length_penalty=0.0,
        ),
    )
    greedy = greedy_search(decoder, features, GenerationConfig(max_new_tokens=6, length_penalty=0.0))
    # a vanishing penalty: each group of one beam is greedy decoding, the later group a hair lower
    for i in range(2):
        assert small.beam_sequences[i, 0].tolist()[: int(greedy.lengths[i])] == caption(greedy, i)
        assert small.beam_sequences[i, 1].tolist() == small.beam_sequences[i, 0].tolist()
        assert 0 < float(small.beam_scores[i, 0] - small.beam_scores[i, 1]) < 1e-2


# ---------------------------------------------------------------------- n-grams, repetition, length, suppression
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("beams", [1, 3])
def test_no_ngram_repeats(n, beams, features, cycle_decoder):
    decoder = cycle_decoder()
    free = generate(decoder, features, GenerationConfig(num_beams=beams, max_new_tokens=12))
    assert any(len(set(ngrams(caption(free, i), n))) < len(ngrams(caption(free, i), n)) for i in range(len(features)))
    out = generate(decoder, features, GenerationConfig(num_beams=beams, max_new_tokens=12, no_repeat_ngram_size=n))
    for i in range(len(features)):
        words = caption(out, i)
        assert len(words) > n
        assert len(set(ngrams(words, n))) == len(ngrams(words, n)), words


def test_ngram_bans_by_hand():
    prefix = torch.tensor([[4, 5, 6, 4, 5, PAD, PAD], [4, 5, 4, 5, PAD, PAD, PAD], [7, 7, 7, PAD, PAD, PAD, PAD]])
    lengths = torch.tensor([5, 4, 3])
    bans = ngram_bans(prefix, lengths, 3, V)
    assert bans[0].nonzero().flatten().tolist() == [6]  # "4 5" was followed by 6
    assert bans[1].nonzero().flatten().tolist() == [4]  # "4 5" was followed by 4
    assert bans[2].nonzero().flatten().tolist() == [7]  # "7 7" was followed by 7
    assert ngram_bans(prefix, lengths, 1, V)[1].nonzero().flatten().tolist() == [4, 5]
    assert not ngram_bans(prefix[:, :2], torch.tensor([2, 2, 2]), 3, V).any()  # too short for a trigram


def test_repetition_penalty_discourages_repeats(features, cycle_decoder):
    # a milder cycle: the penalty multiplies log p, so a word of probability near 1 (log p near 0) keeps winning
    decoder = cycle_decoder(strength=2.0)
    free = generate(decoder, features, GenerationConfig(max_new_tokens=12))
    out = generate(decoder, features, GenerationConfig(max_new_tokens=12, repetition_penalty=50.0))
    repeats = lambda o: sum(len(caption(o, i)) - len(set(caption(o, i))) for i in range(len(features)))  # noqa: E731
    assert repeats(out) < repeats(free)
    # the score is the sum of the processed log-probabilities: no better than the unpenalised caption's
    mild = generate(decoder, features, GenerationConfig(max_new_tokens=12, repetition_penalty=1.5, length_penalty=0.0))
    plain = generate(decoder, features, GenerationConfig(max_new_tokens=12, length_penalty=0.0))
    assert (mild.scores <= plain.scores + 1e-5).all()


@pytest.mark.parametrize("beams", [1, 3])
def test_min_new_tokens(decoder_of, beams, features):
    decoder = decoder_of(eos=6.0)  # EOS is the likeliest first word
    free = generate(decoder, features, GenerationConfig(num_beams=beams, max_new_tokens=15))
    assert (free.lengths < 5).any()
    out = generate(decoder, features, GenerationConfig(num_beams=beams, max_new_tokens=15, min_new_tokens=5))
    for i in range(len(features)):
        words = caption(out, i)
        assert EOS not in words[:5] and len(words) >= 6


@pytest.mark.parametrize("beams", [1, 3])
def test_suppressed_tokens_never_appear(decoder_of, beams, features):
    decoder = decoder_of()
    free = generate(decoder, features, GenerationConfig(num_beams=beams, max_new_tokens=15))
    common = sorted({t for i in range(len(features)) for t in caption(free, i) if t != EOS})[:2]
    out = generate(
        decoder, features, GenerationConfig(num_beams=beams, max_new_tokens=15, suppress_tokens=tuple(common))
    )
    assert not set(out.sequences.flatten().tolist()) & set(common)


# ---------------------------------------------------------------------- top-p
def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.3, 0.1, 0.4, 0.2]])
    logits = probs.log()
    kept = lambda p: [sorted(row.isfinite().nonzero().flatten().tolist()) for row in top_p_filter(logits, p)]  # noqa: E731
    assert kept(0.01) == [[1], [2]]  # always the likeliest
    assert kept(0.35) == [[1], [2]]
    assert kept(0.5) == [[1, 3], [0, 2]]  # 0.4 < 0.5 <= 0.7
    assert kept(0.75) == [[1, 2, 3], [0, 2, 3]]  # 0.7 < 0.75 <= 0.9
    assert kept(0.95) == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert kept(1.0) == [[0, 1, 2, 3], [0, 1, 2, 3]]
    torch.testing.assert_close(top_p_filter(logits, 0.5)[0, [1, 3]], logits[0, [1, 3]])  # kept logits unchanged


def test_top_p_sampling_draws_only_in_the_nucleus(decoder_of, features):
    decoder = decoder_of()
    config = GenerationConfig(do_sample=True, top_p=0.3, max_new_tokens=1, min_new_tokens=0)
    first = generate(decoder, features.repeat(40, 1, 1), config, torch.Generator().manual_seed(0)).sequences[:, 0]
    logp, _, _ = decoder.step(torch.full((len(features),), BOS), decoder.initial_state(features))
    allowed = top_p_filter(logp, 0.3).isfinite().repeat(40, 1)
    assert allowed.gather(1, first.unsqueeze(1)).all()
    a = generate(decoder, features, config.replace(max_new_tokens=8), torch.Generator().manual_seed(4))
    b = generate(decoder, features, config.replace(max_new_tokens=8), torch.Generator().manual_seed(4))
    assert torch.equal(a.sequences, b.sequences)  # seeded


# ---------------------------------------------------------------------- batched == one image at a time
OPTIONS = [
    dict(no_repeat_ngram_size=2),
    dict(repetition_penalty=1.3),
    dict(min_new_tokens=3),
    dict(suppress_tokens=(4, 7)),
    dict(no_repeat_ngram_size=3, repetition_penalty=1.2, min_new_tokens=2, forbid_bad_endings=True),
]


@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("options", OPTIONS + [dict(num_beam_groups=3, diversity_penalty=0.7)], ids=str)
def test_batched_equals_one_at_a_time(decoder_of, beams, options, features):
    if options.get("num_beam_groups", 1) > beams:
        pytest.skip("groups need as many beams")
    decoder = decoder_of()
    config = GenerationConfig(num_beams=beams, max_new_tokens=12, num_return_sequences=beams, **options)
    batched = generate(decoder, features, config)
    for i in range(len(features)):
        single = generate(decoder, features[i : i + 1], config)
        n = int(single.lengths[0])
        assert int(batched.lengths[i]) == n and caption(batched, i) == caption(single, 0)
        torch.testing.assert_close(batched.scores[i], single.scores[0], **float32_tolerance(single.scores, TINY_PATH))
        torch.testing.assert_close(batched.alphas[i, :n], single.alphas[0, :n], **float32_tolerance(1.0, TINY_PATH))
        if beams > 1:
            width = single.beam_sequences.size(-1)
            assert batched.beam_sequences[i, :, :width].tolist() == single.beam_sequences[0].tolist()


@pytest.mark.parametrize("beams", [1, 4])
def test_options_in_the_graphed_loop(decoder_of, beams, features):
    """The fixed-shape loop (captured on CUDA, run as it is on a CPU) gives the same captions with every option."""
    decoder = decoder_of()
    for options in OPTIONS + ([dict(num_beam_groups=2, diversity_penalty=0.5)] if beams > 1 else []):
        config = GenerationConfig(num_beams=beams, max_new_tokens=12, **options)
        plain, graphed = (
            generate(decoder, features, config),
            generate(decoder, features, config.replace(cuda_graphs=True)),
        )
        assert torch.equal(plain.sequences, graphed.sequences), options
        torch.testing.assert_close(graphed.scores, plain.scores, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------- the API and the CLI (the ONNX twin: tests/export)
@pytest.fixture(scope="module")
def images(tiny_shapes) -> list:
    from tests.helpers import shapes_test_images

    return shapes_test_images(tiny_shapes, 12)


def test_captioner_takes_every_option(tiny_checkpoint, images):
    from captioning.api import Captioner

    captioner = Captioner.from_checkpoint(tiny_checkpoint, "cpu")
    plain = captioner(images, num_beams=4, num_return_sequences=4)
    diverse = captioner(
        images,
        num_beams=4,
        num_beam_groups=2,
        diversity_penalty=2.0,
        num_return_sequences=4,
        no_repeat_ngram_size=2,
        repetition_penalty=1.2,
        min_new_tokens=3,
        suppress_tokens=["<unk>", "a"],
    )
    assert len(diverse) == len(plain)
    for r in diverse:
        assert "a" not in r["tokens"] and "<unk>" not in r["tokens"] and len(r["tokens"]) >= 4
        assert len(r["beams"]) == 4
    sampled = captioner(images, do_sample=True, top_p=0.5, generator=torch.Generator().manual_seed(0))
    assert all(r["generated_text"] for r in sampled)


def run(argv: list) -> int:
    """The exit status of the CLI (argparse's errors exit)."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--num-beam-groups", "0"], "--num-beam-groups"),
        (["--num-beam-groups", "two"], "--num-beam-groups"),
        (["--num-beams", "4", "--num-beam-groups", "2"], "--num-beam-groups > 1 needs --diversity-penalty"),
        (["--num-beams", "3", "--num-beam-groups", "2", "--diversity-penalty", "1"], "must divide --num-beams"),
        (["--diversity-penalty", "-1"], "--diversity-penalty"),
        (["--diversity-penalty", "nan"], "--diversity-penalty"),
        (["--diversity-penalty", "0.5"], "set --num-beam-groups > 1"),
        (["--no-repeat-ngram-size", "-1"], "--no-repeat-ngram-size"),
        (["--no-repeat-ngram-size", "1.5"], "--no-repeat-ngram-size"),
        (["--repetition-penalty", "0"], "--repetition-penalty"),
        (["--repetition-penalty", "inf"], "--repetition-penalty"),
        (["--top-p", "0"], "--top-p"),
        (["--top-p", "1.5"], "--top-p"),
        (["--top-p", "0.9", "--num-beams", "3"], "--top-p (0.9) applies to sampling: add --do-sample"),
        (["--top-p", "0.9", "--do-sample", "--num-beams", "2"], "--do-sample works with one beam: give --num-beams 1"),
        (["--min-new-tokens", "-3"], "--min-new-tokens"),
        (["--min-new-tokens", "40"], "--min-new-tokens (40) must be below --max-new-tokens"),
        (["--suppress-tokens", "a,,b"], "--suppress-tokens"),
        (["--suppress-tokens", "-4"], "--suppress-tokens: expected token ids >= 0"),
        (["--suppress-tokens", "<end>"], "cannot be suppressed"),
    ],
)
@pytest.mark.parametrize("command", ["caption", "attend"])
def test_wrong_flag_values_are_one_line(command, flags, message, capsys, tmp_path):
    argv = [command, str(tmp_path / "photo.png"), "--checkpoint", str(tmp_path / "missing.ckpt")] + flags
    if command == "attend":
        argv += ["--out", str(tmp_path / "out")]
    code = run(argv)
    err = capsys.readouterr().err
    assert code != 0 and message in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_evaluate_flags_are_checked(tiny_checkpoint, capsys, tmp_path):
    code = run(
        [
            "evaluate",
            "--checkpoint",
            str(tiny_checkpoint),
            "--annotations",
            str(tmp_path / "none.json"),
            "--num-beams",
            "4",
            "--num-beam-groups",
            "3",
            "--diversity-penalty",
            "1",
        ]
    )
    err = capsys.readouterr().err
    assert code != 0 and "must divide --num-beams" in err and len(err.strip().splitlines()) == 1, err


def test_config_yaml_takes_the_new_fields():
    """model.val_generation / test_generation are GenerationConfig: jsonargparse reads the new fields."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--generation", type=GenerationConfig)
    cfg = parser.parse_args(
        [
            "--generation.num_beams=4",
            "--generation.num_beam_groups=2",
            "--generation.diversity_penalty=0.5",
            "--generation.no_repeat_ngram_size=3",
            '--generation.suppress_tokens=["<unk>", 5]',
        ]
    )
    config = parser.instantiate_classes(cfg).generation
    assert (config.num_beam_groups, config.no_repeat_ngram_size, config.suppress_tokens) == (2, 3, ("<unk>", 5))
    assert math.isclose(config.diversity_penalty, 0.5) and np.isfinite(config.repetition_penalty)


def test_a_captioners_default_drops_the_beam_groups():
    """Captioner and OnnxCaptioner default to one beam: a model whose test decoding uses groups still loads."""
    config = GenerationConfig(num_beams=4, num_beam_groups=2, diversity_penalty=1.0, num_return_sequences=2).one_beam()
    assert (config.num_beams, config.num_beam_groups, config.diversity_penalty, config.num_return_sequences) == (
        1,
        1,
        0.0,
        1,
    )
