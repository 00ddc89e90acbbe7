"""A griffe extension for the API reference: the reST roles of txl's docstrings (``:func:`x```, ``:class:`~a.B```)
become Markdown code (`` `x` ``, `` `B` ``), so the pages read as the source does without the role names."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?[a-z]+:`(~?)([^`]+)`")


def _plain(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


class RestRoles(griffe.Extension):
    """Rewrite every docstring's reST roles as Markdown code spans."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_plain, obj.docstring.value)
