"""Captioning with the ONNX graphs of ``captioning export --format onnx``: onnxruntime and numpy only.

Nothing here imports PyTorch, so a machine without it captions with

    from captioning.export.onnx_captioner import OnnxCaptioner
    captioner = OnnxCaptioner("model_onnx")
    [out] = captioner("photo.jpg", num_beams=3, return_attention=True)
    out["generated_text"], out["score"], out["attention"].shape   # (T, gh, gw)

or ``captioning caption --onnx model_onnx photo.jpg``. The results are those of
:class:`captioning.api.Captioner` (same keys), from the same preprocessing (data/images.py) and the
same search as decoding/search.py's, step for step in numpy (scores in float32), with each logits
processor's numpy twin (decoding/processors/). Sampling, diverse beam search and a processor
without a twin are PyTorch's only: :data:`ONNX_OPTIONS` records the decision for every decoding
option. The search carries the decoder's state as the named arrays of config.json's ``onnx.state``
(docs/SHARING.md, "ONNX", describes them).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from captioning.common import grid_shape
from captioning.data.images import DEFAULT_INTERPOLATION, as_rgb, check_interpolation, to_array
from captioning.decoding.generation import GenerationConfig, bad_ending_ids, generation_options
from captioning.decoding.processors import PROCESSORS, Context, LogitsProcessor
from captioning.errors import CheckpointError, ConfigError
from captioning.plugins import load_plugins
from captioning.storage.hub import resolve_folder
from captioning.storage.layout import ENCODER_ONNX, read_config, read_vocab
from captioning.vocab import Vocabulary

BOS, EOS, PAD = Vocabulary.bos_id, Vocabulary.eos_id, Vocabulary.pad_id

#: the LSTM's state (config.json's onnx.state; folders written before it have this one)
LSTM_STATE = {"carried": {"h": "h0", "c": "c0"}, "constants": ["features", "projected"]}
#: the dtypes a carried array may start as zeros of
STATE_DTYPES = {"int64": np.int64, "float32": np.float32}

HONOURED = "honoured"
SAMPLING = "decodes greedily or with beam search, without sampling"
DIVERSE = "has no diverse beam search"
#: What this captioner does with each GenerationConfig field. ``HONOURED``: the numpy search acts on
#: it as decoding/ does, or ignores it where PyTorch's search ignores it too (temperature and top_k
#: act only when sampling; cuda_graphs is how PyTorch runs, not what it writes; a soft-attention
#: model reads the expected context whatever attention_mode and attention_temperature say; a hard
#: one's limits are check_generation's). Otherwise, why a value other than the field's default is
#: refused. A logits processor's options get its decision (``Processor.onnx_decision``: its numpy
#: twin, or its reason) when it registers. A field missing here is refused at any value but its
#: default, and tests/export (the parity test over every field) fails until it is decided.
ONNX_OPTIONS: dict[str, str] = {
    "num_beams": HONOURED,
    "max_new_tokens": HONOURED,
    "length_penalty": HONOURED,
    "do_sample": SAMPLING,
    "temperature": HONOURED,
    "top_k": HONOURED,
    "attention_mode": HONOURED,
    "attention_temperature": HONOURED,
    "num_return_sequences": HONOURED,
    "location_samples": SAMPLING,
    "cuda_graphs": HONOURED,
    "num_beam_groups": DIVERSE,
    "diversity_penalty": DIVERSE,
    "top_p": SAMPLING,
}
_decided: dict[type, tuple[str, ...]] = {}  # processor -> its options, whose decisions ONNX_OPTIONS holds


def _decide_processors() -> None:
    """ONNX_OPTIONS with the decision of each processor registered since (once: an entry taken out
    stays out) and without those of processors no longer registered."""
    registered = PROCESSORS.classes()
    for processor in [p for p in _decided if p not in registered]:
        for name in _decided.pop(processor):
            ONNX_OPTIONS.pop(name, None)
    for processor in [p for p in registered if p not in _decided]:
        decision = processor.onnx_decision()
        for name in processor.options:
            ONNX_OPTIONS[name] = HONOURED if decision is None else decision
        _decided[processor] = tuple(processor.options)


_decide_processors()  # the built-in processors'
PROCESSORS.watch(_decide_processors)  # a plugin's, when it registers


def _session(path: str, num_threads: int | None):
    try:
        import onnxruntime as ort
    except ImportError:
        raise ConfigError(
            "captioning with ONNX graphs needs onnxruntime: pip install -e '.[onnx]' (or pip install onnxruntime)"
        ) from None

    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such file")
    options = ort.SessionOptions()
    if num_threads:
        options.intra_op_num_threads = int(num_threads)
        options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only
    try:
        return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own types for damaged protobufs, bad graphs...
        detail = " ".join(str(err).split())[:160]
        raise CheckpointError(f"{path}: not a readable ONNX graph, damaged or truncated ({detail})") from None


class OnnxCaptioner:
    """The captioner of an ONNX model folder (see the module docstring).

    ``folder``: an ONNX model folder, or a Hugging Face Hub id ``owner/name`` of one (fetched into
    huggingface_hub's cache; ``local_files_only`` as for ``Captioner.from_pretrained``).
    ``generation``: the defaults of :meth:`__call__` (the folder's, one beam); ``num_threads``:
    onnxruntime's threads per graph (default: its own choice, the machine's cores); ``token``: for a
    private or gated repository, as for ``Captioner.from_pretrained``.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        num_threads: int | None = None,
        local_files_only: bool | None = None,
        token: str | bool | None = None,
    ):
        load_plugins()  # the folder's generation settings may hold a plugin's decoding option
        # a path, or a Hub id owner/name
        folder = resolve_folder(os.fspath(folder), local_files_only=local_files_only, token=token)
        self.folder = folder
        self.config = config = read_config(folder, "onnx")
        model = config["model"]
        self.vocab = read_vocab(folder, int(model["vocab_size"]))
        self.image_size = int(config["preprocessing"]["image_size"])
        #: the resize's filter; folders written before it was recorded: bilinear (the types were checked by read_config)
        try:
            self.interpolation = check_interpolation(
                config["preprocessing"].get("interpolation", DEFAULT_INTERPOLATION)
            )
        except ConfigError as err:
            raise CheckpointError(
                f"{os.path.join(folder, 'config.json')}: preprocessing.interpolation: {err}"
            ) from None
        self.attention_kind = model["decoder"].get("attention_kind", "soft")
        self.num_locations, self.feature_dim = int(model["num_locations"]), int(model["feature_dim"])
        try:
            self.generation = GenerationConfig(**config["generation"]).one_beam()
        except (TypeError, ConfigError) as err:
            raise CheckpointError(
                f"{os.path.join(folder, 'config.json')}: generation settings of another version ({err})"
            ) from None
        onnx = config["onnx"]
        self.encoder = _session(os.path.join(folder, onnx.get("encoder", ENCODER_ONNX)), num_threads)
        steps = onnx.get("steps") or {}
        if "expected" not in steps:
            raise CheckpointError(f"{os.path.join(folder, 'config.json')}: onnx.steps names no 'expected' step graph")
        self.steps = {mode: _session(os.path.join(folder, name), num_threads) for mode, name in steps.items()}
        self.state = _read_state(onnx.get("state", LSTM_STATE), os.path.join(folder, "config.json"))
        self._check_graphs()
        self._check_shapes()
        self.bad_ending_ids = bad_ending_ids(self.vocab)

    def _check_graphs(self) -> None:
        """The graphs' inputs and outputs against onnx.state: one line naming the graph otherwise."""
        outputs = {o.name for o in self.encoder.get_outputs()}
        encoder = os.path.join(self.folder, self.config["onnx"].get("encoder", ENCODER_ONNX))
        needed = set(self.state["constants"]) | {v for v in self.state["carried"].values() if isinstance(v, str)}
        if needed - outputs:
            raise CheckpointError(
                f"{encoder}: has no output {', '.join(sorted(needed - outputs))} that config.json's onnx.state "
                f"names (it has {', '.join(sorted(outputs))}; files of different models?)"
            )
        carried = list(self.state["carried"])
        for mode, session in self.steps.items():
            path = os.path.join(self.folder, self.config["onnx"]["steps"][mode])
            inputs, outputs = {i.name for i in session.get_inputs()}, {o.name for o in session.get_outputs()}
            wanted_in = {"tokens", *carried, *self.state["constants"]}
            wanted_out = {"log_probs", "alpha", *(f"{name}_next" for name in carried)}
            if inputs != wanted_in or wanted_out - outputs:
                raise CheckpointError(
                    f"{path}: takes {', '.join(sorted(inputs))} and gives {', '.join(sorted(outputs))}, not the "
                    f"state config.json's onnx.state describes (files of different models?)"
                )
            shapes = {i.name: i.shape for i in session.get_inputs()}
            for name, start in self.state["carried"].items():
                if isinstance(start, str):
                    continue
                graph = shapes[name][1:]  # (its first axis is the rows)
                if len(graph) != len(start["zeros"]) or any(
                    isinstance(g, int) and g != n for g, n in zip(graph, start["zeros"])
                ):
                    raise CheckpointError(
                        f"{path}: its input {name} is of shape {graph} a row, but config.json's onnx.state "
                        f"declares {start['zeros']} (files of different models?)"
                    )

    def _check_shapes(self) -> None:
        """One blank image through the graphs: their sizes against config.json and vocab.json (a graph
        of another model fails here, named, rather than at the first caption)."""
        config = os.path.join(self.folder, "config.json")
        encoder = os.path.join(self.folder, self.config["onnx"].get("encoder", ENCODER_ONNX))
        S = self.image_size
        try:
            encoded = self.encode(np.zeros((1, 3, S, S), dtype=np.float32))
        except Exception as err:  # noqa: BLE001 - onnxruntime's errors: wrong input size, broken graph
            raise CheckpointError(
                f"{encoder}: does not run on {S}x{S} images as {config} says ({' '.join(str(err).split())[:120]})"
            ) from None
        if "features" in encoded:  # the LSTM's: the annotation vectors themselves
            L, D = encoded["features"].shape[1:]
            if (L, D) != (self.num_locations, self.feature_dim):
                raise CheckpointError(
                    f"{encoder}: gives {L} locations of {D} features, but {config} says "
                    f"{self.num_locations} of {self.feature_dim} (files of different models?)"
                )
        carried, constants = self.start(encoded, 2)
        for mode in self.steps:
            path = os.path.join(self.folder, self.config["onnx"]["steps"][mode])
            try:
                logp, _, alpha, _ = self.step(np.array([BOS]), carried, constants, mode)
            except Exception as err:  # noqa: BLE001
                raise CheckpointError(
                    f"{path}: does not fit {encoder} ({' '.join(str(err).split())[:120]}; files of different models?)"
                ) from None
            if logp.shape[1] != len(self.vocab):
                raise CheckpointError(
                    f"{path}: writes {logp.shape[1]} tokens, but vocab.json and {config} have "
                    f"{len(self.vocab)} (files of different models?)"
                )
            if alpha.shape[1] != self.num_locations:
                raise CheckpointError(
                    f"{path}: attends over {alpha.shape[1]} locations, but {config} says "
                    f"{self.num_locations} (files of different models?)"
                )

    def describe(self) -> dict:
        card = self.config.get("card") or {}
        return {
            "attention": self.attention_kind,
            "encoder": self.config["model"]["encoder"].get("name"),
            "vocab_size": len(self.vocab),
            "image_size": self.image_size,
            "training_data": card.get("training_data"),
            "test_scores": card.get("test_scores"),
            "runtime": "onnxruntime",
        }

    # ------------------------------------------------------------------ graphs
    def encode(self, images: np.ndarray) -> dict[str, np.ndarray]:
        """images (B, 3, S, S) float32 in [0, 1] -> the encoder's outputs by name: the LSTM's features
        (B, L, D), projected (B, L, A), h0, c0 (B, H); a transformer's memory (B, layers, 2, L, d)."""
        names = [o.name for o in self.encoder.get_outputs()]
        outputs = self.encoder.run(None, {"images": np.ascontiguousarray(images, dtype=np.float32)})
        return dict(zip(names, outputs))

    def start(self, encoded: dict[str, np.ndarray], max_new_tokens: int) -> tuple[dict, dict]:
        """The search's state at its start, one row per image: (carried, constants), named arrays."""
        B = next(iter(encoded.values())).shape[0]
        carried = {}
        for name, source in self.state["carried"].items():
            if isinstance(source, str):
                carried[name] = encoded[source]
            else:
                shape = [max_new_tokens if n == "steps" else n for n in source["zeros"]]
                carried[name] = np.zeros([B, *shape], dtype=STATE_DTYPES[source["dtype"]])
        return carried, {name: encoded[name] for name in self.state["constants"]}

    def step(
        self, tokens: np.ndarray, carried: dict, constants: dict, mode: str = "expected"
    ) -> tuple[np.ndarray, dict, np.ndarray, np.ndarray | None]:
        """One decoder step for N = B * K rows (``carried`` N rows, ``constants`` B): log p (N, V), the
        carried state after it, alpha (N, L) and the heads' maps (N, heads, L) where the graph gives them."""
        session = self.steps[mode]
        names = [o.name for o in session.get_outputs()]
        out = dict(
            zip(names, session.run(None, {"tokens": tokens.astype(np.int64, copy=False), **carried, **constants}))
        )
        return out["log_probs"], {k: out[f"{k}_next"] for k in carried}, out["alpha"], out.get("head_alpha")

    def check_generation(self, config: GenerationConfig) -> str:
        """The step graph ``config`` needs ("expected" or "argmax"); a one-line ConfigError for what
        this captioner cannot do (:data:`ONNX_OPTIONS`' refusals, a mode the folder has no graph for)."""
        for option in generation_options():
            decision = ONNX_OPTIONS.get(option.name, "does not implement it")
            value = getattr(config, option.name)
            if decision != HONOURED and value != option.default:
                raise ConfigError(f"the ONNX captioner {decision}: {option.name} {value!r} needs the PyTorch model")
        if config.attention_mode == "sample":
            raise ConfigError(f"the ONNX captioner {SAMPLING}: attention_mode 'sample' needs the PyTorch model")
        config.resolve_tokens(self.vocab)  # words it lacks, ids beyond it: one line, before any image
        limit = self.state.get("max_steps")
        if limit is not None and config.max_new_tokens > limit:  # as TransformerDecoder.check_length
            raise ConfigError(
                f"model.decoder.max_positions: this model's learned positions end at {limit}; "
                f"{config.max_new_tokens} tokens are more (lower max_new_tokens or max_length)"
            )
        mode = "expected" if self.attention_kind == "soft" else config.attention_mode
        baked = float(self.config["onnx"].get("attention_temperature", 1.0))  # folders before the option: 1
        if mode == "expected" and self.attention_kind == "hard" and config.attention_temperature != baked:
            raise ConfigError(
                f"attention_temperature {config.attention_temperature}: this ONNX step graph reads the "
                f"expected context at attention_temperature {baked:g} (exported so); another needs the "
                "PyTorch model"
            )
        if mode not in self.steps:
            raise ConfigError(
                f"attention_mode {mode}: this ONNX folder has no step graph for it (it has {', '.join(self.steps)})"
            )
        return mode

    def processors(self, config: GenerationConfig) -> LogitsProcessor:
        """The logits processors ``config`` asks for, built for their numpy twins (``.numpy``)."""
        return LogitsProcessor(config.resolve_tokens(self.vocab), Context(len(self.vocab), self.bad_ending_ids))

    @staticmethod
    def _extend(prefix: np.ndarray, lengths: np.ndarray, tokens: np.ndarray) -> None:
        """Write ``tokens`` (N,) into prefix (N, T) at column ``lengths`` (N,) (in place)."""
        prefix[np.arange(prefix.shape[0]), np.minimum(lengths, prefix.shape[1] - 1)] = tokens

    # ------------------------------------------------------------------ search (decoding/search.py, in numpy)
    def greedy(self, encoded: dict, config: GenerationConfig, mode: str) -> dict:
        carried, constants = self.start(encoded, config.max_new_tokens)
        B = next(iter(carried.values())).shape[0]
        tokens = np.full(B, BOS, dtype=np.int64)
        finished = np.zeros(B, dtype=bool)
        scores = np.zeros(B, dtype=np.float32)
        lengths = np.zeros(B, dtype=np.int64)
        out_tokens, out_alpha, out_loc, out_heads = [], [], [], []
        process, rows = self.processors(config), np.arange(B)
        prefix = np.full((B, config.max_new_tokens), PAD, dtype=np.int64)
        for _ in range(config.max_new_tokens):
            logp, carried, alpha, heads = self.step(tokens, carried, constants, mode)
            logp = process.numpy(logp, tokens, lengths, prefix)
            nxt = logp.argmax(-1)
            running = ~finished
            scores += logp[rows, nxt] * running
            nxt[finished] = PAD
            self._extend(prefix, lengths, nxt)
            lengths += running
            out_tokens.append(nxt)
            out_alpha.append(alpha * running[:, None])
            out_loc.append(alpha.argmax(-1))
            if heads is not None:
                out_heads.append(heads * running[:, None, None])
            finished |= nxt == EOS
            tokens = nxt
            if finished.all():
                break
        return {
            "sequences": np.stack(out_tokens, 1),
            "alphas": np.stack(out_alpha, 1),
            "locations": np.stack(out_loc, 1),
            "scores": _normalise(scores, lengths, config.length_penalty),
            "lengths": lengths,
            **({"head_alphas": np.stack(out_heads, 1)} if out_heads else {}),
        }

    def beam_search(self, encoded: dict, config: GenerationConfig, mode: str) -> dict:
        carried, constants = self.start(encoded, config.max_new_tokens)
        B, K, N = next(iter(carried.values())).shape[0], config.num_beams, config.num_return_sequences
        carried = {k: np.repeat(v, K, 0) for k, v in carried.items()}  # the state per beam; constants once per image
        beam_scores = np.zeros((B, K), dtype=np.float32)
        beam_scores[:, 1:] = -np.inf  # at the start only one beam per image is alive
        tokens = np.full(B * K, BOS, dtype=np.int64)
        finished = np.zeros(B * K, dtype=bool)
        lengths = np.zeros(B * K, dtype=np.int64)
        base = (np.arange(B) * K)[:, None]  # (B, 1): first row of each image
        history = []
        process = self.processors(config)
        prefix = np.full((B * K, config.max_new_tokens), PAD, dtype=np.int64)
        for _ in range(config.max_new_tokens):
            logp, carried, alpha, heads = self.step(tokens, carried, constants, mode)  # (B*K, V)
            logp = process.numpy(logp, tokens, lengths, prefix)
            V = logp.shape[1]
            logp[finished] = -np.inf  # a finished beam may only continue with PAD, at no cost
            logp[finished, PAD] = 0.0
            candidates = (beam_scores.reshape(-1, 1) + logp).reshape(B, K * V)
            flat = _topk(candidates, K)  # (B, K), best first
            beam_scores = np.take_along_axis(candidates, flat, 1)
            parent = (base + flat // V).reshape(-1)
            tokens = (flat % V).reshape(-1)
            carried = {k: v[parent] for k, v in carried.items()}  # each beam continues its parent's state
            was_finished = finished[parent]
            prefix = prefix[parent]
            self._extend(prefix, lengths[parent], tokens)
            lengths = lengths[parent] + ~was_finished
            finished = was_finished | (tokens == EOS)
            running = ~was_finished
            history.append(
                (
                    parent,
                    tokens,
                    alpha[parent] * running[:, None],
                    alpha.argmax(-1)[parent],
                    None if heads is None else heads[parent] * running[:, None, None],
                )
            )
            if finished.all():
                break
        normalised = _normalise(beam_scores.reshape(-1), lengths, config.length_penalty).reshape(B, K)
        top = _topk(normalised, N)  # (B, N)
        top_scores = np.take_along_axis(normalised, top, 1)
        row = (base + top).reshape(-1)
        out_lengths = lengths[row].reshape(B, N)
        seq, alphas, locs, heads = [], [], [], []
        for parent, tok, a, loc, h in reversed(history):  # follow the parent pointers back to the start
            seq.append(tok[row])
            alphas.append(a[row])
            locs.append(loc[row])
            if h is not None:
                heads.append(h[row])
            row = parent[row]
        T = len(history)
        sequences = np.stack(seq[::-1], 1).reshape(B, N, T)
        alpha_maps = np.stack(alphas[::-1], 1).reshape(B, N, T, -1)
        locations = np.stack(locs[::-1], 1).reshape(B, N, T)
        head_maps = np.stack(heads[::-1], 1).reshape(B, N, T, *heads[0].shape[1:]) if heads else None
        return {
            "sequences": sequences[:, 0],
            "alphas": alpha_maps[:, 0],
            "locations": locations[:, 0],
            "scores": top_scores[:, 0],
            "lengths": out_lengths[:, 0],
            **({"beam_sequences": sequences, "beam_scores": top_scores} if N > 1 else {}),
            **({"head_alphas": head_maps[:, 0]} if head_maps is not None else {}),
        }

    def generate(self, images: np.ndarray, config: GenerationConfig | None = None) -> dict:
        """Decode a batch of preprocessed images (B, 3, S, S): numpy arrays as GenerationOutput's fields."""
        config = config or self.generation
        mode = self.check_generation(config)
        encoded = self.encode(images)
        return self.greedy(encoded, config, mode) if config.num_beams == 1 else self.beam_search(encoded, config, mode)

    def preprocess(self, image) -> np.ndarray:
        """One image (path, PIL, array) -> (3, S, S) float32 in [0, 1], as the PyTorch route makes it."""
        return to_array(as_rgb(image), self.image_size, self.interpolation)

    def __call__(
        self, images: Any | Sequence[Any], return_attention: bool = False, batch_size: int = 16, **generation
    ) -> list[dict[str, Any]]:
        """Caption one image or a list of them, ``batch_size`` at a time; as :meth:`captioning.api.Captioner.__call__`
        (the same generation names and result keys). A ``focus`` is refused in one line: the exported
        step graph takes no attention prior (decoding/steering.py)."""
        if generation.pop("focus", None) is not None:
            raise ConfigError(
                "focus: the ONNX captioner cannot steer (its step graph takes no attention prior); use the PyTorch model"
            )
        generation.pop("focus_strength", None)
        config = self.generation.replace(**generation)
        self.check_generation(config)  # what it cannot do is refused before the words are read
        config = config.resolve_tokens(self.vocab)
        single = not isinstance(images, (list, tuple))
        pils = [as_rgb(im) for im in ([images] if single else images)]
        results = []
        for start in range(0, len(pils), batch_size):
            chunk = pils[start : start + batch_size]
            out = self.generate(np.stack([to_array(im, self.image_size, self.interpolation) for im in chunk]), config)
            for i in range(len(chunk)):
                n = int(out["lengths"][i])
                ids = out["sequences"][i, :n].tolist()
                item: dict[str, Any] = {
                    "generated_text": self.vocab.decode_text(ids),
                    "score": float(out["scores"][i]),
                    "tokens": [self.vocab.itos[t] for t in ids],
                }
                if "beam_sequences" in out:
                    item["beams"] = [
                        {"generated_text": self.vocab.decode_text(seq), "score": float(score)}
                        for seq, score in zip(out["beam_sequences"][i].tolist(), out["beam_scores"][i].tolist())
                    ]
                if return_attention:
                    grid = grid_shape(out["alphas"].shape[-1])
                    item["attention"] = out["alphas"][i, :n].reshape(n, *grid).astype(np.float32)
                    item["locations"] = [divmod(int(cell), grid[1]) for cell in out["locations"][i, :n].tolist()]
                    if "head_alphas" in out:  # a multi-head transformer's: each head's map, as Captioner's
                        heads = out["head_alphas"][i, :n]
                        item["head_attention"] = heads.reshape(n, heads.shape[1], *grid).astype(np.float32)
                results.append(item)
        return results


#: the most values one row of a carried state may hold for each step of the search (a transformer's
#: key/value cache: layers x 2 x hidden, 6,144 for 6 layers of 512; 49,152 for 24 of 1,024), so that
#: a folder cannot make the search allocate what it likes
MAX_STATE_VALUES = 1 << 20


def _read_state(state, path: str) -> dict:
    """config.json's onnx.state, checked (one line naming the file and the field otherwise):
    {"carried": {name: encoder output | {"zeros": [size | "steps", ...], "dtype": ...}},
    "constants": [encoder output, ...], "max_steps": None | the longest search}."""

    def bad(where: str, what: str):
        return CheckpointError(f"{path}: onnx.state{where} {what}")

    if not isinstance(state, dict):
        raise bad("", "must be an object {carried, constants}")
    carried, constants = state.get("carried"), state.get("constants")
    if not isinstance(carried, dict) or not carried:
        raise bad(".carried", "must be a non-empty object {input name: its start}")
    for name, start in carried.items():
        if isinstance(start, str):
            continue
        sizes = start.get("zeros") if isinstance(start, dict) else None
        if (
            not isinstance(sizes, list)
            or not all(n == "steps" or (isinstance(n, int) and not isinstance(n, bool) and n >= 1) for n in sizes)
            or not isinstance(start.get("dtype"), str)
            or start.get("dtype") not in STATE_DTYPES
        ):
            raise bad(
                f".carried.{name}",
                f"must name an encoder output or be {{zeros: [sizes or 'steps'], dtype: "
                f"{' or '.join(STATE_DTYPES)}}}, got {repr(start)[:60]}",
            )
        values = math.prod(n for n in sizes if n != "steps")
        if values > MAX_STATE_VALUES:
            raise bad(
                f".carried.{name}",
                f"declares {values if values < 2**50 else f'about 2^{values.bit_length() - 1}'} values a row (each "
                f"step), more than the {MAX_STATE_VALUES:,} a state may hold",
            )
    if not isinstance(constants, list) or not constants or not all(isinstance(c, str) for c in constants):
        raise bad(".constants", f"must be a non-empty list of encoder output names, got {constants!r:.60}")
    limit = state.get("max_steps")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise bad(".max_steps", f"must be a positive integer or null, got {limit!r:.40}")
    return {"carried": carried, "constants": constants, "max_steps": limit}


def _normalise(scores: np.ndarray, lengths: np.ndarray, length_penalty: float) -> np.ndarray:
    return (scores / np.power(np.maximum(lengths, 1).astype(np.float32), np.float32(length_penalty))).astype(np.float32)


def _topk(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values of each row, largest first (ties: the lower index first)."""
    if k >= values.shape[1]:
        return np.argsort(-values, axis=1, kind="stable")[:, :k]
    part = np.argpartition(-values, k - 1, axis=1)[:, :k]  # the k largest, unordered
    order = np.argsort(-np.take_along_axis(values, part, 1), axis=1, kind="stable")
    return np.take_along_axis(part, order, 1)


__all__ = ["ONNX_OPTIONS", "OnnxCaptioner", "as_rgb"]
