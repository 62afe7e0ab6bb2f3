"""Files of earlier versions: every compatibility promise the project keeps, in one place.

A checkpoint, model folder, ONNX folder, vocabulary, config or import written for an earlier version
may lack something this version records, or spell it differently. Each such case is one entry of
this module, and the code that reads the file takes the meaning from here (tests/test_compat.py
holds each promise against its reader). The entries: the values of fields old files do not record
(:data:`UNRECORDED_INTERPOLATION`, :data:`UNRECORDED_DECODER_KIND`, :data:`UNRECORDED_TOKENIZER`,
:data:`UNRECORDED_TOKENIZER_VERSION`, :data:`UNRECORDED_FEATURE_DTYPE`), a decoder config of the time
when every kind shared one (:data:`SHARED_DECODER_FIELDS`, :func:`decoder_fields`), a checkpoint's
field names (:data:`CHECKPOINT_SPEC_KEYS`), an objective's earlier spelling and state
(:func:`objective_spelling`, :data:`NEWER_OBJECTIVE_STATE`, :data:`GUMBEL_DROPPED_STATE`) and import
paths (:data:`OLD_IMPORT_PATHS`). Old LSTM weight names are converted in storage/paper_names.py,
checkpoints without a model card get one in storage/checkpoint.py, and settings an old checkpoint
does not record are not compared on resume (training/resume.py).

Each promise, the file it concerns and the code that reads it: docs/COMPATIBILITY.md. A promise is
dropped by deleting its entry here and what reads it; nothing else keeps one.
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
