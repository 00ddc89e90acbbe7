"""txl as a model of lm-evaluation-harness: rolling log-likelihoods read with memory against one long pass and
against ``txl.evaluate``, the windows read alone without memory, log-likelihoods of a continuation, generation
with stop strings, local tasks through ``simple_evaluate`` and ``txl harness``, and the error without the extra.
Everything offline, on tiny runs trained here; the model is made float64 where sums are compared to 1e-6."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from conftest import STDLIB, run_config
from txl import Span
from txl.cli import main

lm_eval = pytest.importorskip(
    "lm_eval", reason="lm-evaluation-harness is not installed: pip install 'transformer-xl[harness]'"
)

from lm_eval.api.instance import Instance  # noqa: E402

from txl.data.vocab import start_token  # noqa: E402
from txl.evaluate import EvalSettings, evaluate  # noqa: E402
from txl.harness import TxlLM  # noqa: E402

DOCS = [
    "def main():\n    return 0\n",
    "import sys\n\n" + "x = [i * i for i in range(10)]\n" * 3,
    "class A:\n    pass\n" * 4,
    "# a comment\n",
    "",  # an empty document has log-likelihood 0
]


def _lm(run: Path, **kwargs) -> TxlLM:
    lm = TxlLM(run=str(run), **kwargs)
    lm.model.double()  # sums compared to 1e-6 in float64: the protocol, not the rounding, is under test
    return lm


def _rolling(lm: TxlLM, docs: list[str]) -> list[float]:
    return lm.loglikelihood_rolling(
        [Instance("loglikelihood_rolling", {}, (d,), i) for i, d in enumerate(docs)]
    )


def _long_pass(model, ids: list[int]) -> torch.Tensor:
    """Per-token losses (L - 1,) of ids[1:] given all before them: one forward over the whole row, with a
    memory span longer than the row (so nothing is cut)."""
    tokens = torch.tensor(ids, dtype=torch.long)[None]  # (1, L)
    with torch.no_grad():
        out = model(tokens[:, :-1], targets=tokens[:, 1:], span=Span(mem_len=len(ids) + 1))
    return out.loss[0].double()  # (L - 1,)


def test_rolling_with_enough_memory_equals_one_long_pass(trained_run):
    # segments of 8, memory 512 >= every document: the memory carries everything, as one long pass does
    lm = _lm(trained_run, tgt_len=8, mem_len=512, batch_size=2)
    got = _rolling(lm, DOCS)
    for doc, value in zip(DOCS, got, strict=True):
        ids = [lm.start, *lm.vocab.encode(doc).tolist()]
        expected = -float(_long_pass(lm.model, ids).sum()) if len(ids) > 1 else 0.0
        assert value == pytest.approx(expected, abs=1e-6)
    assert got[-1] == 0.0


def test_rolling_with_short_memory_equals_txl_evaluate(trained_run):
    # memory 16 < documents of 60+ tokens: each segment sees only the last 16 positions, as txl eval reads
    lm = _lm(trained_run, tgt_len=8, mem_len=16, batch_size=3)
    docs = DOCS[:3]
    got = _rolling(lm, docs)
    for doc, value in zip(docs, got, strict=True):
        ids = torch.tensor([lm.start, *lm.vocab.encode(doc).tolist()])
        result = evaluate(lm.model, ids, EvalSettings(batch_size=1, tgt_len=8, span=Span(mem_len=16)))
        assert value == pytest.approx(-result.loss * result.tokens, abs=1e-6)
    # and the memory matters: without it the same documents score otherwise
    assert _rolling(_lm(trained_run, tgt_len=8, mem_len=0, batch_size=3), docs) != pytest.approx(
        got, abs=1e-3
    )


def test_rolling_without_memory_reads_each_window_alone(trained_run):
    # the harness's way for a fixed-context model: windows of T predicted tokens, each read alone; the first
    # window starts from the start token, the last (short) one has a full window of T tokens before it
    t = 8
    lm = _lm(trained_run, tgt_len=t, mem_len=0, batch_size=4)
    got = _rolling(lm, DOCS[:3])
    for doc, value in zip(DOCS[:3], got, strict=True):
        seq = [lm.start, *lm.vocab.encode(doc).tolist()]
        n = len(seq) - 1  # tokens predicted
        total = 0.0
        for first in range(1, n + 1, t):  # targets seq[first : first + t]
            last = min(first + t, n + 1)
            lo = max(0, last - 1 - t) if first > 1 else 0  # the window of inputs seq[lo : last - 1]
            window = torch.tensor(seq[lo:last], dtype=torch.long)[None]
            with torch.no_grad():
                losses = lm.model(window[:, :-1], targets=window[:, 1:], span=Span(mem_len=0)).loss[0]
            total -= float(losses[-(last - first) :].double().sum())
        assert value == pytest.approx(total, abs=1e-6)


def test_start_token_is_eos_or_newline(trained_run):
    from txl.data.vocab import CharVocab, WordVocab

    assert start_token(WordVocab(["a", "b"], eos_per_line=True)) == 1  # <eos>
    assert start_token(CharVocab(list("ab\n"))) == CharVocab(list("ab\n")).encode("\n")[0]
    assert _lm(trained_run).start == ord("\n")  # byte vocabulary


def test_loglikelihood_equals_scoring_context_and_continuation(trained_run):
    lm = _lm(trained_run, tgt_len=8, mem_len=64, batch_size=2)
    context = "import sys\n\ndef main(argv):\n    return "  # 41 tokens: read through the memory in segments
    requests = [(context, "0\n"), (context, "sys.exit(1)\n"), ("x", " = 1"), ("for i in ", "range(3):")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, r, i) for i, r in enumerate(requests)])
    for (ctx, cont), (value, greedy) in zip(requests, got, strict=True):
        ctx_ids, cont_ids = lm.vocab.encode(ctx).tolist(), lm.vocab.encode(cont).tolist()
        if ctx.endswith(" "):  # the harness moves the context's trailing space to the continuation
            ctx_ids, cont_ids = ctx_ids[:-1], [ctx_ids[-1], *cont_ids]
        losses = _long_pass(lm.model, ctx_ids + cont_ids)
        assert value == pytest.approx(-float(losses[-len(cont_ids) :].sum()), abs=1e-6)
        assert isinstance(greedy, bool)
    # is_greedy: true exactly for the continuation the model ranks first at every step
    context = context.rstrip()
    ids = torch.tensor(lm.vocab.encode(context).tolist())[None]
    with torch.no_grad():
        best = int(lm.model(ids, span=Span(mem_len=64)).log_probs[0, -1].argmax())
    other = (best + 1) % 128
    with torch.no_grad():  # the best second token after the best first one
        ids2 = torch.cat([ids, torch.tensor([[best]])], dim=1)
        best2 = int(lm.model(ids2, span=Span(mem_len=64)).log_probs[0, -1].argmax())
    other2 = (best2 + 1) % 128
    continuations = [[best], [other], [best, best2], [best, other2], [other, best2]]
    flags = lm.loglikelihood(
        [Instance("loglikelihood", {}, (context, lm.vocab.decode(c)), i) for i, c in enumerate(continuations)]
    )
    assert [f for _, f in flags] == [True, False, True, False, False]


def test_generate_until_stops_at_until_and_max_gen_toks(trained_run):
    from txl.inference import GenerationSettings, generate

    lm = TxlLM(run=str(trained_run), batch_size=2)
    prompts = ["def f(x):\n", "import "]
    free = lm.generate_until(
        [
            Instance("generate_until", {}, (p, {"until": [], "max_gen_toks": 12}), i)
            for i, p in enumerate(prompts)
        ]
    )
    for prompt, text in zip(prompts, free, strict=True):  # greedy, as txl's own generation
        ids = torch.tensor(lm.vocab.encode(prompt).tolist())
        own = (
            generate(lm.model, ids, GenerationSettings(max_new_tokens=12, temperature=0))
            .new_tokens[0]
            .tolist()
        )
        assert text == lm.vocab.decode(own)
        assert len(text.encode()) <= 12
    cut = free[0][3:5]  # a string the greedy text holds
    assert cut and cut in free[0]
    stopped = lm.generate_until(
        [
            Instance("generate_until", {}, (prompts[0], {"until": [cut], "max_gen_toks": 12}), 0),
            Instance("generate_until", {}, (prompts[1], {"until": ["\x00never"], "max_gen_toks": 5}), 1),
        ]
    )
    assert stopped[0] == free[0][: free[0].index(cut)]
    assert stopped[1] == free[1][: len(lm.vocab.decode(lm.vocab.encode(free[1]).tolist()[:5]))]


def _json_task(folder: Path, docs: list[str]) -> Path:
    """A task over local files: rows of a JSON-lines file read by the ``json`` dataset builder."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    (folder / "local_docs.yaml").write_text(
        "task: local_docs\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        f"  data_files:\n    test: {json.dumps(str(data))}\n"
        f"  cache_dir: {json.dumps(str(folder / 'cache'))}\n"
        "output_type: loglikelihood_rolling\n"
        "test_split: test\n"
        'doc_to_text: ""\n'
        'doc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n",
        encoding="utf-8",
    )
    return folder


def test_txl_harness_command_on_a_local_task(trained_run, tmp_path, capsys):
    docs = DOCS[:3]
    tasks = _json_task(tmp_path / "tasks", docs)
    code = main(
        ["harness", str(trained_run), "--tasks", "local_docs", "--include-path", str(tasks), "--quiet"]
    )
    assert code == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    lm = TxlLM(run=str(trained_run))
    total = sum(_rolling(lm, docs))
    words = sum(len(d.split()) + 1 for d in docs)  # the harness counts re.split(r"\s+"): a final "" too
    size = sum(len(d.encode()) for d in docs)
    result = record["results"]["local_docs"]
    assert result["word_perplexity,none"] == pytest.approx(math.exp(-total / words), rel=1e-5)
    assert result["bits_per_byte,none"] == pytest.approx(-total / size / math.log(2), rel=1e-5)
    assert record["mem_len"] == lm.span.mem_len and record["tgt_len"] == lm.tgt_len


def _wikitext_folder(root: Path) -> Path:
    """A WikiText-shaped corpus of three splits, each of a few articles (Python's own source as text)."""
    lines = [ln for ln in (STDLIB / "textwrap.py").read_text().splitlines() if ln.strip()]
    folder = root / "wikitext-2"
    folder.mkdir(parents=True)
    for split, offset in (("train", 0), ("valid", 120), ("test", 180)):
        parts = [" \n"]
        for k in range(3 if split == "test" else 6):
            body = lines[offset + 20 * k : offset + 20 * k + 20]
            parts += [f" = Article {split} {k} = \n", " \n", *(f" {ln.strip()} \n" for ln in body), " \n"]
        (folder / f"wiki.{split}.tokens").write_text("".join(parts), encoding="utf-8")
    return root


def test_txl_wikitext_local_task_reads_the_articles(tmp_path, monkeypatch, capfd, caplog):
    from txl.harness_tasks.wikitext_local import split_articles
    from txl.train.trainer import train

    data = _wikitext_folder(tmp_path / "data")
    monkeypatch.setenv("TXL_DATA_DIR", str(data))
    monkeypatch.chdir(tmp_path)  # not a git repository
    config = run_config(data, 'data.corpus="wikitext-2"', 'data.vocab="word"', "train.steps=4")
    train(config, tmp_path / "run", progress=False)
    code = main(["harness", str(tmp_path / "run"), "--tasks", "txl_wikitext_local", "--quiet"])
    assert code == 0
    out, err = capfd.readouterr()
    record = json.loads(out.strip().splitlines()[-1])
    # nothing that is not the user's: no git subprocess, no note about txl's own task file; the words the
    # vocabulary does not know are counted in one warning
    assert "git" not in err and not any("Custom kwargs" in r.getMessage() for r in caplog.records)
    assert "words of the task's text" not in err or err.count("read as <unk>") == 1
    text = (data / "wikitext-2" / "wiki.test.tokens").read_text(encoding="utf-8")
    pages = split_articles(text)
    assert len(pages) == 3 and "".join(pages) == text and pages[1].startswith(" = Article test 1 = ")
    lm = TxlLM(run=str(tmp_path / "run"))
    from txl.inference.text import UnknownTokensWarning

    with pytest.warns(
        UnknownTokensWarning, match="read as <unk>"
    ):  # the test split's words unseen in training
        total = sum(_rolling(lm, pages))
    words = sum(len(p.split()) + 1 + (not p[0].strip()) for p in pages)  # re.split(r"\s+") pieces
    assert record["results"]["txl_wikitext_local"]["word_perplexity,none"] == pytest.approx(
        math.exp(-total / words), rel=1e-5
    )
    # --metadata (here through task_manager) picks another split: the 6 articles of wiki.valid.tokens
    from txl.harness import task_manager

    manager = task_manager(metadata={"split": "valid"}, include_defaults=False)  # txl's own tasks only
    loaded = manager.load(["txl_wikitext_local"])["tasks"]
    assert len(loaded["txl_wikitext_local"].dataset["test"]) == 6


def test_bad_model_args_and_flags_are_one_line_errors(trained_run, capsys):
    assert main(["harness", str(trained_run), "--tasks", "no_such_task_here"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txl: error: --tasks: unknown task no_such_task_here") and err.count("\n") == 1
    assert main(["harness", str(trained_run), "--tasks", "x", "--mem-len", "0", "--same-length"]) == 2
    assert "--same-length" in capsys.readouterr().err
    with pytest.raises(ValueError, match="model_args mem_len"):
        TxlLM(run=str(trained_run), mem_len="-3")
    with pytest.raises(ValueError, match="model_args batch_size"):
        TxlLM(run=str(trained_run), batch_size="auto")
    lm = TxlLM.create_from_arg_string(f"run={trained_run},mem_len=0,tgt_len=32", {"batch_size": 2})
    assert (lm.span.mem_len, lm.tgt_len, lm.batch_size) == (0, 32, 2)


def test_registered_as_txl_for_lm_eval(trained_run):
    from lm_eval.api.registry import get_model

    assert get_model("txl") is TxlLM


def test_without_lm_eval_a_one_line_error_names_the_extra(trained_run, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")]:
        monkeypatch.setitem(sys.modules, name, None)  # import lm_eval (and its modules) now fails
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    for name in [m for m in sys.modules if m == "txl.harness"]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=r"pip install 'transformer-xl\[harness\]'"):
        importlib.import_module("txl.harness")
    assert main(["harness", str(trained_run), "--tasks", "txl_wikitext_local"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "txl: error: txl harness needs lm-evaluation-harness: pip install 'transformer-xl[harness]'"
    )
    assert err.count("\n") == 1


@pytest.fixture(scope="module")
def vanilla_run(tmp_path_factory) -> Path:
    """A tiny vanilla baseline (absolute attention, no memory), trained a few steps."""
    from conftest import write_text_corpus
    from txl.train.trainer import train

    folder = tmp_path_factory.mktemp("vanilla")
    config = run_config(
        write_text_corpus(folder / "corpus.txt"),
        'model.attention="absolute"',
        "model.mem_len=0",
        "train.steps=4",
    )
    train(config, folder / "run", progress=False)
    return folder / "run"


@pytest.mark.parametrize("which", ["vanilla", "mem_len_0"])
def test_loglikelihood_without_memory_equals_one_forward_over_the_window(which, trained_run, vanilla_run):
    # a memoryless model sees the last tgt_len tokens before each continuation token: one plain forward over
    # the last tgt_len + 1 ids of context + continuation gives the continuation's log-likelihood
    t = 24
    run = vanilla_run if which == "vanilla" else trained_run
    lm = (
        _lm(run, tgt_len=t, batch_size=3)
        if which == "vanilla"
        else _lm(run, tgt_len=t, mem_len=0, batch_size=3)
    )
    requests = [
        ("import sys\n\ndef main(argv):\n    return", " 0\n"),  # a context longer than the window
        ("x =", " [i for i in range(3)]"),
        ("for i in range(10):\n    print(i)", "\ndone"),
        ("a", "b"),  # shorter than the window
    ]
    got = lm.loglikelihood([Instance("loglikelihood", {}, r, i) for i, r in enumerate(requests)])
    for (context, continuation), (value, _) in zip(requests, got, strict=True):
        ctx, cont = lm.vocab.encode(context).tolist(), lm.vocab.encode(continuation).tolist()
        window = torch.tensor(ctx + cont)[-(t + 1) :][None]  # (1, <= T + 1)
        with torch.no_grad():
            losses = lm.model(window[:, :-1], targets=window[:, 1:], span=Span(mem_len=0)).loss[0]
        assert value == pytest.approx(-float(losses[-len(cont) :].double().sum()), abs=1e-9)


def test_unknown_task_is_refused_before_the_run_loads(trained_run, monkeypatch, capsys):
    import txl.harness

    def refuse(*args, **kwargs):
        raise AssertionError("the run was loaded before the task names were checked")

    monkeypatch.setattr(txl.harness.TxlLM, "__init__", refuse)
    assert main(["harness", str(trained_run), "--tasks", "hellaswg,txl_wikitxt_local"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txl: error: --tasks: unknown task hellaswg, txl_wikitxt_local (close: ")
    assert "hellaswag" in err and "txl_wikitext_local" in err and err.count("\n") == 1
    assert main(["harness", str(trained_run), "--tasks", "x", "--include-path", "no/such/dir"]) == 2
    assert capsys.readouterr().err == "txl: error: --include-path: no/such/dir is not a folder\n"


def test_task_names_are_read_from_yaml_text(tmp_path):
    from txl.harness_tasks import check_task_names

    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "a.yaml").write_text('"task": "quoted_task"\ntag:\n  - tag_one\n- tag_two\n')
    (folder / "base").write_text("tag: [inline_a, 'inline_b']  # a comment\n")  # a template without suffix
    names = check_task_names(["quoted_task", "tag_one", "tag_two", "inline_a", "inline_b"], [folder])
    assert {"quoted_task", "tag_one", "inline_b", "txl_wikitext_local"} <= names.local
    assert not names.local_groups and "hellaswag" in names.builtin
    with pytest.raises(ValueError, match="unknown task quoted_tsk .close: quoted_task"):
        check_task_names(["quoted_tsk"], [folder])


@pytest.fixture(scope="module")
def char_run(tmp_path_factory) -> Path:
    """A tiny run on a char vocabulary (Python source: no accented letters), trained a few steps."""
    from conftest import write_text_corpus
    from txl.train.trainer import train

    folder = tmp_path_factory.mktemp("char")
    config = run_config(write_text_corpus(folder / "corpus.txt"), 'data.vocab="char"', "train.steps=2")
    train(config, folder / "run", progress=False)
    return folder / "run"


def test_characters_a_char_vocabulary_never_saw_are_refused(char_run, tmp_path, capsys):
    lm = TxlLM(run=str(char_run))
    with pytest.raises(ValueError, match=r"2 token\(s\) not in the char vocabulary: 'é', '→'.*cannot score"):
        _rolling(lm, ["def f():\n    return 0\n", "café → bar"])
    with pytest.raises(ValueError, match="'é'"):
        lm.loglikelihood([Instance("loglikelihood", {}, ("x = ", "é"), 0)])
    assert _rolling(lm, ["def f():\n    return 0\n"])[0] < 0  # known characters score as before
    tasks = _json_task(tmp_path / "tasks", ["print('ok')\n", "naïve\n"])
    assert main(["harness", str(char_run), "--tasks", "local_docs", "--include-path", str(tasks)]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after lm-eval's progress bars
    assert err.startswith("txl: error: the task's text has 1 token(s) not in the char vocabulary: 'ï'")


def test_words_a_word_vocabulary_never_saw_are_read_as_unk_with_a_count(tmp_path):
    from txl.inference.text import UnknownTokensWarning
    from txl.train.trainer import train

    corpus = tmp_path / "words.txt"
    corpus.write_text("the cat sat on the mat\n" * 200, encoding="utf-8")
    train(run_config(corpus, 'data.vocab="word"', "train.steps=2"), tmp_path / "run", progress=False)
    lm = _lm(tmp_path / "run", mem_len=64)
    docs = ["the dog sat\n", "the dog ran on the mat\n"]
    with pytest.warns(UnknownTokensWarning, match=r"^2 distinct word\(s\) .* read as <unk>.*'dog', 'ran'$"):
        got = _rolling(lm, docs)
    for doc, value in zip(docs, got, strict=True):  # scored as the data's own <unk>
        ids = [lm.start, *lm.vocab.encode(doc).tolist()]
        assert lm.vocab.unk_id in ids
        assert value == pytest.approx(-float(_long_pass(lm.model, ids).sum()), abs=1e-6)


@pytest.mark.parametrize("mem_len", [None, 0], ids=["memory", "no_memory"])
def test_generate_until_rows_join_and_leave_each_as_alone(trained_run, mem_len):
    # 6 requests through 2 rows: rows leave at their stop string or max_gen_toks and the next request joins;
    # each text is the greedy continuation of its prompt alone, cut before its first until string
    from txl.inference import GenerationSettings, generate

    lm = TxlLM(run=str(trained_run), batch_size=2, **({} if mem_len is None else {"mem_len": mem_len}))
    asks = [
        ("def f(x):\n", [], 9),
        ("import ", ["\x00never"], 3),
        ("class A:\n    pass\n" * 3, [], 14),  # longer than a segment and than the memory
        ("x", ["e"], 20),
        ("for i in range(3):\n", [" "], 11),
        ("#", [], 1),
    ]
    got = lm.generate_until(
        [
            Instance("generate_until", {}, (p, {"until": u, "max_gen_toks": n}), i)
            for i, (p, u, n) in enumerate(asks)
        ]
    )
    for (prompt, until, n), text in zip(asks, got, strict=True):
        ids = torch.tensor(lm.vocab.encode(prompt).tolist())
        settings = GenerationSettings(max_new_tokens=n, temperature=0, span=lm.span, context=lm.tgt_len)
        full = lm.vocab.decode(generate(lm.model, ids, settings).new_tokens[0].tolist())
        cuts = [full.index(s) for s in until if s in full]
        assert text == full[: min(cuts)] if cuts else text == full
    assert any(got[i] != "" for i in range(len(asks)))


@pytest.mark.parametrize("as_given", [str, Path, lambda p: [str(p)]])
def test_task_manager_takes_one_folder_or_several(tmp_path, as_given):
    """``task_manager("my_tasks")``: a folder given as a str or a Path is one folder (not its characters),
    like a list of folders."""
    from txl.harness import task_manager

    folder = _json_task(tmp_path / "tasks", DOCS[:2])
    manager = task_manager(as_given(folder), include_defaults=False)
    assert {"local_docs", "txl_wikitext_local"} <= set(manager.all_tasks)
