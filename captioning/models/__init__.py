"""The networks: encoders, attention, the decoder, batched search and the whole captioner.

Names every model module shares live here, so that the command line can read them without
importing torch.
"""

#: How a hard-attention model picks the context (its "attention mode"): the expected context
#: (soft alpha), the argmax location, or a location sampled from alpha. Soft-attention models
#: always use "expected".
ATTENTION_MODES = ("expected", "argmax", "sample")
