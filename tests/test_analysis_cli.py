"""``txl compare`` and ``txl analyze ...`` end to end on tiny models and real text: the names of
results.json that other checks rely on, the figures, samples.md, resuming and reusing the two runs, and
the one-line error (with the JSON still written) when matplotlib is missing."""

from __future__ import annotations

import builtins
import importlib.util
import io
import json
import re
import shutil
import sysconfig
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from txl.cli import main
from txl.config import apply_overrides, load_config, vanilla_baseline
from txl.data import encode_split, load_corpus, load_vocab
from txl.evaluate import EvalSettings, evaluate
from txl.runs import latest_checkpoint, load_run
from txl.train.trainer import train

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# Without matplotlib (`pip install -e ".[dev]"` alone) the commands run with --no-plots and the tests that
# look at the figures skip, naming the extra.
PLOTS = importlib.util.find_spec("matplotlib") is not None
NO_PLOTS = [] if PLOTS else ["--no-plots"]
needs_plots = pytest.mark.skipif(
    not PLOTS, reason="the figures need matplotlib: pip install -e '.[plots]' (or '.[test]')"
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text((STDLIB / "textwrap.py").read_text(encoding="utf-8") * 3, encoding="utf-8")
    return path


def _overrides(corpus: Path) -> list[str]:
    sets = [
        f"data.corpus={json.dumps(str(corpus))}",
        "train.steps=12",
        "train.eval_every=6",
        "train.checkpoint_every=4",
        "train.log_every=2",
    ]
    return [arg for s in sets for arg in ("--set", s)]


@pytest.fixture(scope="module")
def compared(tmp_path_factory, corpus) -> Path:
    out = tmp_path_factory.mktemp("compare")
    assert (
        main(
            [
                "compare",
                "--config",
                "tiny",
                *_overrides(corpus),
                "--out",
                str(out),
                "--quiet",
                "--sample-tokens",
                "20",
                *NO_PLOTS,
            ]
        )
        == 0
    )
    return out


def _results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


@needs_plots
def test_compare_reports_the_three_rows_side_by_side(compared):
    results = _results(compared)
    for name in ("xl", "vanilla", "vanilla_sliding"):
        for key in (
            "val_loss",
            "val_ppl",
            "test_loss",
            "test_ppl",
            "val_bpb",
            "test_bpb",
            "val_bits_per_token",
        ):
            assert isinstance(results[name][key], float), (name, key)
    xl, vanilla, sliding = results["xl"], results["vanilla"], results["vanilla_sliding"]
    assert vanilla["val_tokens"] == sliding["val_tokens"] == xl["val_tokens"]  # every token once
    assert results["relative"]["vanilla"]["val_loss"] == pytest.approx(
        (xl["val_loss"] - vanilla["val_loss"]) / vanilla["val_loss"]
    )
    assert results["throughput"]["ratio_xl_over_vanilla"] == pytest.approx(
        xl["train_tokens_per_s"] / vanilla["train_tokens_per_s"]
    )
    assert (sliding["window"], sliding["stride"]) == (16, 4)  # the default: a quarter of the window
    assert xl["eval"]["tgt_len"] == 64 and vanilla["eval"] == {
        "tgt_len": 16,
        "mem_len": 0,
        "clamp_len": None,
        "same_length": False,
    }
    for figure in ("valid_curves.png", "train_curves.png"):
        assert (compared / figure).stat().st_size > 1000
    samples = (compared / "samples.md").read_text()
    assert samples.count("## Prompt") == 3 and samples.count("| Transformer-XL | vanilla |") == 3


def test_compare_on_your_own_corpus_is_titled_with_it_and_names_only_the_filters_set(compared, corpus):
    """A preset on another corpus (``--set data.corpus=...``) is titled with both; samples.md names the
    sampling settings in use (tiny samples at temperature 1 with no top-k or top-p filter), never ``None``."""
    results = _results(compared)
    assert results["config"] == "tiny" and results["corpus"] == str(corpus)
    samples = (compared / "samples.md").read_text()
    assert samples.startswith(f"# Samples: tiny on {corpus.name}\n")
    assert "None" not in samples
    assert "(temperature 1.0, no top-k or top-p filter)" in samples


def test_compare_evaluates_the_vanilla_model_on_its_training_segments(compared):
    run = load_run(compared / "vanilla", checkpoint="latest")
    corpus = load_corpus(run.config.data.corpus)
    tokens = encode_split(corpus, "valid", run.vocab)
    as_trained = evaluate(run.model, tokens, EvalSettings(batch_size=run.config.eval.batch_size, tgt_len=16))
    assert _results(compared)["vanilla"]["val_loss"] == pytest.approx(as_trained.loss, rel=1e-6)


def test_compare_again_reuses_finished_runs_and_resumes_an_interrupted_one(
    compared, corpus, tmp_path, capsys
):
    out = tmp_path / "again"
    config = vanilla_baseline(apply_overrides(load_config("tiny"), _overrides(corpus)[1::2]))

    def stop(record):
        if record["step"] == 10 and record["split"] == "train":
            raise KeyboardInterrupt  # as if killed after the checkpoint of step 8

    with pytest.raises(KeyboardInterrupt):
        train(config, out / "vanilla", progress=False, callbacks=(stop,))
    assert (
        latest_checkpoint(out / "vanilla").name == "step-00000008"
        and not (out / "vanilla" / "summary.json").exists()
    )
    argv = [
        "compare",
        "--config",
        "tiny",
        *_overrides(corpus),
        "--out",
        str(out),
        "--quiet",
        *NO_PLOTS,
        "--sample-tokens",
        "0",
    ]
    assert main(argv) == 0
    runs = _results(out)["runs"]
    assert runs == {"xl": "trained", "vanilla": "resumed"}
    assert json.loads((out / "vanilla" / "summary.json").read_text())["steps"] == 12
    assert main(argv) == 0
    assert _results(out)["runs"] == {"xl": "reused", "vanilla": "reused"}
    assert not (out / "samples.md").exists()
    capsys.readouterr()
    assert main([*argv[:-2], "--set", "train.steps=13", "--sample-tokens", "0"]) == 2
    assert "another config" in capsys.readouterr().err


@needs_plots
def test_analyze_memory(compared, tmp_path):
    out = tmp_path / "memory"
    assert (
        main(["analyze", "memory", str(compared / "xl"), "--out", str(out), "--quiet", "--max-tokens", "500"])
        == 0
    )
    rows = _results(out)["rows"]
    assert [r["mem_len"] for r in rows] == [0, 4, 8, 16, 32, 64, 128]  # 0 .. 8x the training memory of 16
    assert all({"mem_len", "loss", "ppl", "clamped_loss", "clamped_ppl"} <= set(r) for r in rows)
    assert (out / "memory.png").exists()


def _eval_json(*args: str) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["eval", *args, "--quiet", "--json"]) == 0
    return json.loads(out.getvalue())


def test_analyze_memory_starts_from_the_settings_of_txl_eval(corpus, tmp_path):
    """A run whose [eval] asks for same-length attention and a clamp: the sweep's row at each memory is
    what ``txl eval --mem-len M`` prints on the run, and its clamped column is ``txl eval --clamp-len 32``
    (the training attention length, memory 16 + segment 16)."""
    run = tmp_path / "run"
    sets = ["eval.same_length=true", "eval.clamp_len=48", "eval.tgt_len=16"]
    flags = [arg for s in sets for arg in ("--set", s)]
    assert main(["train", "--config", "tiny", *_overrides(corpus), *flags, "--out", str(run), "--quiet"]) == 0
    out = tmp_path / "memory"
    args = ["--max-tokens", "600", "--batch-size", "2"]
    assert (
        main(["analyze", "memory", str(run), "--lengths", "8,16,64", "--out", str(out), "--quiet", *args])
        == 0
    )
    results = _results(out)
    assert (results["same_length"], results["clamp_len"], results["train_attention_len"]) == (True, 48, 32)
    for row in results["rows"]:
        record = _eval_json(str(run), "--mem-len", str(row["mem_len"]), *args)
        assert record["same_length"] is True and record["clamp_len"] == 48
        assert row["loss"] == pytest.approx(record["loss"], abs=1e-9) and row["tokens"] == record["tokens"]
        clamped = _eval_json(str(run), "--mem-len", str(row["mem_len"]), "--clamp-len", "32", *args)
        assert row["clamped_loss"] == pytest.approx(clamped["loss"], abs=1e-9)
    assert results["rows"][2]["clamped_loss"] != pytest.approx(results["rows"][2]["loss"], abs=1e-7)


@needs_plots
def test_analyze_recl(compared, tmp_path):
    out = tmp_path / "recl"
    assert (
        main(
            [
                "analyze",
                "recl",
                str(compared / "xl"),
                str(compared / "vanilla"),
                "--lengths",
                "4,8,16",
                "--delta",
                "4",
                "--max-tokens",
                "300",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    results = _results(out)
    assert [m["run"] for m in results["models"]] == [str(compared / "xl"), str(compared / "vanilla")]
    assert results["lengths"] == [4, 8, 12, 16, 20] and results["tokens"] == 300
    assert results["r"] == [0.1, 0.5, 1.0] and results["threshold"] == 0.01
    for model in results["models"]:
        assert set(model["recl"]) == set(model["at_least"]) == set(model["gains"]) == {"0.1", "0.5", "1.0"}
        for r, recl in model["recl"].items():  # the steps from c = 4, recomputed from the printed gains
            gains = {int(c): g for c, g in model["gains"][r].items()}
            assert list(gains) == [4, 8, 12, 16]
            c = 4
            while c in gains and gains[c] >= 0.01:
                c += 4
            assert (recl, model["at_least"][r]) == (c, c == 20)
    assert (out / "recl.png").exists()


@needs_plots
def test_analyze_attention(compared, tmp_path):
    out = tmp_path / "attention"
    assert (
        main(
            [
                "analyze",
                "attention",
                str(compared / "xl"),
                "--max-tokens",
                "2000",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    results = _results(out)
    assert len(results["layers"]) == 2 and len(results["distances"]) == 64 + 16  # K = eval memory + segment
    assert all(0 <= layer["memory_share"] <= 1 for layer in results["layers"])
    assert (out / "attention.png").exists()


@needs_plots
def test_analyze_speed(tmp_path):
    out = tmp_path / "speed"
    assert (
        main(
            [
                "analyze",
                "speed",
                "--lengths",
                "8,16",
                "--segment",
                "4",
                "--tokens",
                "4",
                "--xl-tokens",
                "8",
                "--repeats",
                "1",
                "--n-layer",
                "1",
                "--d-model",
                "16",
                "--d-head",
                "8",
                "--n-head",
                "2",
                "--d-inner",
                "16",
                "--windows-per-batch",
                "3",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    rows = _results(out)["rows"]
    assert [r["length"] for r in rows] == [8, 16]
    assert all(
        set(r)
        >= {"length", "xl_ms_per_token", "vanilla_ms_per_token", "vanilla_batched_ms_per_token", "ratio"}
        for r in rows
    )
    results = _results(out)
    assert results["model"]["n_layer"] == 1 and results["model"]["d_model"] == 16 and results["params"] > 0
    assert [r["windows_per_batch"] for r in rows] == [3, 3]
    assert (out / "speed.png").exists()


@needs_plots
def test_analyze_recall(tmp_path):
    out = tmp_path / "recall"
    assert main(["analyze", "recall", "--segment", "4", "--steps", "6", "--out", str(out), "--quiet"]) == 0
    results = _results(out)
    assert (results["distance"], results["segment"], results["chance"]) == (8, 4, 1 / 64)
    assert 0 <= results["xl_accuracy"] <= 1 and 0 <= results["vanilla_accuracy"] <= 1
    assert (out / "recall.png").exists() and (out / "xl" / "summary.json").exists()


def test_the_recall_corpus_trains_from_the_command_line(tmp_path, capsys):
    assert (
        main(
            [
                "train",
                "--config",
                "tiny",
                "--set",
                "data.corpus=synthetic-recall",
                "--set",
                "data.vocab=char",
                "--set",
                "train.steps=2",
                "--out",
                str(tmp_path / "run"),
                "--quiet",
            ]
        )
        == 0
    )
    assert len(load_vocab(tmp_path / "run" / "vocab.json")) == 64 + 3  # <unk>, the symbols, | and newline
    capsys.readouterr()


def test_missing_matplotlib_is_one_line_and_the_json_is_still_written(
    compared, tmp_path, monkeypatch, capsys
):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    out = tmp_path / "noplots"
    assert (
        main(
            [
                "analyze",
                "memory",
                str(compared / "xl"),
                "--lengths",
                "0,16",
                "--max-tokens",
                "200",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'transformer-xl[plots]'" in err
    assert [r["mem_len"] for r in _results(out)["rows"]] == [0, 16] and not (out / "memory.png").exists()
    assert (
        main(
            [
                "analyze",
                "memory",
                str(compared / "xl"),
                "--lengths",
                "16",
                "--max-tokens",
                "200",
                "--out",
                str(out),
                "--quiet",
                "--no-plots",
            ]
        )
        == 0
    )


def test_analyses_refuse_the_vanilla_run_where_they_need_memory(compared, tmp_path, capsys):
    assert (
        main(["analyze", "memory", str(compared / "vanilla"), "--out", str(tmp_path / "m"), "--quiet"]) == 2
    )
    assert "vanilla baseline" in capsys.readouterr().err
    assert (
        main(
            [
                "compare",
                "--config",
                "tiny",
                "--set",
                'model.attention="absolute"',
                "--set",
                "model.mem_len=0",
                "--out",
                str(tmp_path / "c"),
                "--quiet",
            ]
        )
        == 2
    )
    assert "Transformer-XL" in capsys.readouterr().err


@pytest.mark.parametrize("r", ["0.1,5", "0"])
def test_recl_refuses_an_r_outside_the_fractions(tmp_path, capsys, r):
    """r is a fraction of the targets (the paper's 0.1, 0.5, 1.0), no longer a percentage: a one-line error
    naming the flag, before any run is loaded."""
    assert main(["analyze", "recl", str(tmp_path / "missing"), "--r", r, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("txl: error: --r:") and "\n" not in err


def test_compare_estimates_its_sliding_evaluation_with_a_default_one_can_wait_for(
    compared, corpus, tmp_path, capsys
):
    out = Path(shutil.copytree(compared, tmp_path / "again"))
    argv = ["compare", "--config", "tiny", *_overrides(corpus), "--out", str(out), "--quiet",
            *NO_PLOTS, "--sample-tokens", "0"]  # fmt: skip
    estimates = {}
    for stride in (None, 1):
        assert main(argv + ([] if stride is None else ["--stride", str(stride)])) == 0
        captured = capsys.readouterr()
        line = next(x for x in captured.err.splitlines() if x.startswith("vanilla sliding evaluation:"))
        estimates[stride] = int(re.search(r"([\d,]+) windows", line).group(1).replace(",", ""))
        assert "about" in line and "--stride" in line
        assert _results(out)["vanilla_sliding"]["stride"] == (4 if stride is None else 1)  # a quarter of 16
    tokens = _results(out)["vanilla_sliding"]["val_tokens"] + _results(out)["vanilla_sliding"]["test_tokens"]
    assert estimates[1] >= tokens - 2 * 16 and 3.5 * estimates[None] <= estimates[1] <= 4.5 * estimates[None]
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "default: a quarter of the training segment" in help_text and "at least 3/4" in help_text
