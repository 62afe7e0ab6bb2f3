"""The one conversion of an earlier LSTM decoder's fused parameters to the paper's names.

Earlier versions stored the LSTM decoder's parameters fused for speed: ``from_hidden`` stacked the
products of h_{t-1} ([W_h | f_beta | the local window's W_p | the LSTM's recurrent weights]),
``embed_gates`` and ``context_gates`` held the rest of T, ``from_output`` the products of h_t
(Luong), ``lstm`` Luong's recurrence, and the layers had other names. :func:`to_paper_names` splits
and renames them into models/decoder.py's parameters; the function the model computes is the same
(W_h's bias is folded into W_a's, the score's bias b_w and the LSTM's second bias are dropped or
added: the softmax and the gates see the same sums). Checkpoints, model folders and resumed runs
read their weights through it; nothing else knows the old names.
"""

from __future__ import annotations

import torch

#: the layers renamed whole: earlier name -> the paper's
RENAMED = {
    "decoder.embedding.": "decoder.E.",
    "decoder.init_state.": "decoder.W_init.",
    "decoder.out_hidden.": "decoder.L_h.",
    "decoder.out_context.": "decoder.L_z.",
    "decoder.out_logits.": "decoder.L_o.",
    "decoder.head_proj.": "decoder.multi_head.W_o.",
    "decoder.aoa.": "decoder.aoa.W_ig.",
    "decoder.local_centre.": "decoder.window.",
    "decoder.combine.": "decoder.W_c.",
}


def is_fused(weights: dict) -> bool:
    """Whether ``weights`` (a model's state, keys as ``ShowAttendTell.state_dict()``'s) hold an earlier LSTM decoder."""
    return "decoder.from_hidden.weight" in weights or "decoder.from_output.weight" in weights


def to_paper_names(weights: dict, config) -> dict:
    """``weights`` with an earlier LSTM decoder's parameters in the paper's names (others as they
    are); ``config``: its :class:`~captioning.models.decoder.DecoderConfig`."""
    if not is_fused(weights) or getattr(config, "kind", "lstm") != "lstm":
        return dict(weights)
    old = dict(weights)
    new = {k: v for k, v in old.items() if not k.startswith("decoder.")}
    take = old.pop
    A = config.attention_dim
    Q = A if config.score in ("additive", "scaled_dot") else 0
    P = A if config.window == "local" else 0
    luong = config.placement == "luong"
    fused_w = take("decoder.from_output.weight" if luong else "decoder.from_hidden.weight")
    fused_b = take("decoder.from_output.bias" if luong else "decoder.from_hidden.bias")
    rest = fused_w.size(0) - Q - 1 - P  # the LSTM's recurrent rows (4H), Bahdanau only
    (q_w, beta_w, p_w, u_w), (q_b, beta_b, p_b, u_b) = fused_w.split([Q, 1, P, rest]), fused_b.split([Q, 1, P, rest])
    new["decoder.f_beta.weight"], new["decoder.f_beta.bias"] = beta_w, beta_b
    if P:
        new["decoder.window.W_p.weight"], new["decoder.window.W_p.bias"] = p_w, p_b
    if config.score == "additive":
        feature_b = take("decoder.f_att.feature_proj.bias")
        new["decoder.f_att.W_a.weight"] = take("decoder.f_att.feature_proj.weight")
        new["decoder.f_att.W_a.bias"] = feature_b + q_b  # b = b_a + b_h
        new["decoder.f_att.W_h.weight"] = q_w
        new["decoder.f_att.w"] = take("decoder.f_att.score.weight")  # (heads, A / heads); its bias shifts every score
        take("decoder.f_att.score.bias")
    elif config.score == "general":
        new["decoder.f_att.W_a.weight"] = take("decoder.f_att.key_proj.weight")
    elif config.score == "scaled_dot":
        new["decoder.f_att.W_k.weight"] = take("decoder.f_att.key_proj.weight")
        new["decoder.f_att.W_k.bias"] = take("decoder.f_att.key_proj.bias")
        new["decoder.f_att.W_q.weight"], new["decoder.f_att.W_q.bias"] = q_w, q_b
    if luong:
        new["decoder.T.weight"] = torch.cat([take("decoder.lstm.weight_ih_l0"), take("decoder.lstm.weight_hh_l0")], 1)
        new["decoder.T.bias"] = take("decoder.lstm.bias_ih_l0") + take("decoder.lstm.bias_hh_l0")
    else:
        parts = [take("decoder.embed_gates.weight"), u_w, take("decoder.context_gates.weight")]
        new["decoder.T.weight"], new["decoder.T.bias"] = torch.cat(parts, 1), u_b
    for key, value in old.items():  # the layers renamed whole, and the rest (the refiner) as it is
        if not key.startswith("decoder."):
            continue
        prefix = next((p for p in RENAMED if key.startswith(p)), None)
        new[key if prefix is None else RENAMED[prefix] + key[len(prefix) :]] = value
    return new
