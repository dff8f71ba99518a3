"""What counts as a real word for the trained demo model: every word of the docstrings it was
trained and held out on (the modules its sidecar names), as tools/train_demo.py reads them."""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import re
import warnings

from homelab.gguf import demo


@functools.cache
def corpus_words() -> frozenset[str]:
    sidecar = json.loads((demo.TRAINED_DIR / f"{demo.TRAINED_STEM}.json").read_text())
    texts = [(demo.TRAINED_DIR / "heldout.txt").read_text(encoding="utf-8")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sidecar["modules"]:
            module = importlib.import_module(name)
            texts.append(inspect.getdoc(module) or "")
            texts += [
                str(getattr(getattr(module, a, None), "__doc__", "") or "") for a in dir(module)
            ]
    return frozenset(re.findall(r"[a-z]+", " ".join(texts).lower()))


def word_share(text: str) -> tuple[int, float]:
    """(how many words ``text`` has, the share of them found in the training corpus)."""
    tokens = re.findall(r"[a-z]+", text.lower())
    words = corpus_words()
    return len(tokens), (sum(t in words for t in tokens) / len(tokens) if tokens else 0.0)
