"""A subword tokenizer under DDP: rank 0 trains it on the training captions and the other ranks take
its model, so every rank holds the same vocabulary (the same ids). Two trainings need not agree: a
unigram model's token order (its ids) differs from one process to the next."""

import json

import pytest

from captioning.data.datamodule import CaptionDataModule
from captioning.tokenizers import SubwordTokenizer
from tests.e2e.test_ddp import run_script

SCRIPT = r"""
import json, os, sys
from captioning.tokenizers import SubwordTokenizer
from captioning.training.cli import run_lightning_cli

out_dir, annotations = sys.argv[1], sys.argv[2]
rank = int(os.environ.get("LOCAL_RANK", 0))
trained = []
original = SubwordTokenizer.train


def counting(self, texts):
    trained.append(rank)
    return original(self, texts)


SubwordTokenizer.train = counting
args = ["--config", "configs/shapes_soft.yaml", "--data.annotations", annotations, "--data.batch_size", "8",
        "--data.num_workers", "0", "--data.tokenizer", "unigram", "--data.vocab_size", "60",
        "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp",
        "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "0",
        "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", out_dir + "/run"]
cli = run_lightning_cli(args, run=False)
cli.trainer.fit(cli.model, datamodule=cli.datamodule)
vocab = cli.model.vocab.to_dict()
with open(f"{out_dir}/vocab-{rank}.json", "w", encoding="utf-8") as f:
    json.dump({"vocab": vocab, "trained": len(trained), "world_size": cli.trainer.world_size}, f, ensure_ascii=False)
"""


@pytest.mark.slow
def test_ddp_ranks_hold_rank_zeros_subword_vocabulary(tmp_path):
    pytest.importorskip("tokenizers")
    from captioning.data.shapes import generate

    annotations = generate(tmp_path / "data", n_train=32, n_val=2, n_test=2, seed=5, image_size=64, progress=False)
    run_script(tmp_path / "ddp", "run_ddp_tokenizer.py", SCRIPT, annotations)
    rank0, rank1 = (json.loads((tmp_path / "ddp" / f"vocab-{r}.json").read_text(encoding="utf-8")) for r in (0, 1))
    assert rank0["world_size"] == rank1["world_size"] == 2
    assert rank0["vocab"]["tokenizer"] == "unigram" and len(rank0["vocab"]["itos"]) > 20
    assert json.dumps(rank0["vocab"], sort_keys=True) == json.dumps(rank1["vocab"], sort_keys=True)
    assert (rank0["trained"], rank1["trained"]) == (1, 0)  # rank 1 took rank 0's model


class FakeStrategy:
    def __init__(self, state):
        self.state, self.calls = state, []

    def broadcast(self, obj, src=0):
        self.calls.append((obj, src))
        return self.state


class FakeTrainer:
    def __init__(self, rank, state=None):
        self.world_size, self.global_rank, self.strategy = 2, rank, FakeStrategy(state)


def test_rank_zero_trains_and_broadcasts_the_others_load(tiny_shapes, monkeypatch):
    """The datamodule's hook, without processes: rank 0 trains and sends its model; rank 1 trains
    nothing and splits the captions with the model it receives."""
    pytest.importorskip("tokenizers")
    import torch

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    zero = CaptionDataModule(str(tiny_shapes), tokenizer="bpe", vocab_size=60)
    zero.trainer = FakeTrainer(0)
    zero.setup("fit")
    sent, src = zero.trainer.strategy.calls[0]
    assert src == 0 and sent == zero.vocab.tokenizer.state() and sent["vocab_size"] == 60

    def refuse(self, texts):
        raise AssertionError("rank 1 trained its own tokenizer")

    monkeypatch.setattr(SubwordTokenizer, "train", refuse)
    one = CaptionDataModule(str(tiny_shapes), tokenizer="bpe", vocab_size=60)
    one.trainer = FakeTrainer(1, state=json.loads(json.dumps(sent)))
    one.setup("fit")
    assert one.vocab == zero.vocab and one.vocab.to_dict() == zero.vocab.to_dict()
    assert [r.tokens for r in one.all_records()] == [r.tokens for r in zero.all_records()]
