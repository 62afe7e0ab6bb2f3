"""WebDataset shards as annotations: written by `captioning prepare --to-webdataset` (or by webdataset's
own writer, as img2dataset writes them), indexed without reading an image, streamed for training with
each pair once per epoch over ranks and workers, resumed exactly, evaluated, and their problems listed."""

import io
import json
from collections import Counter
from pathlib import Path

import pytest

from captioning.cli import main
from captioning.data.captions import CaptionData
from captioning.data.formats import detect_format, load_records
from captioning.data.formats.karpathy import load_karpathy
from captioning.errors import AnnotationError, ConfigError
from tests.helpers import fit_args

wds = pytest.importorskip("webdataset", reason="the ecosystem extra: pip install -e '.[ecosystem]'")


@pytest.fixture(scope="module")
def shards(tiny_shapes, tmp_path_factory) -> Path:
    """The tiny shapes data (40/8/8 images) as shards of 16 images, written by `captioning prepare`."""
    out = tmp_path_factory.mktemp("wds") / "shards"
    assert (
        main(
            [
                "prepare",
                "--annotations",
                str(tiny_shapes),
                "--min-word-freq",
                "1",
                "--to-webdataset",
                str(out),
                "--shard-size",
                "16",
            ]
        )
        == 0
    )
    return out


def pairs_of(batches) -> Counter:
    """(image id, caption ids) of every training pair of some batches."""
    out = Counter()
    for b in batches:
        for i, row in enumerate(b["captions"]):
            out[(int(b["image_ids"][i]), tuple(row[: int(b["lengths"][i])].tolist()))] += 1
    return out


def train_loader(shards, world=1, rank=0, workers=0, batch_size=8, **kwargs):
    class Data(CaptionData):
        def replicas(self):
            return world, rank

    data = Data(str(shards), batch_size=batch_size, num_workers=workers, image_size=32, min_word_freq=1, **kwargs)
    data.setup()
    return data, data.train_dataloader()


def test_shards_hold_the_records_of_the_karpathy_file(shards, tiny_shapes):
    assert sorted(p.name for p in shards.iterdir()) == [
        "test-000000.tar",
        "train-000000.tar",
        "train-000001.tar",
        "train-000002.tar",
        "val-000000.tar",
    ]
    assert detect_format(shards) == "webdataset" and detect_format(shards / "train-000000.tar") == "webdataset"
    expected = {r.image_id: r for r in load_karpathy(tiny_shapes)}
    for spec in (
        str(shards),
        str(shards / "train-00000{0..2}.tar"),
        [str(shards / "train-000000.tar"), str(shards / "test-000000.tar")],
    ):
        records = load_records(spec)
        assert records and all(r.image_id in expected for r in records)
    records = load_records(str(shards))
    assert len(records) == 56
    for r in records:
        e = expected[r.image_id]
        assert (r.split, r.captions, r.tokens, r.objects) == (e.split, e.captions, e.tokens, e.objects)


def test_clip_scores_read_the_images_from_the_shards(shards, tiny_shapes):
    """What CLIPScore is given (the evaluator's split_images): the stored images, read from the shards."""
    from PIL import ImageChops

    from captioning.data.images import load_image
    from captioning.evaluation.split_scores import split_images

    data = CaptionData(str(shards), image_size=32, min_word_freq=1)
    files = {r.image_id: r.path for r in load_karpathy(tiny_shapes)}
    ids = [r.image_id for r in data.records("test")][:3]
    for i, image in zip(ids, split_images(data, "test")(ids)):
        expected = load_image(str(tiny_shapes.parent / files[i]))
        assert image.size == expected.size and ImageChops.difference(image, expected).getbbox() is None


def test_the_index_reads_no_image(shards, monkeypatch):
    import captioning.data.formats.webdataset as module

    def refuse(*args, **kwargs):
        raise AssertionError("an image was decoded")

    monkeypatch.setattr(module, "decode_image", refuse)
    data = CaptionData(str(shards), min_word_freq=1)
    data.setup()  # records and vocabulary from the shards' text
    assert len(data.vocab) > 4 and len(data.records("train")) == 40


@pytest.mark.parametrize("workers", [0, 2])
def test_every_pair_once_per_epoch_over_ranks_and_workers(shards, tiny_shapes, workers):
    expected = Counter()
    data = CaptionData(str(tiny_shapes), min_word_freq=1)
    data.setup()
    for r in data.records("train"):
        for t in r.tokens:
            expected[(r.image_id, tuple(data.vocab.encode(t, 30)))] += 1
    seen, steps = Counter(), []
    for rank in (0, 1):
        _, loader = train_loader(shards, world=2, rank=rank, workers=workers)
        batches = list(loader)
        assert len(batches) == len(loader)
        steps.append(len(batches))
        seen += pairs_of(batches)
    assert steps[0] == steps[1] and seen == expected  # 200 pairs: 100 per rank, none twice


def test_epochs_draw_other_orders_and_resume_exactly(shards):
    _, loader = train_loader(shards, workers=2, batch_size=6)
    first = [b["image_ids"].tolist() for b in loader]
    second = [b["image_ids"].tolist() for b in loader]
    assert first != second and sorted(sum(first, [])) == sorted(sum(second, []))
    for served in (1, 4, 9, len(first) - 1):
        _, resumed = train_loader(shards, workers=2, batch_size=6)
        resumed.load_state_dict({**loader.state_dict(), "epoch": 0, "batches": served})
        assert [b["image_ids"].tolist() for b in resumed] == first[served:]
    _, other = train_loader(shards, workers=1, batch_size=6)
    with pytest.raises(ConfigError, match="num_workers is 2 in the checkpoint, 1 here"):
        other.load_state_dict(loader.state_dict())
    with pytest.raises(ConfigError, match="bucket_by_length"):
        train_loader(shards, bucket_by_length=True)


def test_img2dataset_shards_and_their_problems(tiny_shapes, tmp_path, capsys):
    """KEY.jpg + KEY.txt (one caption) + KEY.json without a split, as img2dataset writes; then the
    problems of one set, listed in one `prepare` run."""
    from PIL import Image

    images = sorted((tiny_shapes.parent / "images" / "train").glob("*.png"))[:6]

    def jpeg(path):
        buffer = io.BytesIO()
        Image.open(path).convert("RGB").save(buffer, format="JPEG")
        return buffer.getvalue()

    with wds.TarWriter(str(tmp_path / "00000.tar")) as sink:
        for i, path in enumerate(images):
            sink.write(
                {
                    "__key__": f"{i:09d}",
                    "jpg": jpeg(path),
                    "txt": f"picture number {i}",
                    "json": json.dumps({"key": f"{i:09d}", "status": "success", "url": "http://x"}).encode(),
                }
            )
    records = load_records(str(tmp_path / "00000.tar"))
    assert [(r.split, r.captions) for r in records] == [("train", [f"picture number {i}"]) for i in range(6)]
    _, loader = train_loader(tmp_path / "00000.tar", batch_size=4)
    assert [len(b["image_ids"]) for b in loader] == [4, 2]
    _, grouped = train_loader(tmp_path / "00000.tar", batch_size=4, group_captions=True, workers=2)
    batches = list(grouped)
    assert sorted(i for b in batches for i in b["image_ids"].tolist()) == list(range(6))
    assert all(b["image_index"].tolist() == list(range(len(b["image_ids"]))) for b in batches)  # one caption each

    bad = tmp_path / "bad"
    bad.mkdir()
    with wds.TarWriter(str(bad / "00000.tar")) as sink:
        sink.write({"__key__": "a", "jpg": jpeg(images[0])})  # no caption
        sink.write({"__key__": "b", "png": b"%!PS-Adobe-3.0 EPSF-3.0\n", "txt": "an eps file"})  # refused format
        sink.write({"__key__": "c", "jpg": jpeg(images[1]), "json": b'{"caption": "x", "split": "holdout"}'})
        sink.write({"__key__": "d", "txt": "no image"})
        sink.write({"__key__": "e", "jpg": jpeg(images[2]), "txt": "fine", "json": b'{"split": "test"}'})
    assert main(["prepare", "--annotations", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "00000.tar: a: no usable captions" in err and "00000.tar: c: unknown split 'holdout'" in err
    assert "00000.tar: d: no image" in err
    assert "00000.tar: b.png: not an image of an accepted format" in err and "1 of 2 images" in err
    with pytest.raises(AnnotationError, match="00000.tar: a: no usable captions"):
        load_records(str(bad))
    with pytest.raises(AnnotationError, match="no such shard file"):
        load_records(str(tmp_path / "missing-{0..1}.tar"))


def test_fit_resume_and_evaluate_from_shards(shards, tmp_path):
    from captioning.training.cli import run_lightning_cli

    cli = run_lightning_cli(fit_args(shards, tmp_path / "run", extra=["--data.num_workers", "1"]))
    assert cli.trainer.global_step == 2
    checkpoint = cli.trainer.checkpoint_callback.last_model_path
    import torch

    state = torch.load(checkpoint, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert state["stream"] == "webdataset" and state["batches"] == 2
    metrics, results = tmp_path / "metrics.json", tmp_path / "results.json"
    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                checkpoint,
                "--annotations",
                str(shards),
                "--split",
                "test",
                "--num-beams",
                "1",
                "--max-new-tokens",
                "6",
                "--out",
                str(metrics),
                "--results",
                str(results),
            ]
        )
        == 0
    )
    assert len(json.loads(results.read_text())) == 8
    assert "object_f1" in json.dumps(json.loads(metrics.read_text()))  # the shapes' objects travel in KEY.json


def test_a_resumed_fit_sees_the_batches_the_interrupted_one_had_left(shards, tmp_path):
    """Stopped inside its second epoch (3 batches in, 2 loader workers) and resumed from last.ckpt,
    a run trains on the same batches as an uninterrupted one."""
    from lightning.pytorch.callbacks import Callback

    from captioning.training.cli import run_lightning_cli

    class Record(Callback):
        def __init__(self):
            self.batches = {}

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.batches[trainer.global_step] = (batch["image_ids"].tolist(), batch["captions"].tolist())

    def fit(root, steps, ckpt=None):
        cli = run_lightning_cli(
            fit_args(
                shards,
                root,
                extra=[
                    "--trainer.limit_train_batches",
                    "1.0",
                    "--trainer.max_epochs",
                    "2",
                    "--trainer.max_steps",
                    str(steps),
                    "--trainer.limit_val_batches",
                    "0",
                    "--data.num_workers",
                    "2",
                    "--trainer.callbacks+=ModelCheckpoint",
                    "--trainer.callbacks.every_n_train_steps",
                    "1",
                    "--trainer.callbacks.save_last",
                    "true",
                    "--trainer.callbacks.save_top_k",
                    "0",
                ],
            )[1:],
            run=False,
        )
        record = Record()
        cli.trainer.callbacks.append(record)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt)
        return record.batches

    whole = fit(tmp_path / "whole", 30)  # 200 pairs of 8: 25 steps an epoch
    fit(tmp_path / "stopped", 28)
    (last,) = (tmp_path / "stopped").rglob("last.ckpt")
    resumed = fit(tmp_path / "stopped", 30, str(last))
    assert sorted(resumed) == [28, 29] and all(resumed[s] == whole[s] for s in resumed)


#: a child that writes shards and kills itself (SIGKILL: no clean-up) as the third image is packed
KILLED_WRITER = """
import os, signal, sys
from captioning.cli import main
from captioning.data.formats import webdataset
payload, calls = webdataset._image_payload, [0]
def killing(path):
    calls[0] += 1
    if calls[0] == 3:  # two shards of one image written, the third begun
        os.kill(os.getpid(), signal.SIGKILL)
    return payload(path)
webdataset._image_payload = killing
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("existing", [False, True])
def test_a_writer_killed_between_shards_leaves_no_shard_to_trust(tiny_shapes, tmp_path, existing):
    """`prepare --to-webdataset` killed between shards (a real process): no .tar is left that a later
    `prepare` or `fit` would take for the dataset, in a new folder or in one holding other files; the
    next run writes every shard."""
    import subprocess
    import sys

    out = tmp_path / "shards"
    if existing:
        out.mkdir()
        (out / "README.md").write_text("the shards of the shapes data\n")
    argv = ["prepare", "--annotations", str(tiny_shapes), "--min-word-freq", "1", "--to-webdataset", str(out)]
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, *argv, "--shard-size", "1"], capture_output=True, timeout=300
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not list(out.glob("*.tar")) if out.exists() else not existing
    assert main([*argv, "--shard-size", "16"]) == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".tar")) == (["README.md"] if existing else [])
    records = load_records(str(out))
    assert len(records) == len(load_records(str(tiny_shapes)))
