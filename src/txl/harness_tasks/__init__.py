"""lm-evaluation-harness tasks over corpora read from local files, found by :func:`txl.harness.task_manager`,
and the names task folders define, read from their YAML text without importing lm-eval."""

# lm-evaluation-harness tasks over the corpora txl reads from local files (no network): the YAML files here
# are found by :func:`txl.harness.task_manager`; :mod:`.wikitext_local` builds their documents. And the names
# that task folders define, read from the YAML text without importing lm-eval: ``txl harness`` checks its
# ``--tasks`` with :func:`check_task_names` before anything heavy loads.

from __future__ import annotations

import difflib
import functools
import importlib.util
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import TxlError

__all__ = ["TaskNames", "check_task_names", "lm_eval_tasks_dir", "task_names"]

_HERE = Path(__file__).resolve().parent
"""This folder: txl's own tasks (``txl.harness.TASKS_DIR``)."""

_KEY = re.compile(
    r"^([ \t]*)(-[ \t]+)?[\"']?(task|group|tag)[\"']?[ \t]*:[ \t]*(.*?)[ \t]*\r?$", re.MULTILINE
)
_ITEMS = re.compile(r"(?:\r?\n[ \t]*-[ \t]+[^\n]*)+")


@dataclass(frozen=True)
class TaskNames:
    """The names (tasks, groups, tags) that task folders define, as read from their YAML text: a superset of
    what lm-eval's ``TaskManager`` registers (a name in a nested config counts too), so that a name missing
    here is unknown to lm-eval."""

    builtin: frozenset[str]
    """Names in lm-eval's own task folder (empty without lm-eval)."""
    local: frozenset[str]
    """Names in txl's folder and the folders given."""
    local_groups: bool
    """Whether a local file is a group config (it may name lm-eval's tasks)."""

    @property
    def all(self) -> frozenset[str]:
        return self.builtin | self.local


def lm_eval_tasks_dir() -> Path | None:
    """lm-eval's task folder, found without importing lm-eval; None when it is not installed."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "tasks"
    return folder if folder.is_dir() else None


def _value(text: str) -> list[str]:
    """The names a YAML scalar or inline list holds (comments and quotes dropped; tags, functions and block
    markers are no names)."""
    text = re.sub(r"\s+#.*$", "", text).strip()
    if text.startswith("[") and text.endswith("]"):
        items = text[1:-1].split(",")
    else:
        items = [text]
    names = [item.strip().strip("'\"") for item in items]
    return [n for n in names if n and not n.startswith(("!", "|", ">", "{", "&", "*"))]


def _names_in(text: str) -> tuple[set[str], bool]:
    """The task, group and tag names of one YAML file's text, and whether it is a group config."""
    names: set[str] = set()
    group = False
    for match in _KEY.finditer(text):
        indent, dash, key, value = match.groups()
        group = group or (key == "group" and not indent and not dash)
        names.update(_value(value))
        if not value and key == "tag":  # a block list on the next lines
            block = _ITEMS.match(text, match.end())
            if block is not None:
                for line in block.group(0).split("\n")[1:]:
                    names.update(_value(line.strip()[1:]))
    return names, group


def _scan(folders: Iterable[Path]) -> tuple[set[str], bool]:
    """The names of every YAML file under ``folders`` (``*.yaml``, ``*.yml`` and templates such as lm-eval's
    ``*_yaml`` or files without a suffix, which task files include)."""
    names: set[str] = set()
    groups = False
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for file in files:
                if not (file.endswith(("yaml", "yml")) or "." not in file):  # templates may lack a suffix
                    continue
                try:
                    with open(os.path.join(root, file), encoding="utf-8", errors="replace") as f:
                        found, group = _names_in(f.read())
                except OSError:
                    continue
                names |= found
                groups = groups or group
    return names, groups


@functools.cache
def _builtin() -> frozenset[str]:
    """The names of lm-eval's installed task folder (read once per process: an installed package's files)."""
    folder = lm_eval_tasks_dir()
    return frozenset(_scan([folder])[0]) if folder is not None else frozenset()


def task_names(include_path: Sequence[str | Path] = ()) -> TaskNames:
    """The names defined by lm-eval's task folder, txl's own and the folders ``include_path``."""
    local, groups = _scan([_HERE, *(Path(p) for p in include_path)])
    return TaskNames(builtin=_builtin(), local=frozenset(local), local_groups=groups)


def check_task_names(
    tasks: Sequence[str], include_path: Sequence[str | Path] = (), *, field: str = "tasks"
) -> TaskNames:
    """The names known (:func:`task_names`), after checking that every one of ``tasks`` is among them: else a
    one-line :class:`~txl.errors.TxlError` naming the unknown ones, the known names closest to each, txl's
    own tasks and ``--include-path``. A folder of ``include_path`` that does not exist is an error too."""
    for folder in include_path:
        if not Path(folder).is_dir():
            raise TxlError(f"include_path: {folder} is not a folder", fields=("include_path",))
    names = task_names(include_path)
    unknown = [name for name in tasks if name not in names.all]
    if unknown:
        close = list(dict.fromkeys(c for n in unknown for c in difflib.get_close_matches(n, names.all, n=5)))
        hint = f"close: {', '.join(close)}; " if close else ""
        own = ", ".join(sorted(_scan([_HERE])[0]))
        raise TxlError(
            f"{field}: unknown task {', '.join(unknown)} ({hint}txl's own: {own}; "
            "add a folder of task YAML files with include_path)",
            fields=(field, "include_path"),
        )
    return names
