"""The articles of a local WikiText split as an lm-eval dataset (the ``txl_wikitext_local`` task): the
file is found as txl finds corpora (``$TXL_DATA_DIR``, then ``~/.cache/txl``), and split where a top-level
heading `` = Title = `` starts a line. Every line belongs to one article, so the articles joined are the file.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["articles", "split_articles"]

_TITLE = re.compile(r"^ = [^=].* = $")


def split_articles(text: str) -> list[str]:
    """The articles of a WikiText file's text, each from its title line to the line before the next title
    (lines before the first title go with the first article)."""
    pages: list[list[str]] = [[]]
    titled = False  # whether the page being read has its title yet
    for line in text.splitlines(keepends=True):
        if _TITLE.match(line.rstrip("\n")):
            if titled:
                pages.append([])
            titled = True
        pages[-1].append(line)
    return ["".join(page) for page in pages]


def articles(corpus: str = "wikitext-2", split: str = "test", **_: Any) -> Any:
    """A ``datasets.DatasetDict`` with one split ``test`` of rows ``{"page": article}`` from ``split``
    (``train``, ``valid`` or ``test``) of the WikiText corpus ``corpus`` (``wikitext-2`` or ``wikitext-103``);
    lm-eval passes the task's metadata as keyword arguments (``--metadata '{"corpus": "wikitext-103"}'``)."""
    import datasets

    from txl.data.corpora import load_corpus  # absolute: lm-eval loads this file by its path, not as txl's

    text = load_corpus(corpus).require(split).decode("utf-8")
    pages = split_articles(text)
    return datasets.DatasetDict({"test": datasets.Dataset.from_dict({"page": pages})})
