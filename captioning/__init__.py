"""Show, Attend and Tell image captioning with soft and hard attention."""

__version__ = "0.1.0"
