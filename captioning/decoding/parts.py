"""What the plain search (search.py) and the graphed search (loops.py) share: the
output type, the banned endings, the length normalisation and beam backtracking."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from captioning.errors import ConfigError
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.decoding.generation import GenerationConfig
from captioning.vocab import Vocabulary

EOS = Vocabulary.eos_id


def _ban_table(decoder: ShowAttendTellDecoder, config: "GenerationConfig", device) -> Optional[Tensor]:
    """(V,) bool: after which tokens EOS is forbidden (None unless ``config.forbid_bad_endings``).

    The ids come from the decoder's ``bad_ending_ids``, which ShowAttendTell sets from its vocabulary
    when it is built (the decoder itself does not know its words)."""
    if not config.forbid_bad_endings:
        return None
    ids = getattr(decoder, "bad_ending_ids", None)
    if ids is None:
        raise ConfigError("forbid_bad_endings needs the model's vocabulary: decode with a ShowAttendTell (build_model, "
                          "load_model), or set decoder.bad_ending_ids = bad_ending_ids(vocab)")
    table = torch.zeros(decoder.vocab_size, dtype=torch.bool, device=device)
    table[list(ids)] = True
    return table


def _forbid_eos(logp: Tensor, previous: Tensor, table: Optional[Tensor]) -> Tensor:
    """log p with EOS at -inf in the rows whose previous token is a bad ending."""
    if table is None:
        return logp
    logp[:, EOS] = logp[:, EOS].masked_fill(table[previous], float("-inf"))
    return logp


@dataclass
class GenerationOutput:
    sequences: Tensor  # (B, T) token ids without BOS: the words, EOS, then PAD
    alphas: Tensor  # (B, T, L) alpha_t of each generated token, zero after EOS
    locations: Tensor  # (B, T) the location each token looked at (argmax for soft attention); (B, T, heads) for hard multi-head
    scores: Tensor  # (B,) length-normalised log-probability
    lengths: Tensor  # (B,) tokens generated, EOS included
    # With num_return_sequences N > 1: the N best beams of each image, best first (the first is the above).
    beam_sequences: Optional[Tensor] = None  # (B, N, T)
    beam_scores: Optional[Tensor] = None  # (B, N)
    beam_lengths: Optional[Tensor] = None  # (B, N)
    head_alphas: Optional[Tensor] = None  # (B, T, heads, L) with multi-head attention (alphas is their mean)


def _score_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of scores and returned attention maps: the model's, at least float32 (bf16 under
    autocast gives float32; a float64 model keeps float64)."""
    return torch.promote_types(dtype, torch.float32)


def _normalise(scores: Tensor, lengths: Tensor, length_penalty: float) -> Tensor:
    return scores / lengths.clamp(min=1).to(scores.dtype).pow(length_penalty)


def _sample_token(logp: Tensor, temperature: float, top_k: int, generator: Optional[torch.Generator]) -> Tensor:
    """Draw one token per row from softmax(log p / temperature), restricted to the top k if k > 0."""
    logits = logp / max(temperature, 1e-6)
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(1)


def backtrack(history: list, beam_scores: Tensor, lengths: Tensor, B: int, K: int,
              config: GenerationConfig) -> GenerationOutput:
    """The returned beams of a beam search: the best by length-normalised score, their words and
    attention maps read back through the parent pointers of ``history`` (per step: parent rows,
    tokens, alpha, location[, head alphas]). beam_scores (B, K), lengths (B*K,)."""
    N, device = config.num_return_sequences, beam_scores.device
    base = (torch.arange(B, device=device) * K).unsqueeze(1)
    normalised = _normalise(beam_scores.view(-1), lengths, config.length_penalty).view(B, K)
    top_scores, top = normalised.topk(N, dim=1)  # (B, N): the returned beams, best first
    row = (base + top).view(-1)  # (B*N,) their rows
    out_lengths = lengths[row].view(B, N)
    seq, alpha, loc, heads = [], [], [], []
    for parent, tok, a, l, *ha in reversed(history):  # follow the parent pointers back to the start
        seq.append(tok[row])
        alpha.append(a[row])
        loc.append(l[row])
        if ha:
            heads.append(ha[0][row])
        row = parent[row]
    sequences = torch.stack(seq[::-1], 1).view(B, N, -1)  # (B, N, T)
    alphas = torch.stack(alpha[::-1], 1).to(_score_dtype(alpha[0].dtype)).view(B, N, len(history), -1)  # (B, N, T, L)
    locations = torch.stack(loc[::-1], 1).view((B, N, len(history)) + loc[0].shape[1:])
    head_alphas = torch.stack(heads[::-1], 1).to(_score_dtype(heads[0].dtype)).view((B, N, len(history)) + heads[0].shape[1:]) if heads else None
    return GenerationOutput(
        sequences=sequences[:, 0], alphas=alphas[:, 0], locations=locations[:, 0],
        scores=top_scores[:, 0], lengths=out_lengths[:, 0],
        head_alphas=None if head_alphas is None else head_alphas[:, 0],
        **(dict(beam_sequences=sequences, beam_scores=top_scores, beam_lengths=out_lengths) if N > 1 else {}),
    )
