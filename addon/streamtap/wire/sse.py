"""Placeholder until the decoder lands."""


class SSEDecoder:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("SSEDecoder is being written")
