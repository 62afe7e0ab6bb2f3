"""The processing of the decoder's log-probabilities at each search step (search.py), in Hugging
Face's order: repetition penalty, n-gram blocking, min_new_tokens, suppressed tokens, bad endings,
a forced prefix; and sampling a word (temperature, top-k, top-p). Fixed shapes and no host reads,
so that a step can be captured as a CUDA graph."""

from __future__ import annotations

import torch
from torch import Tensor

from captioning.decoding.generation import GenerationConfig
from captioning.errors import ConfigError
from captioning.vocab import Vocabulary

EOS, PAD = Vocabulary.eos_id, Vocabulary.pad_id


def _ban_table(decoder, config: GenerationConfig, device) -> Tensor | None:
    """(V,) bool: after which tokens EOS is forbidden (None unless ``config.forbid_bad_endings``).

    The ids come from the decoder's ``bad_ending_ids`` (None until ShowAttendTell sets them from its
    vocabulary when it is built: the decoder itself does not know its words)."""
    if not config.forbid_bad_endings:
        return None
    ids = decoder.bad_ending_ids
    if ids is None:
        raise ConfigError(
            "forbid_bad_endings needs the model's vocabulary: decode with a ShowAttendTell (build_model, "
            "load_model), or set decoder.bad_ending_ids = bad_ending_ids(vocab)"
        )
    table = torch.zeros(decoder.vocab_size, dtype=torch.bool, device=device)
    table[list(ids)] = True
    return table


def _forbid_eos(logp: Tensor, previous: Tensor, table: Tensor | None, last: Tensor | None = None) -> Tensor:
    """log p (N, V) with EOS at -inf in the rows whose previous token is a bad ending and, in the
    rows at their last step (``last`` (N,) bool: the length limit ends the caption with this
    word), the bad endings themselves at -inf: a caption cut by max_new_tokens ends on a good word."""
    if table is None:
        return logp
    if last is not None:
        logp = logp.masked_fill(last.unsqueeze(1) & table, float("-inf"))
    logp[:, EOS] = logp[:, EOS].masked_fill(table[previous], float("-inf"))
    return logp


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al. 2020): logits (N, V) with -inf outside the smallest set
    of likeliest tokens whose probability under softmax(logits) reaches ``top_p``; the likeliest
    token is always kept. A token is kept when the mass of the tokens ranked before it is below
    top_p (ties among equal probabilities are ranked by sort order)."""
    if top_p >= 1.0:
        return logits
    ordered, order = logits.sort(dim=-1, descending=True)  # (N, V)
    probs = torch.softmax(ordered, dim=-1)
    before = probs.cumsum(-1) - probs  # mass of the tokens ranked before each
    drop_sorted = before >= top_p
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def ngram_bans(prefix: Tensor, lengths: Tensor, n: int, vocab_size: int) -> Tensor:
    """(N, V) bool: the tokens that would complete an n-gram already in each row's prefix.

    prefix (N, T): each row's tokens so far in its first ``lengths`` (N,) columns. Fixed shapes
    and no host reads, so that the step can be captured: every window of n tokens of the prefix is
    compared with the row's last n - 1 tokens."""
    N, T = prefix.shape
    banned = torch.zeros(N, vocab_size, dtype=torch.long, device=prefix.device)
    if T < n:
        return banned.bool()
    windows = prefix.unfold(1, n, 1)  # (N, W, n), W = T - n + 1
    W = windows.size(1)
    tail = prefix.gather(
        1, (lengths.unsqueeze(1) - (n - 1) + torch.arange(n - 1, device=prefix.device)).clamp(min=0)
    )  # (N, n-1)
    match = (windows[:, :, : n - 1] == tail.unsqueeze(1)).all(-1)  # (N, W)
    match &= (torch.arange(W, device=prefix.device) + n - 1).unsqueeze(0) < lengths.unsqueeze(
        1
    )  # the window is in the prefix
    return banned.scatter_add_(1, windows[:, :, n - 1], match.long()) > 0


class LogitsProcessor:
    """The processing of the decoder's log-probabilities (N, V) that a config asks for, decided once
    per search (in Hugging Face's order): repetition penalty, n-gram blocking, min_new_tokens,
    suppressed tokens, bad endings. ``needs_prefix``: whether it reads the tokens generated so far
    (then the loops carry them, (N, max_new_tokens), through the steps)."""

    def __init__(self, decoder, config: GenerationConfig, device):
        V = decoder.vocab_size
        self.ban = _ban_table(decoder, config, device)
        self.ngram, self.penalty, self.min_new = (
            config.no_repeat_ngram_size,
            float(config.repetition_penalty),
            config.min_new_tokens,
        )
        self.suppress = None
        if config.suppress_tokens:
            words = [t for t in config.suppress_tokens if not isinstance(t, int)]
            if words:
                raise ConfigError(
                    f"suppress_tokens: words ({words[0]!r}) need the model's vocabulary: "
                    "pass config.resolve_tokens(vocab)"
                )
            beyond = [t for t in config.suppress_tokens if t >= V]
            if beyond:
                raise ConfigError(f"suppress_tokens: id {beyond[0]} is beyond the vocabulary ({V} tokens)")
            self.suppress = torch.zeros(V, dtype=torch.bool, device=device)
            self.suppress[list(config.suppress_tokens)] = True
        self.forced = None  # (P,) the ids every caption starts with (GenerationConfig.prefix)
        if config.prefix:
            words = [t for t in config.prefix if not isinstance(t, int)]
            if words:
                raise ConfigError(
                    f"prefix: words ({words[0]!r}) need the model's vocabulary: pass config.resolve_tokens(vocab)"
                )
            if max(config.prefix) >= V:
                raise ConfigError(f"prefix: id {max(config.prefix)} is beyond the vocabulary ({V} tokens)")
            self.forced = torch.tensor(config.prefix, dtype=torch.long, device=device)
        self.needs_prefix = self.ngram > 0 or self.penalty != 1.0
        self.last_step = config.max_new_tokens - 1  # a row with this many tokens chooses its last word

    def __call__(self, logp: Tensor, previous: Tensor, lengths: Tensor, prefix: Tensor | None) -> Tensor:
        """logp (N, V), previous tokens (N,), tokens generated per row (N,), prefix (N, T) or None."""
        if self.penalty != 1.0:
            seen = torch.zeros_like(logp, dtype=torch.bool).scatter_(1, prefix, True)
            seen[:, PAD] = False
            logp = torch.where(seen, torch.where(logp < 0, logp * self.penalty, logp / self.penalty), logp)
        if self.ngram > 0:
            logp = logp.masked_fill(ngram_bans(prefix, lengths, self.ngram, logp.size(-1)), float("-inf"))
        if self.min_new > 0:
            logp[:, EOS] = logp[:, EOS].masked_fill(lengths < self.min_new, float("-inf"))
        if self.suppress is not None:
            logp = logp.masked_fill(self.suppress, float("-inf"))
        last = lengths == self.last_step if self.ban is not None else None
        logp = _forbid_eos(logp, previous, self.ban, last)
        return logp if self.forced is None else force_start(logp, lengths, self.forced)


def force_start(logp: Tensor, lengths: Tensor, forced: Tensor) -> Tensor:
    """log p (N, V) where the rows with fewer than P = len(forced) tokens have one candidate, the
    prefix's next word ``forced[lengths]``, at log p 0 (so the scores add the continuation only);
    the other rows unchanged. Fixed shapes, no host reads (the step can be captured)."""
    P = forced.numel()
    word = forced[lengths.clamp(max=P - 1)]  # (N,)
    only = torch.full_like(logp, float("-inf")).scatter_(1, word.unsqueeze(1), 0.0)
    return torch.where((lengths < P).unsqueeze(1), only, logp)


def extend_prefix(prefix: Tensor, lengths: Tensor, tokens: Tensor) -> Tensor:
    """prefix (N, T) with ``tokens`` (N,) written at column ``lengths`` (N,) (the tokens generated
    before them; PAD for finished rows, written past their end)."""
    return prefix.scatter(1, lengths.clamp(max=prefix.size(1) - 1).unsqueeze(1), tokens.unsqueeze(1))


def sample_token(
    logp: Tensor, temperature: float, top_k: int, generator: torch.Generator | None, top_p: float = 1.0
) -> Tensor:
    """Draw one token per row from softmax(log p / temperature), restricted to the top k if k > 0
    and to the nucleus of mass top_p if top_p < 1 (:func:`top_p_filter`)."""
    logits = logp / max(temperature, 1e-6)
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    logits = top_p_filter(logits, top_p)
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(1)
