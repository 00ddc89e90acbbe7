"""Corpus readers: known corpora by name, text files and folders by path, and the corpora txl generates; owns
where corpora are looked for, their train/valid/test split and where documents begin. Tokens are
:mod:`txl.data.vocab`'s, caching :mod:`txl.data.encoded`'s, fetching :mod:`txl.data.download`'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal, NamedTuple

import numpy as np

from ..errors import CorpusError
from .hf_datasets import is_hf_spec, load_hf_corpus

__all__ = [
    "CORPUS_NAMES",
    "GENERATED_CORPUS_NAMES",
    "SPLITS",
    "DOWNLOADABLE",
    "STDLIB_EXCLUDED_DIRS",
    "CorpusError",
    "FileSpan",
    "Corpus",
    "WIKITEXT_TITLE",
    "wikitext_starts",
    "jsonl_records",
    "cache_root",
    "data_search_dirs",
    "corpus_location",
    "strip_gutenberg",
    "stdlib_files",
    "load_corpus",
    "RECALL_ALPHABET",
    "RECALL_DEFAULT_DISTANCE",
    "recall_positions",
    "synthetic_recall_text",
    "synthetic_recall",
]

CORPUS_NAMES = (
    "tinyshakespeare",
    "books",
    "wikitext-2",
    "wikitext-103",
    "enwik8",
    "text8",
    "ptb",
    "python-stdlib",
)
GENERATED_CORPUS_NAMES = ("synthetic-recall",)
"""Corpora that txl generates in memory (nothing to find on disk); see :func:`synthetic_recall`."""
SPLITS = ("train", "valid", "test")
DOWNLOADABLE = ("wikitext-2", "wikitext-103", "enwik8", "text8", "ptb")

Level = Literal["word", "char", "byte"]

# books/: which novels are held out (the rest is train).
BOOKS_VALID = ("emma.txt",)
BOOKS_TEST = ("the_last_of_the_mohicans.txt",)
_PG_START = re.compile(rb"^\*\*\* ?START OF (?:THIS|THE) PROJECT GUTENBERG EBOOK[^\n]*\n", re.I | re.M)
_PG_END = re.compile(rb"^\*\*\* ?END OF (?:THIS|THE) PROJECT GUTENBERG EBOOK", re.I | re.M)

# python-stdlib: directories skipped while walking the standard library (third-party code and the
# test suites, whose data files include deliberately malformed sources).
STDLIB_EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__", "turtledemo"}
)

_ENWIK8_TRAIN, _ENWIK8_VALID = 90_000_000, 5_000_000

WIKITEXT_TITLE = re.compile(rb"^ = [^=\n](?:[^\n]*[^=\n])? = ?\n(?=[ \t]*(?:\n|\Z))", re.M)
"""An article's title line in WikiText (`` = Valkyria Chronicles III = ``): exactly one ``=`` each side, so a
section heading (`` = = Gameplay = = ``) is not one, and followed by a blank line, as every title is (an
equation line such as `` = 1 <unk> and <unk> C = `` inside an article is not)."""


class FileSpan(NamedTuple):
    """Where a piece of a split came from: `start` is its offset in the split's bytes,
    `file_offset` its offset in `path` (None when the text was normalised, e.g. CRLF -> LF)."""

    path: str
    start: int
    file_offset: int | None


@dataclass(frozen=True)
class Corpus:
    """A corpus read into memory: raw bytes per split plus what is needed to tokenize it.

    name: corpus name (or the file/folder name for a path).
    splits: raw bytes per split; keys among "train", "valid", "test"; a missing split is absent.
    level: the natural vocabulary ("word", "char" or "byte").
    eos_per_line: whether a word vocabulary appends `<eos>` after every line (WikiText, PTB).
    sources: the files each split was read from (for messages).
    fingerprint: sha256 over name, level, eos_per_line and every split's contents (the cache key).
    spans: per split, where each piece came from (to turn a byte offset back into a file offset).
    documents: per split, the byte offsets where its documents begin (increasing, the first 0): a book of
        `books`, a file of `python-stdlib` or of a folder, an article of WikiText, a record of an `hf:` dataset
        or a JSON-lines file. Empty for a corpus without document boundaries (a single text file, enwik8,
        text8, PTB, Tiny Shakespeare, synthetic-recall): its splits are one text each. Not part of the
        fingerprint (the bytes are the same; the encoded-split cache keys the boundaries itself).
    """

    name: str
    splits: Mapping[str, bytes]
    level: Level
    eos_per_line: bool
    sources: Mapping[str, tuple[str, ...]]
    fingerprint: str
    spans: Mapping[str, tuple[FileSpan, ...]] = field(default_factory=dict, repr=False)
    documents: Mapping[str, tuple[int, ...]] = field(default_factory=dict, repr=False)

    @property
    def has_documents(self) -> bool:
        """Whether the corpus says where its documents begin (see ``documents``)."""
        return bool(self.documents)

    def has(self, split: str) -> bool:
        return split in self.splits

    def require(self, split: str) -> bytes:
        """The bytes of `split`, or a CorpusError saying that the split is absent and where it looked."""
        if split not in self.splits:
            present = ", ".join(sorted(self.splits)) or "none"
            read = ", ".join(dict.fromkeys(f for files in self.sources.values() for f in files)) or "none"
            fix = (
                f"add the file or run `txl data download {self.name}`"
                if self.name in DOWNLOADABLE
                else f"provide a {split} file or use another split"
            )
            raise CorpusError(
                f"corpus '{self.name}' has no '{split}' split (present: {present}; files read: {read}); {fix}"
            )
        return self.splits[split]

    def locate(self, split: str, offset: int) -> str:
        """Describe byte `offset` of `split` as a position in its source file."""
        spans = self.spans.get(split, ())
        for span in reversed(spans):
            if offset >= span.start:
                if span.file_offset is None:
                    return f"{span.path} (byte {offset - span.start} of its normalised text)"
                return f"{span.path} at byte offset {span.file_offset + offset - span.start}"
        files = ", ".join(self.sources.get(split, ())) or "<memory>"
        return f"{files} at byte offset {offset}"

    def text(self, split: str) -> str:
        """Strict UTF-8 decode of a split; a CorpusError names the file and byte offset on failure."""
        data = self.require(split)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            where = self.locate(split, err.start)
            raise CorpusError(
                f"corpus '{self.name}' split '{split}' is not valid UTF-8: {where} "
                f"(byte {data[err.start : err.start + 1]!r}, {err.reason}); "
                "re-encode the file as UTF-8 or use a byte-level vocabulary"
            ) from None


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/txl`, else `~/.cache/txl`."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "txl"


def data_search_dirs() -> list[Path]:
    """Folders searched for named corpora: each entry of `$TXL_DATA_DIR` (os.pathsep-separated),
    then the txl cache folder (`~/.cache/txl`, XDG aware)."""
    dirs = [Path(p).expanduser() for p in os.environ.get("TXL_DATA_DIR", "").split(os.pathsep) if p]
    dirs.append(cache_root())
    out: list[Path] = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return out


# ---------------------------------------------------------------------------------------------
# helpers


def _read(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CorpusError(f"cannot read {path}: {err.strerror}; check the path and its permissions") from None
    if not data:
        raise CorpusError(f"file {path} is empty; a corpus file needs text (replace or remove it)")
    return data


def _fingerprint(name: str, level: str, eos_per_line: bool, splits: Mapping[str, bytes]) -> str:
    h = hashlib.sha256()
    h.update(f"txl-corpus-v1\0{name}\0{level}\0{int(eos_per_line)}\0".encode())
    for split in sorted(splits):
        h.update(f"{split}\0{len(splits[split])}\0".encode())
        h.update(splits[split])
    return h.hexdigest()


DocumentRule = Literal["pieces", "wikitext"] | Mapping[str, Iterable[int]] | None
"""How :func:`_make` finds where documents begin: "pieces" (each piece of a split is a document: a book, a
file), "wikitext" (each article title line, :func:`wikitext_starts`), byte offsets per split (records), or
None (no boundaries)."""


def _make(
    name: str,
    level: Level,
    eos_per_line: bool,
    parts: Mapping[str, list[tuple[bytes, str, int | None]]],
    *,
    documents: DocumentRule = None,
) -> Corpus:
    """Build a Corpus from per-split pieces (bytes, source path, offset in that file or None), with its
    document starts found as ``documents`` says."""
    splits: dict[str, bytes] = {}
    sources: dict[str, tuple[str, ...]] = {}
    spans: dict[str, tuple[FileSpan, ...]] = {}
    starts: dict[str, tuple[int, ...]] = {}
    for split in SPLITS:
        pieces = parts.get(split) or []
        if not pieces:
            continue
        buf = bytearray()
        sp: list[FileSpan] = []
        for data, path, file_offset in pieces:
            sp.append(FileSpan(path, len(buf), file_offset))
            buf += data
        if not buf:
            continue
        splits[split] = bytes(buf)
        sources[split] = tuple(dict.fromkeys(p for _, p, _ in pieces))
        spans[split] = tuple(sp)
        if documents == "pieces":
            starts[split] = _first_zero(s.start for s, (data, _, _) in zip(sp, pieces, strict=True) if data)
        elif documents == "wikitext":
            starts[split] = wikitext_starts(splits[split])
        elif documents is not None:
            starts[split] = _first_zero(o for o in documents.get(split, ()) if 0 <= o < len(buf))
    if not splits:
        raise CorpusError(f"corpus '{name}' is empty: no split has any text; check its files")
    return Corpus(
        name=name,
        splits=MappingProxyType(splits),
        level=level,
        eos_per_line=eos_per_line,
        sources=MappingProxyType(sources),
        fingerprint=_fingerprint(name, level, eos_per_line, splits),
        spans=MappingProxyType(spans),
        documents=MappingProxyType(starts),
    )


def _first_zero(offsets: Iterable[int]) -> tuple[int, ...]:
    """Sorted distinct offsets, the first being 0 (the split's first byte always begins a document)."""
    return tuple(sorted({0, *offsets}))


def wikitext_starts(data: bytes) -> tuple[int, ...]:
    """Byte offsets where WikiText's articles begin: 0, and each article title line (:data:`WIKITEXT_TITLE`).
    What comes before the first title (WikiText's files open with a blank line) belongs to the first article."""
    titles = [m.start() for m in WIKITEXT_TITLE.finditer(data)]
    if titles and not data[: titles[0]].strip():
        titles = titles[1:]
    return _first_zero(titles)


def _char_cuts(data: bytes, fractions: Iterable[float], path: Path) -> list[int]:
    """Byte offsets of the cuts at the given fractions of the *characters* of UTF-8 `data`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorpusError(
            f"{path} is not valid UTF-8 at byte offset {err.start}; it is split by characters, "
            "so it must be UTF-8 text"
        ) from None
    if len(text) == len(data):  # ASCII: characters are bytes
        return [int(f * len(text)) for f in fractions]
    return [len(text[: int(f * len(text))].encode("utf-8")) for f in fractions]


def _line_cut(data: bytes, at: int) -> int:
    """Move a cut at byte `at` forward to just after the next newline (or a UTF-8 boundary)."""
    if at <= 0 or at >= len(data):
        return max(0, min(at, len(data)))
    nl = data.find(b"\n", at)
    if nl != -1 and nl - at < max(4096, len(data) // 100):
        return nl + 1
    while at < len(data) and (data[at] & 0xC0) == 0x80:  # do not cut inside a UTF-8 sequence
        at += 1
    return at


def _bucket(relpath: str) -> str:
    """Deterministic ~90/5/5 split assignment of a file by the sha256 of its relative path."""
    v = int.from_bytes(hashlib.sha256(relpath.encode("utf-8")).digest()[:8], "big") % 100
    return "train" if v < 90 else "valid" if v < 95 else "test"


def _with_newline(data: bytes) -> bytes:
    return data if data.endswith(b"\n") else data + b"\n"


def _split_by_file(files: list[tuple[str, Path]]) -> dict[str, list[tuple[bytes, str, int | None]]]:
    parts: dict[str, list[tuple[bytes, str, int | None]]] = {s: [] for s in SPLITS}
    for rel, path in sorted(files):
        try:
            data = path.read_bytes()
        except OSError as err:
            raise CorpusError(f"cannot read {path}: {err.strerror}") from None
        if data:
            parts[_bucket(rel)].append((_with_newline(data), str(path), 0))
    return parts


def strip_gutenberg(data: bytes) -> bytes:
    """CRLF -> LF, and keep only the text between the Project Gutenberg START/END lines if present."""
    data = data.replace(b"\r\n", b"\n")
    start = _PG_START.search(data)
    if start:
        data = data[start.end() :]
    end = _PG_END.search(data)
    if end:
        data = data[: end.start()]
    return data.strip(b"\n") + b"\n"


# ---------------------------------------------------------------------------------------------
# named corpora

_LAYOUTS: dict[str, dict[str, str]] = {
    "wikitext-2": {s: f"wiki.{s}.tokens" for s in SPLITS},
    "wikitext-103": {s: f"wiki.{s}.tokens" for s in SPLITS},
    "ptb": {s: f"ptb.{s}.txt" for s in SPLITS},
    "tinyshakespeare": {"all": "input.txt"},
    "enwik8": {"all": "enwik8"},
    "text8": {"all": "text8"},
}


def _find_folder(name: str, search: list[Path]) -> Path:
    """The first `<dir>/<name>/` holding at least one of the corpus's expected files."""
    for d in search:
        folder = d / name
        if name == "books":
            if folder.is_dir() and any(folder.glob("*.txt")):
                return folder
        elif any((folder / f).is_file() for f in _LAYOUTS[name].values()):
            return folder
    expected = "*.txt" if name == "books" else ", ".join(sorted(set(_LAYOUTS[name].values())))
    looked = ", ".join(str(d / name) for d in search) or "(no search folders)"
    hint = (
        f"run `txl data download {name}`" if name in DOWNLOADABLE else "put the files in one of those folders"
    )
    raise CorpusError(
        f"corpus '{name}' not found: looked for {expected} in {looked}; {hint} "
        "or point $TXL_DATA_DIR at the folder that contains it"
    )


def corpus_location(name: str) -> Path | None:
    """Where the named corpus ``name`` (one of :data:`CORPUS_NAMES`) is on this machine: the folder it is
    read from (the standard library's for ``python-stdlib``), or None when it is not in any of
    :func:`data_search_dirs`."""
    if name == "python-stdlib":
        return Path(sysconfig.get_paths()["stdlib"])
    try:
        return _find_folder(name, data_search_dirs())
    except CorpusError:
        return None


def _load_named(name: str, search: list[Path]) -> Corpus:
    if name == "python-stdlib":
        return _load_stdlib()
    folder = _find_folder(name, search)
    if name in ("wikitext-2", "wikitext-103", "ptb"):
        parts: dict[str, list[tuple[bytes, str, int | None]]] = {}
        for split, fname in _LAYOUTS[name].items():
            path = folder / fname
            if path.is_file():
                parts[split] = [(_read(path), str(path), 0)]
        return _make(name, "word", True, parts, documents=None if name == "ptb" else "wikitext")
    if name == "tinyshakespeare":  # nanoGPT: first 90% of characters train, last 10% valid
        path = folder / "input.txt"
        data = _read(path)
        (cut,) = _char_cuts(data, [0.9], path)
        return _make(
            name,
            "char",
            False,
            {"train": [(data[:cut], str(path), 0)], "valid": [(data[cut:], str(path), cut)]},
        )
    if name in ("enwik8", "text8"):  # 90M / 5M / 5M (bytes for enwik8, characters for text8)
        path = folder / name
        data = _read(path)
        if name == "enwik8":
            a, b = _ENWIK8_TRAIN, _ENWIK8_TRAIN + _ENWIK8_VALID
        else:
            a, b = _char_offsets(data, [_ENWIK8_TRAIN, _ENWIK8_TRAIN + _ENWIK8_VALID], path)
        level: Level = "byte" if name == "enwik8" else "char"
        return _make(
            name,
            level,
            False,
            {
                "train": [(data[:a], str(path), 0)],
                "valid": [(data[a:b], str(path), a)],
                "test": [(data[b:], str(path), b)],
            },
        )
    if name == "books":
        parts = {s: [] for s in SPLITS}
        for path in sorted(folder.glob("*.txt")):
            split = "valid" if path.name in BOOKS_VALID else "test" if path.name in BOOKS_TEST else "train"
            parts[split].append((strip_gutenberg(_read(path)), str(path), None))
        return _make(name, "word", False, parts, documents="pieces")
    raise AssertionError(name)  # pragma: no cover


def _char_offsets(data: bytes, counts: list[int], path: Path) -> list[int]:
    """Byte offsets of the first `counts[i]` characters (identity for ASCII text such as text8)."""
    if data.isascii():
        return [min(c, len(data)) for c in counts]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorpusError(f"{path} is not valid UTF-8 at byte offset {err.start}") from None
    return [len(text[:c].encode("utf-8")) for c in counts]


def stdlib_files() -> list[tuple[str, Path]]:
    """(relative posix path, path) of the standard library's own `.py` files, sorted, skipping
    `STDLIB_EXCLUDED_DIRS` (site-packages, test suites, idlelib, lib2to3, turtledemo)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in STDLIB_EXCLUDED_DIRS and not d.startswith("."))
        for f in filenames:
            if f.endswith(".py"):
                p = Path(dirpath) / f
                out.append((p.relative_to(root).as_posix(), p))
    if not out:
        raise CorpusError(f"no .py files found under the Python standard library at {root}")
    return sorted(out)


def _load_stdlib() -> Corpus:
    return _make("python-stdlib", "byte", False, _split_by_file(stdlib_files()), documents="pieces")


# ---------------------------------------------------------------------------------------------
# paths

_SPLIT_ALIASES = {"train": ("train",), "valid": ("valid", "validation", "val", "dev"), "test": ("test",)}


def _folder_split_files(folder: Path) -> dict[str, Path]:
    """`train.txt`/`valid.txt`/`test.txt`, or files named like `*.train.*` (`wiki.valid.tokens`)."""
    found: dict[str, Path] = {}
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    for split, aliases in _SPLIT_ALIASES.items():
        for p in files:
            parts = p.name.lower().split(".")
            if parts[0] in aliases and len(parts) <= 2 or any(a in parts[1:-1] for a in aliases):
                found.setdefault(split, p)
    return found


def jsonl_records(data: bytes, path: Path, *, text_field: str = "text") -> list[bytes]:
    """The texts of a JSON-lines file's records (one JSON object a line; blank lines skipped), each its
    ``text_field`` as UTF-8 with a newline added where it has none: one document each."""
    out: list[bytes] = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CorpusError(
                f"{path} line {number}: not a JSON object ({err}); a .jsonl file holds one a line"
            ) from None
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise CorpusError(
                f"{path} line {number}: no text field {text_field!r} (a string); set data.text_field"
            )
        out.append(_with_newline(text.encode("utf-8")))
    if not out:
        raise CorpusError(f"file {path} holds no JSON records; a .jsonl corpus needs one object a line")
    return out


def _is_jsonl(path: Path) -> bool:
    return path.suffix.lower() in (".jsonl", ".ndjson")


def _load_jsonl_file(path: Path, text_field: str) -> Corpus:
    """A JSON-lines file: its records, 90/5/5 by their bytes, whole records to each split."""
    records = jsonl_records(_read(path), path, text_field=text_field)
    total, ends = sum(map(len, records)), np.cumsum([len(r) for r in records])
    parts: dict[str, list[tuple[bytes, str, int | None]]] = {s: [] for s in SPLITS}
    for record, end in zip(records, ends, strict=True):
        split = "train" if end <= 0.90 * total else "valid" if end <= 0.95 * total else "test"
        parts[split].append((record, str(path), None))
    return _make(path.name, "char", False, parts, documents="pieces")


def _load_path(path: Path, text_field: str) -> Corpus:
    name = path.name or str(path)
    if path.is_file():
        if _is_jsonl(path):
            return _load_jsonl_file(path, text_field)
        data = _read(path)
        a = _line_cut(data, int(0.90 * len(data)))
        b = _line_cut(data, int(0.95 * len(data)))
        return _make(
            name,
            "char",
            False,
            {
                "train": [(data[:a], str(path), 0)],
                "valid": [(data[a:b], str(path), a)],
                "test": [(data[b:], str(path), b)],
            },
        )
    by_split = _folder_split_files(path)
    if by_split and all(_is_jsonl(p) for p in by_split.values()):  # records are documents
        parts: dict[str, list[tuple[bytes, str, int | None]]] = {
            s: [(r, str(p), None) for r in jsonl_records(_read(p), p, text_field=text_field)]
            for s, p in by_split.items()
        }
        return _make(name, "char", False, parts, documents="pieces")
    if by_split:
        return _make(name, "char", False, {s: [(_read(p), str(p), 0)] for s, p in by_split.items()})
    files = [
        (p.relative_to(path).as_posix(), p)
        for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    ]
    if not files:
        raise CorpusError(
            f"folder {path} holds no files; put text files (or train.txt/valid.txt/test.txt) in it"
        )
    return _make(name, "char", False, _split_by_file(files), documents="pieces")


def load_corpus(spec: str, *, data_dir: Path | None = None, text_field: str = "text") -> Corpus:
    """Load a corpus by name (one of CORPUS_NAMES) or by path (a text file or a folder).

    Names are looked up as `<dir>/<name>/` in `data_dir` if given, else in `data_search_dirs()`.
    A path that is a file is split 90/5/5 (at line ends near those points; a ``.jsonl`` file of records, by
    whole records, each the ``text_field`` of one JSON object); a folder uses train/valid/test files if it has
    them (``.jsonl`` ones are read as records), else assigns its files to splits by a hash of their path.
    Where documents begin is :attr:`Corpus.documents`: see there for which corpora have them.
    A split missing on disk is absent from `Corpus.splits`; callers fail when they need it.
    `synthetic-recall[:distance=D,seed=S]` is generated in memory (see `synthetic_recall`).
    `hf:NAME[:CONFIG]` and `hf-disk:PATH` are Hugging Face datasets, one line of text per row taken from the
    column `text_field` (see `txl.data.hf_datasets`); WikiText and PTB ones are word level with `<eos>` per line.
    """
    if is_hf_spec(spec):
        name, parts, records = load_hf_corpus(spec, text_field=text_field)
        words = any(key in name.lower() for key in ("wikitext", "ptb", "penn"))
        # a WikiText dataset has a row per line: its articles begin at title lines; elsewhere a row is a record
        documents: DocumentRule = "wikitext" if "wikitext" in name.lower() else None if words else records
        return _make(name, "word" if words else "char", words, parts, documents=documents)
    if spec.split(":", 1)[0] in GENERATED_CORPUS_NAMES:
        return synthetic_recall(**_recall_options(spec))
    if spec in CORPUS_NAMES:
        search = [Path(data_dir)] if data_dir is not None else data_search_dirs()
        return _load_named(spec, search)
    path = Path(spec).expanduser()
    if path.exists():
        return _load_path(path, text_field)
    if os.sep in spec or "/" in spec or "." in spec:
        raise CorpusError(f"corpus path {path} does not exist; give an existing file or folder")
    raise CorpusError(
        f"unknown corpus '{spec}': not a known name ({', '.join(CORPUS_NAMES + GENERATED_CORPUS_NAMES)}) "
        "and no such path"
    )


# ---------------------------------------------------------------------------------------------
# generated: synthetic-recall

RECALL_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-"
"""The symbols to remember: 64, so that chance is 1/64 for a model that cannot see them. With this many
symbols a copied sequence rarely repeats a symbol, which lets a small model find the source by content as
well as by position and learn the task in a few hundred steps (with 16 symbols it takes thousands)."""
_RECALL_SYMBOLS = np.array(list(RECALL_ALPHABET))
RECALL_DEFAULT_DISTANCE = 32
RECALL_SPLIT_TOKENS = MappingProxyType({"train": 262_144, "valid": 16_384, "test": 16_384})


def recall_positions(text: str, *, distance: int) -> np.ndarray:
    """Positions p of a synthetic-recall text whose character must equal the one at p - ``distance``: the
    ``distance - 1`` characters after each ``|`` (the second copy). int64, increasing; a copy cut off by the
    end of the text keeps the part inside it."""
    marks = np.flatnonzero(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32) == ord("|"))  # (lines,)
    positions = (marks[:, None] + 1 + np.arange(distance - 1)[None, :]).reshape(-1)  # (lines * (D-1),)
    return positions[positions < len(text)].astype(np.int64)


def synthetic_recall_text(n_tokens: int, *, distance: int, seed: int) -> str:
    """About ``n_tokens`` characters (whole lines) of the recall task, deterministic in ``seed``.

    Each line is ``f r|r\\n``: ``r`` is ``distance - 1`` symbols drawn uniformly from :data:`RECALL_ALPHABET`
    and ``f`` a filler of 0 to ``distance - 1`` such symbols (so that lines do not all start at multiples of
    one length). Every symbol of the second copy repeats the one exactly ``distance`` characters before it
    (:func:`recall_positions`); the filler and the first copy are unpredictable."""
    if distance < 2:
        raise CorpusError(f"synthetic-recall: distance must be at least 2, got {distance}")
    rng = np.random.default_rng(seed)
    lines: list[str] = []
    size = 0
    while size < n_tokens:
        filler, copy = rng.integers(0, distance), "".join(rng.choice(_RECALL_SYMBOLS, size=distance - 1))
        lines.append("".join(rng.choice(_RECALL_SYMBOLS, size=filler)) + f"{copy}|{copy}\n")
        size += len(lines[-1])
    return "".join(lines)


def synthetic_recall(*, distance: int = RECALL_DEFAULT_DISTANCE, seed: int = 0) -> Corpus:
    """The ``synthetic-recall`` corpus: character level, generated in memory (no files), with train, valid
    and test splits drawn from independent seeds. Named ``synthetic-recall`` (distance 32, seed 0) or
    ``synthetic-recall:distance=D,seed=S`` as a corpus spec."""
    parts: dict[str, list[tuple[bytes, str, int | None]]] = {}
    for index, (split, size) in enumerate(RECALL_SPLIT_TOKENS.items()):
        text = synthetic_recall_text(size, distance=distance, seed=seed * 3 + index)
        parts[split] = [(text.encode("ascii"), f"<synthetic-recall {split}>", 0)]
    name = (
        "synthetic-recall"
        if (distance, seed) == (RECALL_DEFAULT_DISTANCE, 0)
        else (f"synthetic-recall-d{distance}-s{seed}")
    )
    return _make(name, "char", False, parts)


def _recall_options(spec: str) -> dict[str, int]:
    """``synthetic-recall:distance=128,seed=1`` -> {"distance": 128, "seed": 1}."""
    _, _, rest = spec.partition(":")
    options: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in ("distance", "seed") or not value.strip().isdigit():
            raise CorpusError(
                f"corpus {spec!r}: expected synthetic-recall:distance=D,seed=S (non-negative "
                f"integers), got {item!r}"
            )
        options[key.strip()] = int(value)
    return options
