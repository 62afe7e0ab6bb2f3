"""Files of earlier versions: every compatibility promise the project keeps, in one place.

A checkpoint, model folder, ONNX folder, vocabulary, config or import written for an earlier version
may lack something this version records, or spell it differently. Each such case is one entry of
this module, and the code that reads the file takes the meaning from here (tests/test_compat.py
holds each promise against its reader):

- a model file that records no resize interpolation: :data:`UNRECORDED_INTERPOLATION`
  (``ModelSpec.from_dict``, for checkpoints, model folders and ONNX folders alike);
- a model file that records no decoder kind: :data:`UNRECORDED_DECODER_KIND`, the paper's LSTM
  (``DecoderConfig.kind``'s default);
- a decoder config of the time when every kind shared one config: the other kinds' fields it
  holds at their unset or only accepted values are dropped (:data:`SHARED_DECODER_FIELDS`,
  :func:`decoder_fields`; models/kinds.py);
- an LSTM decoder's weights stored fused under earlier names: storage/paper_names.py;
- a vocabulary that records no tokenizer: :data:`UNRECORDED_TOKENIZER` (``Vocabulary.from_dict``);
- a vocabulary that records no tokenizer version: :data:`UNRECORDED_TOKENIZER_VERSION`, the word
  pattern of nltk 3.10.4's ``RegexpTokenizer`` (``Vocabulary.from_dict``, tokenizers.py ``word_pattern``);
- a checkpoint's names of the model description's fields, ``test_generation`` for the default
  decoding: :data:`CHECKPOINT_SPEC_KEYS` (storage/checkpoint.py);
- ``HardAttentionReinforce`` with ``estimator: gumbel``, the Gumbel objective's earlier spelling, in a
  config or a checkpoint: :func:`objective_spelling` (objectives/__init__.py, training/cli.py);
- running state an objective gained after the first checkpoints: filled with its start value
  (:data:`NEWER_OBJECTIVE_STATE`, objectives/hard.py); REINFORCE's running state in a checkpoint of
  that earlier Gumbel spelling: dropped (:data:`GUMBEL_DROPPED_STATE`, objectives/gumbel.py);
- a checkpoint without its own model card: one is made from Lightning's state
  (storage/checkpoint.py ``checkpoint_card``);
- a checkpoint that does not record a setting ``--ckpt_path`` resuming compares: that setting is not
  compared (training/resume.py ``SETTINGS``);
- import paths of earlier versions: :data:`OLD_IMPORT_PATHS`;
- a feature-cache index that records no stored dtype: :data:`UNRECORDED_FEATURE_DTYPE` (data/features/reader.py:
  the reader before ``extract-features --dtype`` took every cache as float16 ``.f16`` files, whatever
  its index said); caches of that version read as they are, unpooled.

A promise is dropped by deleting its entry here and what reads it; nothing else keeps one.
"""

from __future__ import annotations

#: the resize of every model written before the interpolation was recorded
UNRECORDED_INTERPOLATION = "bilinear"
#: the decoder of every model file written before decoder kinds existed
UNRECORDED_DECODER_KIND = "lstm"
#: the tokenizer of every vocabulary written before tokenizers were recorded
UNRECORDED_TOKENIZER = "words"
#: the word pattern of every vocabulary written before the version was recorded (nltk 3.10.4's, with the
#: regex engine's word characters); it applies to words, chars and jieba alike
UNRECORDED_TOKENIZER_VERSION = 1
#: the stored dtype of a feature cache whose index records none (before --dtype every cache was float16)
UNRECORDED_FEATURE_DTYPE = "float16"

#: fields every decoder config held when the kinds shared one config: kind -> {field: the values
#: it could hold there} (None: unset); a field of the other kind at such a value is dropped
SHARED_DECODER_FIELDS = {
    "lstm": {
        f: (None,) for f in ("layers", "ff_dim", "positions", "tie_embeddings", "max_positions", "attention_layer")
    },
    "transformer": {
        "attention_kind": ("soft",),
        "placement": ("bahdanau",),
        "window": ("global",),
        "score": ("additive",),
        "prev2out": (True,),
        "ctx2out": (True,),
        "compile_step": (False,),
        "local_sigma": (1.5,),
        "attention_dim": "any",
        **{f: (None,) for f in ("layers", "positions", "tie_embeddings", "max_positions")},
    },
}


def decoder_fields(data: dict) -> dict:
    """A decoder config dictionary without the fields :data:`SHARED_DECODER_FIELDS` drops (and a
    transformer's ``embed_dim``, which had to equal its ``hidden_dim``)."""
    kind = data.get("kind", UNRECORDED_DECODER_KIND)
    shared = SHARED_DECODER_FIELDS.get(kind, {})
    out = {k: v for k, v in data.items() if not (k in shared and (shared[k] == "any" or v in shared[k]))}
    if kind == "transformer" and "embed_dim" in out and out["embed_dim"] == out.get("hidden_dim", 512):
        del out["embed_dim"]
    return out


#: a checkpoint's hyperparameter names -> the ModelSpec fields they hold (the module's
#: ``test_generation`` is the model's default decoding)
CHECKPOINT_SPEC_KEYS = {
    "encoder": "encoder",
    "decoder": "decoder",
    "image_size": "image_size",
    "test_generation": "generation",
}

#: running state (buffers) each hard-attention objective gained after its first checkpoints, by
#: class name: a checkpoint without it loads with the buffer's start value
NEWER_OBJECTIVE_STATE: dict[str, tuple[str, ...]] = {
    "HardAttentionObjective": ("steps_done",),
    "HardAttentionReinforce": ("advantage_var", "steps_done", "baseline_weight", "baseline_bias"),
}
#: REINFORCE's running state, never updated by the Gumbel estimator, that a checkpoint of
#: ``HardAttentionReinforce(estimator="gumbel")`` holds: dropped when a HardAttentionGumbel loads it
GUMBEL_DROPPED_STATE = ("advantage_var", "baseline_weight", "baseline_bias")

#: the earlier spelling of the Gumbel objective: (class name, estimator) -> the class path now
OLD_GUMBEL_SPELLING = ("HardAttentionReinforce", "gumbel")
GUMBEL_CLASS_PATH = "captioning.objectives.HardAttentionGumbel"

#: import paths of earlier versions that still work: old module (or module.name) -> where it lives now
OLD_IMPORT_PATHS = {
    "captioning.decoding.search.GenerationConfig": "captioning.decoding.generation.GenerationConfig",
    "captioning.decoding.search.BAD_ENDINGS": "captioning.decoding.generation.BAD_ENDINGS",
    "captioning.decoding.search.bad_ending_ids": "captioning.decoding.generation.bad_ending_ids",
}


def objective_spelling(class_path: str, init_args: dict, accepted: set[str] | frozenset[str]) -> tuple[str, dict]:
    """(class_path, init_args) of an objective entry in this version's spelling.

    ``HardAttentionReinforce`` with ``estimator: gumbel`` becomes :data:`GUMBEL_CLASS_PATH` with the
    settings in ``accepted`` (the ones the Gumbel objective takes); REINFORCE's own (lambda_r and the
    baseline's) were unused by that estimator and are dropped. Every other entry is returned as it is."""
    name, estimator = OLD_GUMBEL_SPELLING
    if class_path.rsplit(".", 1)[-1] != name or init_args.get("estimator") != estimator:
        return class_path, init_args
    return GUMBEL_CLASS_PATH, {k: v for k, v in init_args.items() if k in accepted}
