"""streamtap: tap, record, judge and replay streamed LLM answers."""

__version__ = "0.1.0"
