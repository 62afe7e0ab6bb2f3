"""Self-critical sequence training: the in-process CIDEr-D reward, the baselines, the gradient's
direction, starting from a cross-entropy checkpoint, the SCST configs, and forbidding bad endings."""

from pathlib import Path

import numpy as np
import pytest
import torch

from captioning.decoding.search import BAD_ENDINGS, GenerationConfig, bad_ending_ids
from captioning.metrics.ptb import ptb_tokenize, tokenize_corpus
from captioning.objectives import SCST, objective_from_spec
from captioning.objectives.cross_entropy import caption_log_likelihood
from captioning.objectives.scst import bad_ending_rate, mean_of_others
from captioning.tokenizers import tokenize
from captioning.vocab import Vocabulary
from tests.helpers import ROOT, fit_args

SCST_CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("scst_*.yaml"))

# Raw references, as an annotation file holds them (case, punctuation): tokenised as the evaluation does.
REFERENCES = {
    11: ["A man riding a horse on a beach.", "A person rides a horse along the shore.", "Man on a horse, at the beach"],
    12: ["Two dogs playing in the snow.", "Dogs run through snow!", "A pair of dogs play in the snow."],
    13: ["A plate of food with broccoli and rice.", "A white plate of rice and broccoli."],
    14: ["A cat sleeping on a red couch.", "The cat's asleep on a couch."],
}
CANDIDATES = {  # what a model might write (its words, lower case): one per image
    11: "a man riding a horse on a beach",
    12: "two dogs in the snow",
    13: "a plate of rice and broccoli and rice with food",
    14: "a cat 's couch",
}


def vocabulary() -> Vocabulary:
    words = [w for caps in REFERENCES.values() for c in caps for w in tokenize(c)]
    words += [w for c in CANDIDATES.values() for w in c.split()]
    return Vocabulary.build([words], min_freq=1)


def encode(vocab: Vocabulary, captions) -> torch.Tensor:
    """Rows of word ids, EOS, PAD (a generation output's ``sequences``)."""
    rows = [vocab.encode(c.split())[1:] for c in captions]
    out = torch.full((len(rows), max(map(len, rows))), vocab.pad_id)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def scst_with_references(**settings) -> SCST:
    objective = SCST(**settings)
    objective.set_references(REFERENCES)
    return objective


# --------------------------------------------------------------------------- the reward
def test_reward_equals_pycocoevalcap_cider():
    """The reward path (token ids -> caption -> PTB tokens -> CIDEr-D) equals pycocoevalcap's Cider
    given the same references (its document frequencies then come from those references)."""
    from pycocoevalcap.cider.cider import Cider

    vocab, objective = vocabulary(), scst_with_references()
    ids = list(REFERENCES)
    rewards, words = objective.rewards(
        vocab, encode(vocab, [CANDIDATES[i] for i in ids]), [objective._references[i] for i in ids]
    )
    gts = tokenize_corpus(REFERENCES)
    res = {i: [ptb_tokenize(CANDIDATES[i])] for i in ids}
    _, expected = Cider().compute_score(gts, res)
    assert rewards.shape == (len(ids),) and words[0] == CANDIDATES[11].split()
    np.testing.assert_allclose(rewards, expected, rtol=0, atol=1e-6)
    assert rewards[0] > 1.0  # the candidate that equals a reference


TRICKY_WORDS = (
    "a dog's doesn't can't won't shan't they're we'll i'm you've he'd o'clock y'all t-shirt e-mail "
    "well-known 3-year-old mother-in-law's cannot gonna wanna gotta 'tis café naïve résumé москва οδος 3 "
    "50 it's james ca n't u.s. at&t c++ <unk> 5 7/8 $5.50 mr. etc. no. the end dogs' ' x:d"
).split()


def test_per_word_ptb_tokens_equal_the_whole_captions():
    """The reward tokenises captions from their words' cached PTB tokens: the same as the
    evaluation's tokenisation of the whole caption (words it cannot vouch for fall back to that)."""
    import random

    objective, rng = SCST(), random.Random(0)
    fell_back = 0
    for _ in range(3000):
        words = rng.choices(TRICKY_WORDS, k=rng.randint(0, 10))
        fast = objective._ptb_tokens(words)
        fell_back += fast is None
        if fast is not None:
            assert fast == ptb_tokenize(" ".join(words)), words
    assert 0 < fell_back < 3000


def test_a_reference_scores_above_another_caption():
    vocab, objective = vocabulary(), scst_with_references()
    refs = objective._references[12]
    rewards, _ = objective.rewards(
        vocab, encode(vocab, ["two dogs playing in the snow", "two dogs on a beach"]), [refs, refs]
    )
    assert rewards[0] > rewards[1] > 0


def test_mean_baseline_excludes_the_sample():
    rewards = torch.tensor([[1.0, 2.0, 6.0], [0.0, 0.0, 3.0]])
    baseline = mean_of_others(rewards)
    torch.testing.assert_close(baseline, torch.tensor([[4.0, 3.5, 1.5], [1.5, 1.5, 0.0]]))
    changed = rewards.clone()
    changed[0, 2] = 100.0  # a sample's own reward does not move its baseline
    assert mean_of_others(changed)[0, 2] == baseline[0, 2]
    assert (mean_of_others(changed)[0, :2] > baseline[0, :2]).all()


def test_settings_are_checked_and_kept():
    from captioning.errors import ConfigError

    with pytest.raises(ConfigError, match="baseline"):
        SCST(baseline="best")
    with pytest.raises(ConfigError, match="num_samples >= 2"):
        SCST(num_samples=1, baseline="mean")
    with pytest.raises(ConfigError, match="max_new_tokens"):
        SCST(max_new_tokens=0)
    spec = SCST(num_samples=3, baseline="mean").spec()
    assert spec["class_path"] == "captioning.objectives.scst.SCST"
    assert objective_from_spec(spec).settings == spec["init_args"]
    with pytest.raises(ConfigError, match="training references"):
        _ = SCST().cider


# --------------------------------------------------------------------------- the gradient
@pytest.fixture
def model_of(tiny_model):
    """conftest's tiny_model with a one-stage CNN, writing this file's vocabulary."""
    return lambda kind: tiny_model(kind, encoder={"channels": (4,)}, vocab=vocabulary())


def sample_log_p(model, features, sequences, lengths, locations, hard) -> torch.Tensor:
    captions = torch.cat([torch.full((sequences.size(0), 1), Vocabulary.bos_id), sequences], 1)
    with torch.no_grad():
        out = model(features, captions, lengths + 1, **(dict(mode="sample", locations=locations) if hard else {}))
        log_p = caption_log_likelihood(out.logits, captions[:, 1:], out.mask)
        return log_p + (out.location_log_probs * out.mask).sum(1) if hard else log_p


@pytest.mark.parametrize("kind", ["soft", "hard"])
@pytest.mark.parametrize("baseline", ["greedy", "mean"])
def test_a_step_raises_a_sample_with_positive_advantage_and_lowers_one_with_negative(kind, baseline, model_of):
    model = model_of(kind)
    objective = scst_with_references(num_samples=8, baseline=baseline, max_new_tokens=6)
    features = torch.randn(2, 4, model.encoder.out_dim)
    batch = {"image_ids": torch.tensor([11, 12])}
    torch.manual_seed(1)
    out = objective(model, features, batch)
    s = out.state
    advantage = s["advantage"]
    assert (advantage > 0).any() and (advantage < 0).any()
    assert out.batch_size == 16 and torch.isfinite(out.loss)
    before = sample_log_p(
        model, features.repeat_interleave(8, 0), s["sequences"], s["lengths"], s["locations"], kind == "hard"
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    after = sample_log_p(
        model, features.repeat_interleave(8, 0), s["sequences"], s["lengths"], s["locations"], kind == "hard"
    )
    change = after - before
    best, worst = int(advantage.argmax()), int(advantage.argmin())
    assert change[best] > 0 and change[best] > change[worst], (advantage, change)
    if baseline == "mean":  # advantages sum to 0 per image: the worst sample loses probability outright
        assert change[worst] < 0, (advantage, change)
    # (with the greedy baseline most samples may beat a poor greedy caption, and the shared weights
    # can lift a slightly negative one too; its change is still below the best's)
    assert (change * advantage).sum() > 0  # overall towards the samples that beat the baseline


def test_logs_what_a_user_watches(model_of):
    model = model_of("soft")
    objective = scst_with_references(num_samples=4, baseline="greedy", max_new_tokens=6)
    torch.manual_seed(2)
    out = objective(model, torch.randn(2, 4, model.encoder.out_dim), {"image_ids": torch.tensor([11, 12])})
    for key in ("reward", "baseline", "advantage", "greedy_cider", "bad_endings", "sample_bad_endings"):
        assert key in out.logs and torch.isfinite(out.logs[key]), key
    # the greedy baseline is the greedy caption's reward, which is also what greedy_cider reports
    assert out.logs["baseline"] == pytest.approx(float(out.logs["greedy_cider"]), abs=1e-6)
    assert out.logs["advantage"] == pytest.approx(float(out.logs["reward"] - out.logs["baseline"]), abs=1e-5)


def test_bad_ending_rate_and_forbidding_bad_endings(model_of):
    assert bad_ending_rate([["a", "man", "riding", "a"], ["a", "dog", "with"], ["a", "dog"], []]) == 0.5
    assert {"a", "the", "with", "of", "and"} <= BAD_ENDINGS and "up" not in BAD_ENDINGS
    model = model_of("soft")
    vocab = model.vocab
    features = torch.randn(16, 4, model.encoder.out_dim)
    with torch.no_grad():  # make "a" likely everywhere, and EOS likely right after it
        bias = model.decoder.L_o.bias
        bias.zero_()
        bias[vocab.stoi["a"]] = 4.0
        bias[vocab.eos_id] = 3.0
    config = GenerationConfig(max_new_tokens=8, do_sample=True)
    torch.manual_seed(0)
    plain = [vocab.decode(r) for r in model.generate(features=features, config=config).sequences.tolist()]
    assert bad_ending_rate(plain) > 0.1
    assert model.decoder.bad_ending_ids == bad_ending_ids(vocab)  # the model sets them when it is built
    model.decoder.bad_ending_ids = None  # a decoder that does not know its words cannot forbid them
    with pytest.raises(Exception, match="vocabulary"):
        model.generate(features=features, config=config.replace(forbid_bad_endings=True))
    model.decoder.bad_ending_ids = bad_ending_ids(vocab)
    out = model.generate(features=features, config=config.replace(forbid_bad_endings=True))
    sampled = [
        w
        for w, row in zip((vocab.decode(r) for r in out.sequences.tolist()), out.sequences.tolist())
        if vocab.eos_id in row
    ]
    assert sampled and bad_ending_rate(sampled) == 0.0

    # Greedy and beam search: a decoder whose best continuation of "a" is EOS, then "dog".
    real_step, a, dog = model.decoder.step, vocab.stoi["a"], vocab.stoi["dogs"]

    def step(tokens, state, mode=None, attention_temperature=1.0):
        logp, state, g = real_step(tokens, state, mode, attention_temperature)
        scores = torch.full_like(logp, -20.0)
        scores[:, a] = torch.where(tokens == vocab.bos_id, 0.0, -20.0)
        scores[:, vocab.eos_id] = torch.where(tokens == a, -0.1, torch.where(tokens == dog, 0.0, -20.0))
        scores[:, dog] = torch.where(tokens == a, -3.0, -20.0)
        return scores.log_softmax(-1), state, g

    model.decoder.step = step
    for c in (GenerationConfig(max_new_tokens=8), GenerationConfig(num_beams=3, max_new_tokens=8)):
        assert model.decode_text(model.generate(features=features[:2], config=c).sequences) == ["a"] * 2
        out = model.generate(features=features[:2], config=c.replace(forbid_bad_endings=True))
        assert model.decode_text(out.sequences) == ["a dogs"] * 2, c


# --------------------------------------------------------------------------- the training stage
def test_fit_from_a_cross_entropy_checkpoint_and_resume(tiny_shapes, tiny_checkpoint, tmp_path):
    from captioning.storage.load import load_model
    from captioning.training.cli import run_lightning_cli

    ce = torch.load(tiny_checkpoint, weights_only=True)
    cli = run_lightning_cli(
        fit_args(
            tiny_shapes,
            tmp_path / "a",
            config="scst_shapes_soft.yaml",
            steps=2,
            extra=["--model.init_from", str(tiny_checkpoint), "--trainer.max_steps", "0"],
        )
    )
    # max_steps 0: nothing trained, so the weights are the checkpoint's
    for k, v in cli.model.state_dict().items():
        assert torch.equal(v, ce["state_dict"][k]), k
    assert cli.model.vocab.to_dict() == ce["vocabulary"]

    cli = run_lightning_cli(
        fit_args(
            tiny_shapes,
            tmp_path / "b",
            config="scst_shapes_soft.yaml",
            steps=2,
            extra=["--model.init_from", str(tiny_checkpoint), "--model.objective.init_args.baseline", "mean"],
        )
    )
    assert cli.trainer.global_step == 2
    metrics = cli.trainer.callback_metrics
    for key in ("reward", "baseline", "advantage", "greedy_cider", "bad_endings"):
        assert f"train/{key}" in metrics, key
    assert "val/CIDEr" in metrics
    last = Path(cli.trainer.checkpoint_callback.last_model_path)
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["hyper_parameters"]["init_from"] == str(tiny_checkpoint)
    assert ckpt["hyper_parameters"]["objective"]["init_args"]["baseline"] == "mean"
    state = ckpt["objective_state"]["cider_d"]
    assert state["num_images"] == 40  # the training split's references
    model = load_model(last)  # the evaluation and the API read it like any other checkpoint
    assert model.vocab.to_dict() == ce["vocabulary"]

    # a resumed run takes the document frequencies from the checkpoint, not from the data
    objective = cli.model.objective
    candidates, refs = ["a small red circle"], [list(objective._references.values())[0]]
    expected = objective.cider.scores(candidates, refs)
    assert ckpt["global_step"] == 2  # last.ckpt is the run's end (written after each validation)
    cli = run_lightning_cli(
        fit_args(
            tiny_shapes,
            tmp_path / "b",
            config="scst_shapes_soft.yaml",
            steps=3,
            extra=[
                "--model.init_from",
                str(tmp_path / "missing.ckpt"),
                "--ckpt_path",
                str(last),
                "--trainer.max_epochs",
                "2",
            ],
        )
    )
    assert cli.trainer.global_step == 5  # epoch 0's 2 steps, then epoch 1's 3
    np.testing.assert_array_equal(cli.model.objective.cider.scores(candidates, refs), expected)
    assert cli.model.objective.cider.num_images == 40


def test_init_from_another_vocabulary_or_architecture_is_a_one_line_error(
    tiny_shapes, tiny_checkpoint, tmp_path, capsys
):
    from captioning.cli import main

    args = fit_args(
        tiny_shapes,
        tmp_path,
        config="scst_shapes_soft.yaml",
        steps=1,
        extra=["--model.init_from", str(tiny_checkpoint), "--data.min_word_freq", "3"],
    )
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "vocabulary" in err and "Traceback" not in err, err

    args = fit_args(
        tiny_shapes,
        tmp_path,
        config="scst_shapes_soft.yaml",
        steps=1,
        extra=["--model.init_from", str(tiny_checkpoint), "--model.decoder.hidden_dim", "64"],
    )
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "architecture" in err and "decoder.hidden_dim" in err, err

    args = fit_args(
        tiny_shapes,
        tmp_path,
        config="scst_shapes_hard.yaml",
        steps=1,
        extra=["--model.init_from", str(tiny_checkpoint)],
    )
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "attention_kind" in err, err

    assert (
        main(
            fit_args(
                tiny_shapes,
                tmp_path,
                config="scst_shapes_soft.yaml",
                steps=1,
                extra=["--model.init_from", str(tmp_path / "none.ckpt")],
            )
        )
        == 1
    )
    assert "no such file" in capsys.readouterr().err


def test_objective_by_class_name_in_any_config(tiny_shapes, tiny_checkpoint, tmp_path):
    from captioning.training.cli import run_lightning_cli

    cli = run_lightning_cli(
        fit_args(
            tiny_shapes,
            tmp_path,
            config="shapes_soft.yaml",
            steps=2,
            extra=[
                "--model.objective",
                "SCST",
                "--model.objective.init_args.num_samples",
                "2",
                "--model.init_from",
                str(tiny_checkpoint),
            ],
        )
    )
    assert isinstance(cli.model.objective, SCST) and cli.model.objective.num_samples == 2
    assert cli.trainer.global_step == 2


def test_shapes_configs_are_the_demo_models_with_scst():
    import yaml

    for kind in ("soft", "hard"):
        scst = yaml.safe_load((ROOT / "configs" / f"scst_shapes_{kind}.yaml").read_text())
        ce = yaml.safe_load((ROOT / "configs" / f"shapes_{kind}.yaml").read_text())
        for group in ("encoder", "decoder"):
            assert scst["model"][group] == ce["model"][group], (kind, group)
        assert {k: v for k, v in scst["data"].items() if k != "batch_size"} == {
            k: v for k, v in ce["data"].items() if k != "batch_size"
        }
        assert scst["model"]["objective"]["class_path"] == "captioning.objectives.SCST"


@pytest.mark.parametrize("config", SCST_CONFIGS)
def test_every_scst_config_fits_a_step(config, tiny_shapes, tmp_path):
    """Every SCST config takes a fit step (the real-data ones on tiny shapes data, their ResNet-101
    at random weights and a 2 x 2 grid; from scratch: init_from is the user's)."""
    from captioning.training.cli import run_lightning_cli

    extra = []
    if "shapes" not in config:
        extra = [
            "--model.encoder.pretrained",
            "false",
            "--model.encoder.grid_size",
            "2",
            "--data.image_size",
            "64",
            "--data.min_word_freq",
            "1",
            "--data.images_root",
            str(tiny_shapes.parent),
            "--data.pin_memory",
            "false",
            "--data.eval_batch_size",
            "2",
            "--data.batch_size",
            "2",
            "--trainer.devices",
            "1",
            "--model.objective.init_args.max_new_tokens",
            "6",
        ]
    cli = run_lightning_cli(fit_args(tiny_shapes, tmp_path, config=config, steps=2, extra=extra))
    assert cli.trainer.global_step == 2
    assert isinstance(cli.model.objective, SCST)
    if "shapes" not in config:
        h = cli.model.hparams
        assert h.optimizer["lr"] == 5e-5 and h.objective["init_args"]["baseline"] == "mean"
        assert h.objective["init_args"]["num_samples"] == 5 and cli.datamodule.group_captions


def test_bf16_autocast_and_grouped_batches(tiny_shapes, tiny_checkpoint, tmp_path):
    from captioning.training.cli import run_lightning_cli

    cli = run_lightning_cli(
        fit_args(
            tiny_shapes,
            tmp_path,
            config="scst_shapes_soft.yaml",
            steps=2,
            extra=[
                "--model.init_from",
                str(tiny_checkpoint),
                "--trainer.precision",
                "bf16-mixed",
                "--data.group_captions",
                "true",
                "--data.batch_size",
                "4",
            ],
        )
    )
    assert cli.trainer.global_step == 2
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


DDP_SCRIPT = r"""
import hashlib, json, sys
import torch.distributed as dist
from captioning.training.cli import run_lightning_cli

out_dir, annotations, ckpt = sys.argv[1], sys.argv[2], sys.argv[3]
args = ["--config", "configs/scst_shapes_soft.yaml", "--data.annotations", annotations, "--data.batch_size", "4",
        "--data.num_workers", "0", "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp",
        "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1",
        "--trainer.logger", "false", "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", out_dir + "/run",
        "--model.init_from", ckpt, "--model.objective.init_args.max_new_tokens", "8",
        "--model.val_generation.max_new_tokens", "8"]
cli = run_lightning_cli(args, run=False)  # (the ddp launcher re-runs this script with sys.argv as it is then)
cli.trainer.fit(cli.model, datamodule=cli.datamodule)
objective, rank = cli.model.objective, dist.get_rank()
state = json.dumps(objective.cider.state_dict(), sort_keys=True)
with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump({"df": hashlib.sha256(state.encode()).hexdigest(), "global_step": cli.trainer.global_step,
               "world_size": cli.trainer.world_size,
               "reward": objective.cider.scores(["a small red circle"], [next(iter(objective._references.values()))]).tolist()}, f)
"""


def test_ddp_two_processes_same_document_frequencies(tiny_shapes, tiny_checkpoint, tmp_path):
    """2 gloo processes train SCST: each rewards its own samples (no gather), with the same
    document frequencies (computed on each rank from the same training references)."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "ddp_scst.py"
    script.write_text(DDP_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(tiny_shapes), str(tiny_checkpoint)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["world_size"] == 2 and ranks[0]["global_step"] == 3
    assert ranks[0]["df"] == ranks[1]["df"] and ranks[0]["reward"] == ranks[1]["reward"]
