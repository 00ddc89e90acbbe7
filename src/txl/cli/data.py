"""``txl data download`` and ``txl data list``: the corpora txl knows, where they are, how to get them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..files import check_output
from .command import Command, Group
from .options import given

__all__ = ["DATA", "DOWNLOAD", "LIST"]

DATA = Group(name="data", help="corpora: list, download", dest="data_command")
"""``txl data``."""

_LOWER = "the memory in use by other programs"


def _cmd_data_download(args: argparse.Namespace) -> int:
    from ..data import download_corpus
    from ..data.download import default_download_dir

    check_output(Path(args.dest) if args.dest else default_download_dir(), flag="--dest")
    folder = download_corpus(
        args.name,
        dest=Path(args.dest) if args.dest else None,
        **given(args, "url", "sha256"),
        progress=not args.quiet,
    )
    print(folder)
    return 0


def _cmd_data_list(args: argparse.Namespace) -> int:
    from ..data import CORPUS_NAMES, DOWNLOADS, GENERATED_CORPUS_NAMES, data_search_dirs
    from ..data.corpora import corpus_location

    present = {name: corpus_location(name) for name in CORPUS_NAMES}
    if args.json:
        record = {
            "corpora": list(CORPUS_NAMES),
            "generated": list(GENERATED_CORPUS_NAMES),
            "downloadable": sorted(DOWNLOADS),
            "search_dirs": [str(p) for p in data_search_dirs()],
            "present": {name: None if p is None else str(p) for name, p in present.items()},
        }
        print(json.dumps(record, indent=1))
        return 0
    width = max(map(len, (*CORPUS_NAMES, *GENERATED_CORPUS_NAMES)))
    print(f"{'corpus':<{width}}  {'here':<9}  where, or how to get it")
    for name, where in present.items():
        if where is not None:
            print(f"{name:<{width}}  {'present':<9}  {where}")
        else:
            place = data_search_dirs()[0] / name
            how = f"txl data download {name}" if name in DOWNLOADS else f"put its files in {place}"
            print(f"{name:<{width}}  {'missing':<9}  {how}")
    for name in GENERATED_CORPUS_NAMES:
        print(f"{name:<{width}}  {'generated':<9}  made in memory, nothing to fetch")
    folders = ", ".join(str(p) for p in data_search_dirs())
    print(f"\nsearch folders ($TXL_DATA_DIR, then the cache): {folders}")
    print("any text file, folder or hf:NAME dataset is also a corpus (data.corpus=PATH)")
    return 0


def _download_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument("--dest", help="folder to put it in (default: $TXL_DATA_DIR or ~/.cache/txl)")
    p.add_argument("--url", help="another address for the archive (a mirror)")
    p.add_argument("--sha256", help="the expected SHA-256 of that archive (default: the pinned one)")
    p.add_argument("--quiet", action="store_true")


def _list_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")


DOWNLOAD = Command(
    name="download",
    parent="data",
    help="download and verify a corpus archive",
    arguments=_download_arguments,
    handler=_cmd_data_download,
    lower=_LOWER,
)
"""``txl data download``."""

LIST = Command(
    name="list",
    parent="data",
    help="known corpora: which are present on this machine, where, and how to get the others",
    arguments=_list_arguments,
    handler=_cmd_data_list,
    lower=_LOWER,
)
"""``txl data list``."""
