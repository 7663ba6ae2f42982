"""Which model answered a turn, for views across many turns (metrics, report, index).

The answer's own model name comes first (it is the most precise: OpenAI answers with the
dated snapshot). Where the answer names none, the request does: the ``model`` field of its
JSON body (OpenAI, Anthropic, Ollama), or its path (Bedrock ``/model/ID/...``, Gemini
``/models/NAME:streamGenerateContent``).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote, urlsplit

# Bedrock ids hold colons (amazon.nova-lite-v1:0); in Gemini's path a colon starts the method
_PATH_MODEL = re.compile(r"/model/([^/]+)/|/models/([^/:]+)")


def model_of(answer_model: str | None, url: str | None, body: Any) -> str | None:
    """The model name of a turn, or None when neither the answer nor the request names one."""
    if answer_model:
        return answer_model
    if isinstance(body, dict):
        requested = body.get("model")
        if isinstance(requested, str) and requested:
            return requested
    if url:
        try:
            path = urlsplit(url).path
        except ValueError:
            return None
        found = _PATH_MODEL.search(path)
        if found and found.group(1):
            return unquote(found.group(1))  # a Bedrock model id, whose ARN keeps its colons
        if found:
            # Google's servers read the path decoded: a ":method" sent as %3A ends the name too
            return unquote(found.group(2)).split(":", 1)[0]
    return None
