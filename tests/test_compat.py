"""Each compatibility promise of captioning/compat.py, held against the code that reads old files."""

import importlib

import torch

from captioning import compat
from captioning.models.spec import ModelSpec
from captioning.objectives import HardAttentionGumbel, HardAttentionReinforce, objective_from_spec
from captioning.storage import checkpoint
from captioning.vocab import Vocabulary


def _resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_promise_is_listed_in_the_module_docstring():
    names = [n for n in vars(compat) if n.isupper() or n == "objective_spelling"]
    assert names
    missing = [n for n in names if n not in compat.__doc__ and n not in ("OLD_GUMBEL_SPELLING", "GUMBEL_CLASS_PATH")]
    assert not missing, f"compat.py entries the docstring does not list: {missing}"


def test_a_model_file_without_interpolation_or_decoder_kind():
    plain = ModelSpec().to_dict()
    plain.pop("interpolation")
    plain["decoder"].pop("kind", None)
    spec = ModelSpec.from_dict(plain)
    assert spec.interpolation == compat.UNRECORDED_INTERPOLATION
    assert spec.decoder.kind == compat.UNRECORDED_DECODER_KIND


def test_a_vocabulary_without_a_tokenizer():
    plain = Vocabulary(["<pad>", "<start>", "<end>", "<unk>", "a", "cat"]).to_dict()
    plain.pop("tokenizer", None)
    assert Vocabulary.from_dict(plain).tokenizer.name == compat.UNRECORDED_TOKENIZER


def test_a_checkpoint_names_the_default_decoding_test_generation():
    assert checkpoint.SPEC_KEYS is compat.CHECKPOINT_SPEC_KEYS
    assert compat.CHECKPOINT_SPEC_KEYS["test_generation"] == "generation"


def test_the_gumbel_objectives_earlier_spelling():
    old = {
        "class_path": "captioning.objectives.HardAttentionReinforce",
        "init_args": {"estimator": "gumbel", "gumbel_temperature": 0.5, "lambda_r": 0.3},
    }
    objective = objective_from_spec(old)
    assert type(objective) is HardAttentionGumbel and objective.gumbel_temperature == 0.5
    same = {"class_path": "captioning.objectives.HardAttentionReinforce", "init_args": {"lambda_r": 0.3}}
    assert type(objective_from_spec(same)) is HardAttentionReinforce  # the current spelling is left alone


def test_objective_state_added_later_is_filled_and_foreign_state_dropped():
    reinforce = HardAttentionReinforce()
    state = {
        k: v
        for k, v in reinforce.state_dict().items()
        if k not in compat.NEWER_OBJECTIVE_STATE[type(reinforce).__name__]
    }
    assert "baseline" in state
    fresh = HardAttentionReinforce()
    fresh.load_state_dict(state)  # strict: the missing buffers are filled with their start values
    assert int(fresh.steps_done) == 0
    gumbel = HardAttentionGumbel()
    old_gumbel_run = {**gumbel.state_dict(), **{k: torch.zeros(()) for k in compat.GUMBEL_DROPPED_STATE}}
    HardAttentionGumbel().load_state_dict(old_gumbel_run)  # strict: REINFORCE's state is dropped


def test_old_import_paths_name_the_same_objects():
    for old, new in compat.OLD_IMPORT_PATHS.items():
        assert _resolve(old) is _resolve(new), old


def test_a_feature_cache_index_without_a_dtype(tmp_path):
    import json
    import shutil
    from pathlib import Path

    from captioning.data.features.reader import FeatureCache

    fixture = Path(__file__).parent / "fixtures" / "feature_cache_6af4865"  # written by commit 6af4865's writer
    shutil.copytree(fixture, tmp_path / "cache")
    index = tmp_path / "cache" / "part-000-of-001.index.json"
    plain = json.loads(index.read_text())
    plain.pop("dtype")
    index.write_text(json.dumps(plain))
    cache = FeatureCache(tmp_path / "cache")
    assert cache.dtype == compat.UNRECORDED_FEATURE_DTYPE and cache[5].dtype == torch.float16
