"""Placeholder until the decoder lands."""


class NDJSONDecoder:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("NDJSONDecoder is being written")


class JSONArrayDecoder:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("JSONArrayDecoder is being written")
