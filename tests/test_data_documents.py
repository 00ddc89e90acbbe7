"""Corpora with documents (issue 20, the data side): each corpus kind says where its documents begin, the
boundaries reach token indices (the encoded-split cache keys them), the segment stream marks them in every
batch (``Batch.starts``), ``data.documents`` is validated and recorded; with "reset" the trainer and
evaluation pass them to the model (a document evaluated among others loses exactly what it loses alone),
checkpoints keep the memory's reach and a resumed run continues float for float; with "continue" nothing
reaches the model. ``txl eval --documents`` and ``txl analyze documents`` end to end."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import STDLIB, run_config, shared_data_dirs, train_losses, write_documents_corpus
from txl.analysis.documents import token_losses
from txl.cli import main
from txl.config import (
    ConfigError,
    DataConfig,
    RunConfig,
    Span,
    TransformerXLConfig,
    apply_overrides,
    config_from_dict,
)
from txl.data import BatchSettings, SegmentStream, load_corpus, prepare_data
from txl.data.corpora import CorpusError, stdlib_files
from txl.data.encoded import cache_path, encode_documents
from txl.data.vocab import ByteVocab, CharVocab, WordVocab
from txl.evaluation import EvalSettings, evaluate, segment_losses
from txl.model import TransformerXL
from txl.runs import latest_checkpoint
from txl.train.trainer import resume, train


def _documents(corpus, split: str) -> list[bytes]:
    """The documents of a split, cut at its starts."""
    data, starts = corpus.splits[split], [*corpus.documents[split], len(corpus.splits[split])]
    return [data[a:b] for a, b in zip(starts, starts[1:], strict=False)]


# ---------------------------------------------------------------------------------------------------------
# corpora


def test_books_each_book_is_a_document(tmp_path):
    folder = tmp_path / "books"
    folder.mkdir()
    texts = {
        "alpha.txt": "It was the best of times.\r\nIt was the worst.\r\n",
        "beta.txt": "*** START OF THE PROJECT GUTENBERG EBOOK B ***\nCall me Ishmael.\n*** END OF THE PROJECT GUTENBERG EBOOK B ***\nlicence",
        "emma.txt": "Emma Woodhouse, handsome, clever.\n",
        "the_last_of_the_mohicans.txt": "The woods.\n",
    }
    for name, text in texts.items():
        (folder / name).write_text(text, encoding="utf-8")
    corpus = load_corpus("books", data_dir=tmp_path)
    assert _documents(corpus, "train") == [
        b"It was the best of times.\nIt was the worst.\n",
        b"Call me Ishmael.\n",
    ]
    assert corpus.documents["valid"] == (0,) and corpus.documents["test"] == (0,)
    assert corpus.has_documents


def test_stdlib_each_file_is_a_document():
    corpus = load_corpus("python-stdlib")
    contents = {path.read_bytes().rstrip(b"\n") for _, path in stdlib_files()}
    for split in ("valid", "test"):
        docs = _documents(corpus, split)
        assert len(docs) > 10
        assert all(doc.rstrip(b"\n") in contents for doc in docs)  # each is one whole file
    assert sum(len(corpus.documents[s]) for s in corpus.splits) == sum(
        1 for _, p in stdlib_files() if p.stat().st_size
    )


def test_folder_files_are_documents_and_split_files_or_one_file_are_not(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    files = {f"n{i:02d}.txt": f"note {i}\n" + "word " * i for i in range(40)}
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    corpus = load_corpus(str(folder))
    docs = [d.decode() for s in corpus.splits for d in _documents(corpus, s)]
    assert sorted(docs) == sorted(t if t.endswith("\n") else t + "\n" for t in files.values())

    split_folder = tmp_path / "splits"
    split_folder.mkdir()
    for split in ("train", "valid", "test"):
        (split_folder / f"{split}.txt").write_text(f"{split} text\nmore\n", encoding="utf-8")
    assert not load_corpus(str(split_folder)).has_documents
    single = tmp_path / "one.txt"
    single.write_text("line\n" * 200, encoding="utf-8")
    assert not load_corpus(str(single)).has_documents  # a single text file is one document: no boundaries
    for spec in ("tinyshakespeare", "synthetic-recall"):
        if spec == "tinyshakespeare" and not any(
            (d / spec / "input.txt").is_file() for d in shared_data_dirs()
        ):
            continue
        data_dir = next((d for d in shared_data_dirs() if (d / spec).is_dir()), None)
        assert not load_corpus(spec, data_dir=data_dir).has_documents


WIKI = (
    " \n = Alpha = \n \n Alpha is a letter . \n \n = = History = = \n \n It is old . \n"
    " = 1 k and C = \n 1 k is an equation line . \n \n = Beta ( letter ) = \n \n Beta follows . \n"
    " = = = Usage = = = \n \n x \n"
)


def test_wikitext_articles_begin_at_title_lines_only(tmp_path):
    folder = tmp_path / "wikitext-2"
    folder.mkdir()
    for split in ("train", "valid", "test"):
        (folder / f"wiki.{split}.tokens").write_text(WIKI, encoding="utf-8")
    corpus = load_corpus("wikitext-2", data_dir=tmp_path)
    beta = WIKI.index(" = Beta")
    assert corpus.documents["valid"] == (0, beta)  # not the section, subsection or equation lines
    assert _documents(corpus, "valid")[1].startswith(b" = Beta ( letter ) = \n")


def test_real_wikitext2_has_its_60_validation_and_60_test_articles():
    data_dir = next(
        (d for d in shared_data_dirs() if (d / "wikitext-2" / "wiki.valid.tokens").is_file()), None
    )
    if data_dir is None:
        pytest.skip("wikitext-2 is not in $TXL_DATA_DIR or ../shared/data")
    corpus = load_corpus("wikitext-2", data_dir=data_dir)
    assert len(corpus.documents["valid"]) == 60 and len(corpus.documents["test"]) == 60
    for doc in _documents(corpus, "test")[1:]:
        assert doc.startswith(b" = ") and not doc.startswith(b" = = ")


def test_real_books_each_novel_is_a_document():
    data_dir = next((d for d in shared_data_dirs() if (d / "books").is_dir()), None)
    if data_dir is None:
        pytest.skip("books is not in $TXL_DATA_DIR or ../shared/data")
    corpus = load_corpus("books", data_dir=data_dir)
    novels = sorted(p.name for p in (data_dir / "books").glob("*.txt"))
    assert len(corpus.documents["train"]) == len(novels) - 2  # emma is valid, the mohicans test
    assert [span.start for span in corpus.spans["train"]] == list(corpus.documents["train"])


def test_jsonl_records_are_documents(tmp_path):
    folder = write_documents_corpus(tmp_path / "docs")
    corpus = load_corpus(str(folder))
    records = [json.loads(line)["text"] for line in (folder / "valid.jsonl").read_text().splitlines()]
    assert [d.decode() for d in _documents(corpus, "valid")] == [
        r if r.endswith("\n") else r + "\n" for r in records
    ]
    single = tmp_path / "records.jsonl"
    single.write_text(
        "\n".join(json.dumps({"body": f"record {i} " * (i % 7 + 1)}) for i in range(200)) + "\n"
    )
    one = load_corpus(str(single), text_field="body")
    assert sum(len(one.documents[s]) for s in one.splits) == 200  # whole records to each split, 90/5/5
    assert one.documents.keys() == {"train", "valid", "test"}
    with pytest.raises(CorpusError, match="no text field 'text'"):
        load_corpus(str(single))
    single.write_text('{"text": "a"}\nnot json\n')
    with pytest.raises(CorpusError, match="line 2: not a JSON object"):
        load_corpus(str(single))


def test_hf_records_are_documents_and_wikitext_rows_are_lines(tmp_path):
    datasets = pytest.importorskip(
        "datasets", reason="hf: corpora need Hugging Face datasets: transformer-xl[datasets]"
    )
    records = ["first record\nwith two lines", "second", "", "third record"]
    data = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": records * 3})})
    data.save_to_disk(str(tmp_path / "notes"))
    corpus = load_corpus(f"hf-disk:{tmp_path / 'notes'}")
    assert [d.decode() for d in _documents(corpus, "train")] == [r + "\n" for r in records * 3]
    rows = WIKI.splitlines(keepends=True)
    data = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": rows})})
    data.save_to_disk(str(tmp_path / "wikitext-mini"))
    wiki = load_corpus(f"hf-disk:{tmp_path / 'wikitext-mini'}")
    assert wiki.documents["train"] == (0, WIKI.index(" = Beta"))  # articles, not rows


# ---------------------------------------------------------------------------------------------------------
# token indices and the cache


@pytest.mark.parametrize("kind", ["byte", "char", "word"])
def test_token_starts_are_where_each_document_alone_begins(tmp_path, kind):
    corpus = load_corpus(str(write_documents_corpus(tmp_path / "docs")))
    vocab = {
        "byte": ByteVocab(),
        "char": CharVocab.build(corpus.text("train")),
        "word": WordVocab.build(corpus.text("train"), tokenizer="regex"),
    }[kind]
    ids, starts = encode_documents(corpus, "valid", vocab, cache_dir=tmp_path / "cache")
    docs = _documents(corpus, "valid")
    alone = [vocab.encode(d if kind == "byte" else d.decode()) for d in docs]
    kept = [a for a in alone if len(a)]
    assert len(starts) == len(kept) and starts[0] == 0
    for begin, end, doc in zip(starts, [*starts[1:], len(ids)], kept, strict=True):
        assert np.array_equal(ids[begin:end], doc)
    # for these vocabularies a document's tokens are also its tokens within the whole split
    whole = vocab.encode(corpus.splits["valid"] if kind == "byte" else corpus.text("valid"))
    assert np.array_equal(ids, whole)


def test_cache_stores_the_starts_keyed_apart_from_old_caches(tmp_path):
    corpus = load_corpus(str(write_documents_corpus(tmp_path / "docs")))
    vocab, cache = ByteVocab(), tmp_path / "cache"
    # a cache file written before documents were known: its key has no documents in it
    old_key = hashlib.sha256(
        json.dumps([1, corpus.fingerprint, "valid", vocab.fingerprint]).encode()
    ).hexdigest()
    old = cache / f"docs.valid.byte.{old_key[:24]}.npy"
    cache.mkdir()
    np.save(old, np.zeros(5, dtype=np.uint8))
    assert cache_path(corpus, "valid", vocab, cache_dir=cache) != old
    ids, starts = encode_documents(corpus, "valid", vocab, cache_dir=cache)
    assert len(ids) == len(corpus.splits["valid"]) and len(starts) == len(corpus.documents["valid"])
    saved = cache_path(corpus, "valid", vocab, cache_dir=cache)
    assert saved.is_file() and saved.with_name(saved.name.replace(".npy", ".starts.npy")).is_file()
    np.save(saved.with_name(saved.name.replace(".npy", ".starts.npy")), np.array([0, 7], dtype=np.int64))
    again_ids, again = encode_documents(corpus, "valid", vocab, cache_dir=cache)
    assert list(again) == [0, 7]  # read from the cache, not encoded again
    assert np.array_equal(again_ids, ids)
    # a corpus without documents keeps the key (and files) it had
    single = tmp_path / "one.txt"
    single.write_text("line\n" * 500)
    plain = load_corpus(str(single))
    key = hashlib.sha256(json.dumps([1, plain.fingerprint, "train", vocab.fingerprint]).encode()).hexdigest()
    assert cache_path(plain, "train", vocab, cache_dir=cache).name == f"one.txt.train.byte.{key[:24]}.npy"
    assert encode_documents(plain, "train", vocab, cache_dir=cache)[1] is None


def test_prepared_data_has_the_starts_of_each_split(tmp_path):
    folder = write_documents_corpus(tmp_path / "docs")
    data = prepare_data(DataConfig(corpus=str(folder), vocab="byte", cache_dir=str(tmp_path / "c")))
    assert data.starts.keys() == {"train", "valid", "test"}
    for split, starts in data.starts.items():
        lengths = [len(d) for d in _documents(data.corpus, split)]
        assert list(starts) == list(np.cumsum([0, *lengths[:-1]]))


# ---------------------------------------------------------------------------------------------------------
# config


def test_documents_field_is_validated_defaulted_and_recorded(tmp_path, capsys):
    assert DataConfig().documents == "continue" and RunConfig().data.documents == "continue"
    with pytest.raises(ConfigError, match=r"^data\.documents: must be one of 'continue', 'reset'"):
        apply_overrides(RunConfig(), ["data.documents=restart"])
    with pytest.raises(ConfigError, match=r"documents"):
        DataConfig(documents="always")
    assert config_from_dict({"data": {"corpus": "books"}}).data.documents == "continue"  # an old run
    single = tmp_path / "one.txt"
    single.write_text("some text\n" * 3000)
    with pytest.raises(
        ConfigError, match=r"^data\.documents: 'reset' needs a corpus with document boundaries"
    ):
        prepare_data(DataConfig(corpus=str(single), documents="reset", cache_dir=str(tmp_path / "c")))
    code = main(["train", "--config", "tiny", "--set", f"data.corpus={json.dumps(str(single))}",
                 "--set", "data.documents=reset", "--out", str(tmp_path / "run"), "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and err.startswith("txl: error: data.documents:") and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------------------
# the stream


def _naive_marks(starts: set[int], row_start: int, pos: int, t: int, limit: int) -> list[bool]:
    return [row_start + pos + i in starts and pos + i < limit for i in range(t)]


@pytest.mark.parametrize("drop_last", [True, False])
def test_stream_marks_document_starts_in_every_batch_and_resumes(drop_last):
    n, b = 1003, 3
    rng = np.random.default_rng(1)
    starts = np.unique(np.concatenate([[0], rng.integers(1, n, 60)]))
    tokens = np.arange(n)  # each token its own index: an input says where it stands
    stream = SegmentStream(
        tokens,
        BatchSettings(batch_size=b, tgt_len=16, varlen=True, seed=3, drop_last=drop_last),
        starts=starts,
    )
    row = n // b
    seen = set()
    batches = []
    pos = 0
    for batch in stream:
        batches.append(batch)
        assert batch.starts.dtype == torch.bool and batch.starts.shape == batch.inputs.shape
        t = batch.inputs.shape[1]
        real = torch.ones_like(batch.starts) if batch.mask is None else batch.mask  # (B, T)
        for r in range(b):
            if drop_last:
                expected = _naive_marks(set(starts.tolist()), r * row, pos, t, row)
            else:  # streams cut at document starts: a start is marked wherever it is read
                expected = [
                    bool(real[r, i]) and int(batch.inputs[r, i]) in set(starts.tolist()) for i in range(t)
                ]
            assert batch.starts[r].tolist() == expected
            seen.update(int(batch.inputs[r, i]) for i in range(t) if expected[i])
        pos += t
    if drop_last:
        reachable = {s for s in starts.tolist() if (s % row) < row - 1 and s < b * row}
    else:
        reachable = {s for s in starts.tolist() if s < n - 1}  # every token but the last is an input
        inputs = torch.cat([x.inputs for x in batches], dim=1)  # (B, L)
        masks = [torch.ones_like(x.starts) if x.mask is None else x.mask for x in batches]
        real = torch.cat(masks, dim=1)  # (B, L): rows padded in front and behind
        firsts = [int(inputs[r][real[r]][0]) for r in range(b)]
        assert all(f in set(starts.tolist()) for f in firsts)  # each row begins with a document
    assert seen == reachable  # every start an input of some batch is marked, once
    # resumed from a state_dict halfway, the same marks follow
    again = SegmentStream(
        tokens,
        BatchSettings(batch_size=b, tgt_len=16, varlen=True, seed=3, drop_last=drop_last),
        starts=starts,
    )
    it = iter(again)
    for _ in range(5):
        next(it)
    state = again.state_dict()
    resumed = SegmentStream(
        tokens,
        BatchSettings(batch_size=b, tgt_len=16, varlen=True, seed=3, drop_last=drop_last),
        starts=starts,
    )
    resumed.load_state_dict(state)
    for got, want in zip(resumed, batches[5:], strict=True):
        assert torch.equal(got.starts, want.starts) and torch.equal(got.inputs, want.inputs)
    half = batches[0].select(slice(1, 3)).to("cpu")
    assert torch.equal(half.starts, batches[0].starts[1:3])
    assert SegmentStream(tokens, BatchSettings(batch_size=b, tgt_len=16)).__iter__().__next__().starts is None


# ---------------------------------------------------------------------------------------------------------
# evaluation: the exact property


DOC_LENGTHS = (9, 41, 3, 66, 17, 30, 2, 55)


def _float64_model() -> TransformerXL:
    torch.manual_seed(0)
    config = TransformerXLConfig(
        vocab_size=50, n_layer=2, n_head=2, d_head=8, d_model=16, d_inner=32, mem_len=80
    )
    return TransformerXL(config).double().eval()


def _doc_tokens() -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50, n) for n in DOC_LENGTHS]
    starts = np.cumsum([0, *DOC_LENGTHS[:-1]])
    return np.concatenate(docs), starts, docs


def _per_token(model, tokens, starts=None, **kwargs) -> np.ndarray:
    settings = EvalSettings(batch_size=1, tgt_len=12, **kwargs)
    losses = [s.loss[0] for s in segment_losses(model, tokens, settings, starts=starts)]
    return torch.cat(losses).numpy()  # (N - 1,) target i + 1


@pytest.mark.parametrize("reuse_keys", [True, False], ids=["cache", "memory"])
def test_reset_evaluation_gives_each_document_its_losses_alone(reuse_keys):
    model = _float64_model()
    tokens, starts, docs = _doc_tokens()
    span = Span(mem_len=80)  # longer than every document
    together = _per_token(model, tokens, starts=starts, span=span, reuse_keys=reuse_keys)
    across = _per_token(model, tokens, span=span, reuse_keys=reuse_keys)
    worst = 0.0
    for begin, doc in zip(starts, docs, strict=True):
        alone = _per_token(model, doc, span=span, reuse_keys=reuse_keys)
        inside = together[begin : begin + len(doc) - 1]  # targets 2nd .. last token of the document
        worst = max(worst, float(np.abs(inside - alone).max()))
    assert worst < 1e-12, worst
    # the sum: each document alone, plus the boundary targets (a document's first token, read after the
    # previous document's last one)
    boundary = together[starts[1:] - 1].sum()
    alone_sum = sum(_per_token(model, d, span=span).sum() for d in docs)
    assert abs(together.sum() - (alone_sum + boundary)) < 1e-9
    assert np.abs(together - across).max() > 1e-3  # reading across documents is another thing
    # evaluate() with the starts is the mean of the same losses
    result = evaluate(
        model, tokens, EvalSettings(batch_size=1, tgt_len=12, span=span, reuse_keys=reuse_keys), starts=starts
    )
    assert abs(result.loss - together.mean()) < 1e-12 and result.tokens == len(tokens) - 1


def _each_document_alone(model, docs) -> np.ndarray:
    """The reference, independent of the segment reader: each document in one pass of its own (no memory,
    no starts), its inputs every token and its targets the next ones, the last the next document's first
    token (what a document's end predicts): (N - 1,) losses in token order."""
    out = []
    with torch.no_grad():
        for index, doc in enumerate(docs):
            follow = [int(docs[index + 1][0])] if index + 1 < len(docs) else []
            ids = torch.as_tensor(np.concatenate([doc, follow]), dtype=torch.long)[None]  # (1, n + 1)
            loss = model(ids[:, :-1], targets=ids[:, 1:], span=Span(mem_len=0)).loss[0]
            out.append(loss.numpy())
    return np.concatenate(out)


@pytest.mark.parametrize("reuse_keys", [True, False], ids=["cache", "memory"])
def test_reset_evaluation_reads_each_document_alone_in_any_number_of_streams(reuse_keys):
    """In B streams each document is read alone, as one pass over it computes (the reference above): the
    figure and every token's loss, whatever B; with a memory shorter than the documents (where alignment in
    segments matters) the figure still does not depend on B."""
    model = _float64_model()
    tokens, starts, docs = _doc_tokens()
    reference = _each_document_alone(model, docs)
    assert len(reference) == len(tokens) - 1
    for rows in (1, 2, 3, 4, 5, 8, 32):
        result = evaluate(
            model, tokens, EvalSettings(batch_size=rows, tgt_len=12, span=Span(mem_len=80),
            reuse_keys=reuse_keys), starts=starts,
        )  # fmt: skip
        assert abs(result.loss - reference.mean()) < 1e-12 and result.tokens == len(tokens) - 1, rows
        losses = token_losses(
            model, tokens, EvalSettings(tgt_len=12, span=Span(mem_len=80), batch_size=rows), starts=starts
        )
        assert np.abs(losses - reference).max() < 1e-12, rows
    short = [
        evaluate(model, tokens, EvalSettings(batch_size=rows, tgt_len=12, span=Span(mem_len=8),
                 reuse_keys=reuse_keys), starts=starts).loss
        for rows in (1, 2, 4, 7)
    ]  # fmt: skip
    assert max(short) - min(short) < 1e-12, short
    assert abs(short[0] - reference.mean()) > 1e-8  # a short memory reads less: the check is not vacuous


# ---------------------------------------------------------------------------------------------------------
# training, checkpoints, the CLI


def _docs_config(folder, *overrides):
    return run_config(folder, "train.log_every=1", "train.eval_tokens=1500", "train.eval_every=0", *overrides)


def test_continue_never_passes_starts_and_reset_passes_the_batch_starts(tmp_path, monkeypatch):
    folder = write_documents_corpus(tmp_path / "docs")
    seen: list[object] = []
    forward = TransformerXL.forward

    def spy(self, tokens, **kwargs):
        seen.append(kwargs.get("starts", "absent"))
        return forward(self, tokens, **kwargs)

    monkeypatch.setattr(TransformerXL, "forward", spy)
    train(_docs_config(folder, "train.steps=6"), tmp_path / "continue", progress=False)
    assert seen and all(s == "absent" for s in seen)
    seen.clear()
    train(_docs_config(folder, "train.steps=6", "data.documents=reset"), tmp_path / "reset", progress=False)
    given = [s for s in seen if not isinstance(s, str)]
    assert len(given) == len(seen) and any(bool(s.any()) for s in given)
    assert json.loads((tmp_path / "reset" / "config.json").read_text())["data"]["documents"] == "reset"
    assert train_losses(tmp_path / "reset") != train_losses(tmp_path / "continue")


def test_reset_run_resumes_with_the_memory_reach_float_for_float(tmp_path):
    folder = write_documents_corpus(tmp_path / "docs")
    b, t, m = 4, 16, 64
    common = ('train.schedule="constant"', "train.checkpoint_every=10", "data.documents=reset",
              "model.dropout=0.1", f"train.batch_size={b}", f"train.tgt_len={t}", f"model.mem_len={m}")  # fmt: skip
    train(_docs_config(folder, "train.steps=30", *common), tmp_path / "reference", progress=False)
    config = _docs_config(folder, "train.steps=20", *common)
    train(config, tmp_path / "resumed", progress=False)
    tensors = load_file(str(latest_checkpoint(tmp_path / "resumed") / "state.safetensors"))
    # the reach after 20 steps, counted here: positions since the row's last document start, at most M
    data = prepare_data(config.data)
    row = len(data.splits["train"]) // b
    starts = data.starts["train"]
    expected = []
    for r in range(b):
        inside = starts[(starts >= r * row) & (starts < r * row + 20 * t)] - r * row
        expected.append(min(m, 20 * t - int(inside[-1])) if len(inside) else m)
    assert tensors["memory.reach"].tolist() == expected and min(expected) < m
    resume(tmp_path / "resumed", overrides=("train.steps=30",), progress=False)
    assert train_losses(tmp_path / "resumed") == train_losses(tmp_path / "reference")


def test_cli_eval_follows_the_run_and_documents_flag_overrides(tmp_path, capsys):
    folder = write_documents_corpus(tmp_path / "docs")
    run = tmp_path / "run"
    train(_docs_config(folder, "train.steps=8", "data.documents=reset"), run, progress=False)
    records = {}
    for flag in ([], ["--documents", "continue"], ["--documents", "reset"]):
        assert main(["eval", str(run), "--quiet", "--json", "--max-tokens", "3000", *flag]) == 0
        records[tuple(flag)] = json.loads(capsys.readouterr().out)
    assert (
        records[()]["documents"] == "reset"
        and records[("--documents", "continue")]["documents"] == "continue"
    )
    assert records[()]["loss"] == records[("--documents", "reset")]["loss"]
    assert records[()]["loss"] != records[("--documents", "continue")]["loss"]

    single = tmp_path / "one.txt"
    single.write_text((STDLIB / "textwrap.py").read_text() * 3)
    plain = tmp_path / "plain"
    train(run_config(single, "train.steps=2", "train.eval_every=0"), plain, progress=False)
    assert main(["eval", str(plain), "--quiet", "--max-tokens", "500", "--documents", "reset"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("txl: error: --documents: 'reset' needs a corpus with document boundaries")
    assert err.count("\n") == 1
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "default: the run's data.documents" in " ".join(capsys.readouterr().out.split())


def test_analyze_documents_equals_txl_eval_each_way(tmp_path, capsys):
    folder = write_documents_corpus(tmp_path / "docs")
    runs = []
    for mode in ("continue", "reset"):
        runs.append(tmp_path / mode)
        train(_docs_config(folder, "train.steps=8", f"data.documents={mode}"), runs[-1], progress=False)
    out = tmp_path / "analysis"
    code = main(
        ["analyze", "documents", *map(str, runs), "--out", str(out), "--max-tokens", "4000", "--quiet"]
    )
    assert code == 0
    table = capsys.readouterr().out
    assert "eval continue" in table and "positions" in table and (out / "documents.png").is_file()
    result = json.loads((out / "results.json").read_text())
    assert [r["trained"] for r in result["runs"]] == ["continue", "reset"]
    for run, record in zip(runs, result["runs"], strict=True):
        for split in record["splits"]:
            assert sum(b["tokens"] for b in split["buckets"]) == split["tokens"] == 4000
            assert split["buckets"][0]["start"] == 0 and split["buckets"][1]["start"] == 10
            for mode in ("continue", "reset"):
                main(["eval", str(run), "--split", split["split"], "--max-tokens", "4000", "--quiet", "--json",
                      "--documents", mode])  # fmt: skip
                expected = json.loads(capsys.readouterr().out)["loss"]
                assert abs(split[f"{mode}_loss"] - expected) < 1e-9 * expected
            mean = sum(b["tokens"] * b["reset_loss"] for b in split["buckets"]) / split["tokens"]
            assert abs(mean - split["reset_loss"]) < 1e-9
    single = tmp_path / "one.txt"
    single.write_text((STDLIB / "textwrap.py").read_text() * 3)
    train(run_config(single, "train.steps=2", "train.eval_every=0"), tmp_path / "plain", progress=False)
    assert (
        main(["analyze", "documents", str(tmp_path / "plain"), "--out", str(tmp_path / "a2"), "--quiet"]) != 0
    )
    assert "needs a corpus with document boundaries" in capsys.readouterr().err


def test_reset_with_accumulation_gives_each_chunk_its_rows_starts(tmp_path):
    folder = write_documents_corpus(tmp_path / "docs")
    common = ("data.documents=reset", "model.mem_len=48", "train.steps=12", "train.clip=null")
    train(_docs_config(folder, *common), tmp_path / "one", progress=False)
    train(_docs_config(folder, *common, "train.accum_steps=2"), tmp_path / "two", progress=False)
    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert max(abs(one[k] - two[k]) / one[k] for k in one) < 1e-5  # float32 sums in another order


def test_cli_eval_reset_gives_one_figure_at_batch_size_1_and_4(tmp_path, capsys):
    """``txl eval --documents reset``: the batch size changes the streams, not the figure."""
    folder = write_documents_corpus(tmp_path / "docs")
    run = tmp_path / "run"
    train(_docs_config(folder, "train.steps=60", "data.documents=reset"), run, progress=False)
    losses = []
    for rows in (1, 4):
        flags = ["--documents", "reset", "--batch-size", str(rows), "--max-tokens", "3000"]
        assert main(["eval", str(run), "--quiet", "--json", *flags]) == 0
        losses.append(json.loads(capsys.readouterr().out)["loss"])
    assert abs(losses[0] - losses[1]) < 1e-6 * losses[0], losses
