"""Decoding: the generation settings (GenerationConfig), batched greedy and beam search, and the
evaluator that decodes a split and scores it."""
