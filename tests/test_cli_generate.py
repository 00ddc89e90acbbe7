"""``txl generate`` end to end on a run trained here (a character vocabulary on a small text): streaming,
stop strings, prompt files, several samples, greedy decoding, the throughput line, unknown characters; and
the incremental text decoding behind ``--stream`` (split UTF-8 characters, stop strings across tokens)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from txl.cli import main
from txl.data.vocab import ByteVocab
from txl.inference import SamplingParams
from txl.inference.text import TextStream, generate_text
from txl.runs import load_run

STDLIB = Path(sysconfig.get_paths()["stdlib"])
RATE = re.compile(r"^txl: (\d+) tokens in [\d.]+ s \([\d.]+ tokens/s\)$")


@pytest.fixture(scope="module")
def char_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("gen")
    corpus = folder / "corpus.txt"
    corpus.write_text((STDLIB / "textwrap.py").read_text(encoding="utf-8") * 2, encoding="utf-8")
    run_dir = folder / "run"
    code = main(
        [
            "train",
            "--config",
            "tiny",
            "--out",
            str(run_dir),
            "--quiet",
            "--set",
            'data.vocab="char"',
            "--set",
            f"data.corpus={json.dumps(str(corpus))}",
            "--set",
            "train.steps=12",
        ]
    )
    assert code == 0
    return run_dir


class _Stdout(io.StringIO):
    """Records what was written between flushes."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []
        self._mark = 0

    def flush(self) -> None:
        text = self.getvalue()
        self.flushed.append(text[self._mark :])
        self._mark = len(text)


def _generate(capsys, monkeypatch, run: Path, *flags: str) -> tuple[str, list[str], str]:
    """Run ``txl generate``; return stdout, the pieces written between flushes, and stderr."""
    out = _Stdout()
    monkeypatch.setattr(sys, "stdout", out)
    code = main(["generate", str(run), *flags])
    err = capsys.readouterr().err
    assert code == 0, err
    monkeypatch.undo()
    return out.getvalue(), [p for p in out.flushed if p], err


def _reference(run: Path, prompt: str, n: int, *, samples: int = 1, seed: int = 0, **sampling) -> list[str]:
    """The library, without the CLI: sample i of the prompt alone, drawn from a generator seeded with
    seed + i (what each row of ``txl generate``'s batch draws)."""
    loaded = load_run(run)
    return [
        generate_text(
            loaded.model,
            loaded.vocab,
            prompt,
            SamplingParams(max_new_tokens=n, seed=seed + i, **sampling),
        )
        for i in range(samples)
    ]


def test_greedy_output_and_stream_print_the_same_text(char_run, capsys, monkeypatch):
    plain, _, err = _generate(
        capsys, monkeypatch, char_run, "--prompt", "def wrap(", "--greedy", "--max-new-tokens", "40"
    )
    [text] = _reference(char_run, "def wrap(", 40, temperature=0)
    assert plain == "def wrap(" + text + "\n"
    match = RATE.match(err.strip().splitlines()[-1])
    assert match and int(match.group(1)) == 40

    streamed, pieces, _ = _generate(
        capsys,
        monkeypatch,
        char_run,
        "--prompt",
        "def wrap(",
        "--greedy",
        "--max-new-tokens",
        "40",
        "--stream",
    )
    assert streamed == plain
    assert len(pieces) >= 40 and "".join(pieces) == streamed.rstrip("\n")  # flushed token by token
    # greedy ignores the seed; sampling does not
    other_seed, _, _ = _generate(
        capsys,
        monkeypatch,
        char_run,
        "--prompt",
        "def wrap(",
        "--greedy",
        "--max-new-tokens",
        "40",
        "--seed",
        "5",
    )
    assert other_seed == plain
    sampled = {
        _generate(
            capsys,
            monkeypatch,
            char_run,
            "--prompt",
            "def wrap(",
            "--temperature",
            "1.5",
            "--max-new-tokens",
            "40",
            "--seed",
            str(s),
        )[0]
        for s in range(3)
    }
    assert len(sampled) > 1


def test_stop_text_ends_the_sample_and_cuts_the_output(char_run, capsys, monkeypatch):
    [text] = _reference(char_run, "class ", 60, temperature=0)
    stop = text[20:23]
    cut = text[: text.index(stop)]
    for stream_flag in ([], ["--stream"]):
        out, pieces, err = _generate(
            capsys,
            monkeypatch,
            char_run,
            "--prompt",
            "class ",
            "--greedy",
            "--max-new-tokens",
            "60",
            "--stop",
            stop,
            "--stop",
            "\u2603never",
            *stream_flag,
        )
        assert out == "class " + cut + "\n"
        tokens = int(RATE.match(err.strip().splitlines()[-1]).group(1))
        assert tokens == len(cut) + len(stop)  # generation stopped with the stop text, nothing after it
        if stream_flag:
            assert stop not in "".join(pieces)  # never printed, not even in part and taken back


def test_prompt_file_equals_the_same_prompt_inline(char_run, capsys, monkeypatch, tmp_path):
    prompt = "    def fill(self, text):\n        "
    path = tmp_path / "prompt.txt"
    path.write_text(prompt, encoding="utf-8")
    from_file, _, _ = _generate(
        capsys, monkeypatch, char_run, "--prompt-file", str(path), "--greedy", "--max-new-tokens", "25"
    )
    inline, _, _ = _generate(
        capsys, monkeypatch, char_run, "--prompt", prompt, "--greedy", "--max-new-tokens", "25"
    )
    assert from_file == inline and from_file.startswith(prompt)
    assert from_file == prompt + _reference(char_run, prompt, 25, temperature=0)[0] + "\n"


def test_several_samples_each_from_its_own_seed(char_run, capsys, monkeypatch):
    flags = [
        "--prompt",
        "import ",
        "--max-new-tokens",
        "30",
        "--num-samples",
        "3",
        "--seed",
        "7",
        "--top-k",
        "20",
    ]
    out, _, err = _generate(capsys, monkeypatch, char_run, *flags)
    texts = _reference(char_run, "import ", 30, samples=3, seed=7, temperature=1.0, top_k=20)
    assert out == "".join(f"=== sample {i + 1}/3 ===\nimport {t}\n" for i, t in enumerate(texts))
    assert len(set(texts)) == 3
    assert int(RATE.match(err.strip().splitlines()[-1]).group(1)) == 90
    streamed, _, _ = _generate(capsys, monkeypatch, char_run, *flags, "--stream")
    assert streamed == out


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (["--prompt", "snow \u2603 and \u00e6"], ["\u2603", "\u00e6"]),
        (["--prompt-file", "p.jsonl"], ["--prompt-file", "line 2", "not JSON"]),
        (["--prompt-file", "q.jsonl"], ["--prompt-file", "line 1", '"prompt" string']),
        (["--prompt-file", "missing.txt"], ["missing.txt"]),
        (["--greedy", "--temperature", "0.7"], ["greedy", "0.7"]),
        (["--num-samples", "0"], ["--num-samples"]),
        (["--max-new-tokens", "100001"], ["max_new_tokens=100001", "limit of 100000"]),
    ],
)
def test_bad_generate_flags_give_one_line(char_run, capsys, tmp_path, flags, fragments):
    (tmp_path / "p.txt").write_text("x", encoding="utf-8")
    (tmp_path / "p.jsonl").write_text('"x"\n{oops\n', encoding="utf-8")
    (tmp_path / "q.jsonl").write_text('{"text": "x"}\n', encoding="utf-8")
    flags = [str(tmp_path / f) if f.endswith((".txt", ".jsonl")) else f for f in flags]
    code = main(["generate", str(char_run), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("txl: error: ")
    assert all(f in err[0] for f in fragments), err[0]


@pytest.mark.slow
def test_unknown_characters_from_the_command_line_without_traceback(char_run):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    result = subprocess.run(
        [sys.executable, "-m", "txl", "generate", str(char_run), "--prompt", "caf\u00e9 \u2603", "--stream"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "\u2603" in result.stderr


# -- incremental text ---------------------------------------------------------------------------------------


def test_text_stream_holds_back_split_characters_and_stop_prefixes():
    vocab = ByteVocab()
    prompt = list(b"caf")
    new = list("\u00e9 na\u00efve \u2603 END rest".encode())
    pieces = TextStream(vocab, prompt)
    out = [pieces.push(b, final=i == len(new) - 1) for i, b in enumerate(new)]
    assert "\ufffd" not in "".join(out) and "".join(out) == "\u00e9 na\u00efve \u2603 END rest"
    assert out[0] == "" and out[1] == "\u00e9"  # the first byte of é is held until the second arrives
    assert pieces.text == "".join(out) and not pieces.stopped

    pieces = TextStream(vocab, prompt, stop=["END", "\u2603 X"])
    out = []
    for b in new:
        out.append(pieces.push(b))
        if pieces.stopped:
            break
    assert pieces.stopped and pieces.text == "\u00e9 na\u00efve \u2603 "
    assert "".join(out) == pieces.text  # "☃ " was held back (it could begin "☃ X"), then released
    with pytest.raises(ValueError, match="stop"):
        TextStream(vocab, prompt, stop="END")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_generate_prints_what_it_had_made(char_run, capsys, monkeypatch, signum):
    """The signal arrives after the second sample's 25th piece (sent by the process to itself, so the moment
    does not depend on the machine's speed): the first sample and what exists of the second are printed,
    then the note, and the exit status says which signal it was."""
    import txl.inference.text as generate  # generate_from_run lives in txl.inference.text

    real = generate.generate_from_run

    def signalled(*args, on_text, **kwargs):
        count = []

        def piece(index, text):
            on_text(index, text)
            count.append(index)
            if count.count(1) == 25:
                os.kill(os.getpid(), signum)

        return real(*args, on_text=piece, **kwargs)

    monkeypatch.setattr(generate, "generate_from_run", signalled)
    flags = ["--prompt", "import ", "--num-samples", "3", "--max-new-tokens", "30", "--seed", "3"]
    out = _Stdout()
    monkeypatch.setattr(sys, "stdout", out)
    code = main(["generate", str(char_run), *flags])
    monkeypatch.undo()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 128 + signum and err == ["txl: interrupted"], err
    # the rows run in lockstep, a piece per token (a char vocab): rows 1 and 2 had 25, row 3 24
    first, second, third = _reference(char_run, "import ", 30, samples=3, seed=3)
    assert out.getvalue() == (
        f"=== sample 1/3 ===\nimport {first[:25]}\n=== sample 2/3 ===\nimport {second[:25]}\n"
        f"=== sample 3/3 ===\nimport {third[:24]}\n"
    )


def test_several_prompts_run_as_one_batch_each_labelled(char_run, capsys, monkeypatch, tmp_path):
    """Two --prompt flags and a .jsonl file of two more (one with a newline): four prompts of different
    lengths, two samples each, as one batch; each sample is labelled, none is dropped, and each equals its
    prompt generated alone (sample s seeded with seed + s, whatever the prompts before it)."""
    path = tmp_path / "prompts.jsonl"
    path.write_text('"class "\n\n{"prompt": "    def fill(self, text):\\n        "}\n', encoding="utf-8")
    prompts = ["import ", "def wrap(", "class ", "    def fill(self, text):\n        "]
    flags = ["--prompt", prompts[0], "--prompt-file", str(path), "--prompt", prompts[1]]
    flags += ["--num-samples", "2", "--max-new-tokens", "12", "--seed", "4", "--top-k", "20"]
    out, _, err = _generate(capsys, monkeypatch, char_run, *flags)
    order = [prompts[0], prompts[2], prompts[3], prompts[1]]  # in the order given
    expected = ""
    for p, prompt in enumerate(order):
        texts = _reference(char_run, prompt, 12, samples=2, seed=4, top_k=20)
        for s, text in enumerate(texts):
            expected += f"=== prompt {p + 1}/4, sample {s + 1}/2 ===\n{prompt}{text}\n"
    assert out == expected
    assert int(RATE.match(err.strip().splitlines()[-1]).group(1)) == 8 * 12
    streamed, pieces, _ = _generate(capsys, monkeypatch, char_run, *flags, "--stream")
    assert streamed == out and len(pieces) > 12  # the first sample flushed as it was produced
    one, _, _ = _generate(capsys, monkeypatch, char_run, "--prompt", "import ", "--max-new-tokens", "12")
    assert one == "import " + _reference(char_run, "import ", 12)[0] + "\n"  # one prompt: no label


def test_a_prompts_samples_do_not_depend_on_the_prompts_before_it(trained_run, capsys, monkeypatch):
    """``--prompt JULIET: --seed 0`` alone prints the same sample as the JULIET prompt of ``--prompt ROMEO:
    --prompt JULIET: --seed 0`` (as a completion of the server does: choice j of a prompt, seed + j); a
    byte-level run."""
    flags = ["--max-new-tokens", "24", "--temperature", "1.0", "--seed", "0"]
    alone, _, _ = _generate(capsys, monkeypatch, trained_run, "--prompt", "JULIET:", *flags)
    both, _, _ = _generate(
        capsys, monkeypatch, trained_run, "--prompt", "ROMEO:", "--prompt", "JULIET:", *flags
    )
    first, second = both.split("=== prompt 2/2 ===\n")
    assert first.startswith("=== prompt 1/2 ===\nROMEO:")
    assert second == alone
    romeo, _, _ = _generate(capsys, monkeypatch, trained_run, "--prompt", "ROMEO:", *flags)
    assert first == "=== prompt 1/2 ===\n" + romeo


def test_an_empty_prompt_without_an_end_of_text_token_says_what_to_give(trained_run, capsys):
    """``--prompt ""`` on a byte-level run (no end-of-text token to start from): one line in the user's terms,
    naming the flag and what to give instead, not the vocabulary's attribute names."""
    assert main(["generate", str(trained_run), "--prompt", "", "--max-new-tokens", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "eos_id" not in err, err
    assert err.startswith("txl: error: generate: the prompt is empty") and "end-of-text token" in err, err
    assert "give a prompt of at least one character (a newline starts a new text)" in err, err


def test_compiled_prints_the_eager_text_through_the_compiled_step(
    char_run, capsys, monkeypatch, compiled_steps_dir
):
    """``--compiled``: two prompts, greedy and sampled, decoded by the step compiled ahead of time, print what
    the library's eager decoding gives."""
    from txl.model.compiled import CompiledStep

    calls = []
    called = CompiledStep.__call__

    def counted(self, *args):
        calls.append(1)
        return called(self, *args)

    monkeypatch.setattr(CompiledStep, "__call__", counted)
    for flags, sampling in (
        (["--greedy"], {"temperature": 0}),
        (["--top-k", "5", "--seed", "3"], {"top_k": 5}),
    ):
        out, _, _ = _generate(
            capsys,
            monkeypatch,
            char_run,
            "--prompt",
            "def wrap(",
            "--prompt",
            "import ",
            "--max-new-tokens",
            "40",
            "--compiled",
            *flags,
        )
        monkeypatch.setattr(CompiledStep, "__call__", counted)  # _generate undoes the patches
        seed = 3 if "--seed" in flags else 0
        want = [
            prompt + _reference(char_run, prompt, 40, seed=seed, **sampling)[0]
            for prompt in ("def wrap(", "import ")
        ]
        for text in want:
            assert text in out
    assert len(calls) >= 2 * 39
