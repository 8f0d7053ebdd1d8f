"""The one answer-normalisation function that every metric and name lookup uses."""

from __future__ import annotations

import re
import string
import unicodedata

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation})


def normalize_answer(text: str) -> str:
    """Lower-case, strip accents, turn underscores and punctuation into spaces, drop articles.

    `"The_United-Kingdom!"` and `"united kingdom"` both become `"united kingdom"`.
    """
    text = unicodedata.normalize("NFKD", str(text))
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = text.lower().replace("_", " ").translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())
