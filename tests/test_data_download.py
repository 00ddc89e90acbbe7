"""download_corpus against a local HTTP server: full download, Range resume, checksum failures."""

from __future__ import annotations

import hashlib
import io
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from txl.data import DOWNLOADS, CorpusError, UnverifiedDownloadWarning, download_corpus, load_corpus


class _Server:
    """Serves `files` (path -> bytes) on 127.0.0.1; honours Range unless `ignore_range`."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.ignore_range = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                rng = self.headers.get("Range")
                server.requests.append((self.path, rng))
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                if rng and not server.ignore_range:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(data):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                self.wfile.write(data[start:])

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def _wikitext_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:  # stored: big enough to cut mid-way
        for split in ("train", "valid", "test"):
            zf.writestr(
                f"wikitext-2/wiki.{split}.tokens", f" = {split} = \n" + f"{split} words here .\n" * 2000
            )
        zf.writestr("wikitext-2/README", "not extracted")
    return buf.getvalue()


def test_registry_covers_downloadable_corpora():
    assert set(DOWNLOADS) == {"wikitext-2", "wikitext-103", "enwik8", "text8", "ptb"}
    for spec in DOWNLOADS.values():
        for rf in spec.files:
            assert rf.url.startswith("http") and (rf.sha256 is None or len(rf.sha256) == 64)


def test_full_download_verifies_and_extracts(tmp_path, server):
    data = _wikitext_zip()
    server.files["/wt2.zip"] = data
    out = download_corpus(
        "wikitext-2",
        dest=tmp_path,
        url=server.url + "/wt2.zip",
        sha256=hashlib.sha256(data).hexdigest(),
        progress=False,
    )
    assert out == tmp_path / "wikitext-2"
    assert sorted(p.name for p in out.iterdir()) == [
        "wiki.test.tokens",
        "wiki.train.tokens",
        "wiki.valid.tokens",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wikitext-2"]  # no .part or staging left
    c = load_corpus("wikitext-2", data_dir=tmp_path)
    assert set(c.splits) == {"train", "valid", "test"} and c.text("valid").startswith(" = valid = ")


@pytest.mark.parametrize("ignore_range", [False, True])
def test_resume_from_partial_file(tmp_path, server, ignore_range):
    data = _wikitext_zip()
    server.files["/wt2.zip"] = data
    server.ignore_range = ignore_range
    cut = len(data) // 3
    (tmp_path / "wikitext-2.part").write_bytes(data[:cut])
    out = download_corpus(
        "wikitext-2",
        dest=tmp_path,
        url=server.url + "/wt2.zip",
        sha256=hashlib.sha256(data).hexdigest(),
        progress=False,
    )
    assert server.requests == [("/wt2.zip", f"bytes={cut}-")]  # asked only for the rest
    assert (out / "wiki.train.tokens").read_text().count("train words here") == 2000
    assert not (tmp_path / "wikitext-2.part").exists()


def test_checksum_mismatch_deletes_and_leaves_no_corpus(tmp_path, server):
    server.files["/wt2.zip"] = _wikitext_zip()
    with pytest.raises(CorpusError, match="checksum mismatch"):
        download_corpus(
            "wikitext-2", dest=tmp_path, url=server.url + "/wt2.zip", sha256="0" * 64, progress=False
        )
    assert list(tmp_path.iterdir()) == []


def test_pinned_checksum_applies_to_a_url_override(tmp_path, server):
    server.files["/wt2.zip"] = _wikitext_zip()  # not the real archive: must fail the pinned digest
    with pytest.raises(CorpusError, match=DOWNLOADS["wikitext-2"].files[0].sha256):
        download_corpus("wikitext-2", dest=tmp_path, url=server.url + "/wt2.zip", progress=False)
    assert not (tmp_path / "wikitext-2").exists()


def test_unpinned_download_warns_with_the_digest(tmp_path, server, capsys):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("enwik8", "<mediawiki>" + "x" * 1000)
    server.files["/enwik8.zip"] = buf.getvalue()
    digest = hashlib.sha256(buf.getvalue()).hexdigest()
    with pytest.warns(UnverifiedDownloadWarning, match=digest):
        out = download_corpus("enwik8", dest=tmp_path, url=server.url + "/enwik8.zip", progress=False)
    assert digest in capsys.readouterr().err
    assert (out / "enwik8").read_bytes().startswith(b"<mediawiki>")


def test_http_errors_and_unknown_names(tmp_path, server):
    with pytest.raises(CorpusError, match="HTTP 404"):
        download_corpus("enwik8", dest=tmp_path, url=server.url + "/missing.zip", progress=False)
    with pytest.raises(CorpusError, match="no download known for 'books'"):
        download_corpus("books", dest=tmp_path)
    with pytest.raises(CorpusError, match="single url"):
        download_corpus("ptb", dest=tmp_path, url=server.url + "/x")


def test_cli_data_download(server, tmp_path, capsys):
    from txl.cli import main

    archive = _wikitext_zip()
    server.files["/mirror/wikitext-2-v1.zip"] = archive
    url = server.url + "/mirror/wikitext-2-v1.zip"
    # The pinned checksum of the real archive does not match this one: refused, nothing left behind.
    assert main(["data", "download", "wikitext-2", "--dest", str(tmp_path), "--url", url, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("txl: error:") and "sha" in err[0].lower()
    assert not (tmp_path / "wikitext-2" / "wiki.train.tokens").exists()
    digest = hashlib.sha256(archive).hexdigest()
    assert (
        main(
            [
                "data",
                "download",
                "wikitext-2",
                "--dest",
                str(tmp_path),
                "--url",
                url,
                "--sha256",
                digest,
                "--quiet",
            ]
        )
        == 0
    )
    folder = capsys.readouterr().out.strip()
    assert folder == str(tmp_path / "wikitext-2")
    corpus = load_corpus("wikitext-2", data_dir=tmp_path)
    assert corpus.text("valid").startswith(" = valid = ")
