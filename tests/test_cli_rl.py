"""``txl rl train | eval | plot`` end to end on a tiny budget (a config from a preset, --set and the flags;
the run folder; the evaluation's JSON line; the figure; --resume), and the mistakes each refuses in one line
naming the flag or field."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("gymnasium", reason="txl rl needs gymnasium: pip install 'transformer-xl[rl]'")

from txl.cli import main  # noqa: E402

TINY = [
    "--set",
    "ppo.n_envs=4",
    "--set",
    "ppo.n_steps=16",
    "--set",
    "ppo.seq_len=8",
    "--set",
    "ppo.n_minibatches=2",
    "--set",
    "core.d_model=16",
    "--set",
    "core.d_head=8",
    "--set",
    "core.d_inner=16",
    "--set",
    "core.mem_len=4",
]


pytestmark = pytest.mark.usefixtures("one_thread")  # as txl rl train runs: see conftest


def test_train_eval_plot_and_resume_from_the_command_line(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib: pip install 'transformer-xl[plots]'")
    run = tmp_path / "run"
    args = ["rl", "train", "--task", "MemoryLength-2", "--agent", "gru", "--steps", "128", "--seed", "3"]
    assert main([*args, *TINY, "--set", "checkpoint_every=1", "--out", str(run), "--quiet", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["task"], summary["agent"], summary["seed"], summary["env_steps"]) == (
        "MemoryLength-2",
        "gru",
        3,
        128,
    )
    config = json.loads((run / "config.json").read_text())
    assert config["ppo"]["n_envs"] == 4 and config["core"]["mem_len"] == 4 and config["steps"] == 128

    assert main(["rl", "eval", str(run), "--episodes", "6", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["episodes"] == 6 and record["actions"] == "deterministic" and record["update"] == 2
    assert {"mean_return", "std_return", "ci95_low", "ci95_high"} <= record.keys()
    assert record["ci95_low"] <= record["mean_return"] <= record["ci95_high"]
    assert record["sampled"]["episodes"] == 6 and "mean_return" in record["sampled"]
    assert main(["rl", "eval", str(run), "--episodes", "3", "--sample"]) == 0
    out = capsys.readouterr().out
    assert "sampled: return" in out and "deterministic" not in out.splitlines()[1]

    assert main(["rl", "train", "--resume", str(run), "--steps", "256", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "256 steps in 4 updates" in out and len((run / "metrics.jsonl").read_text().splitlines()) == 4

    assert main(["rl", "plot", str(run), str(run), "--out", str(tmp_path / "curves.svg")]) == 0
    assert (tmp_path / "curves.svg").read_text().startswith("<?xml")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["rl", "train", "--task", "MemoryLength-2"], "txl rl train needs --out DIR (or --resume DIR)"),
        (["rl", "train", "--resume", "RUN", "--task", "X"], "do not pass --task"),
        (["rl", "train", "--set", "ppo.lrr=1", "--out", "OUT"], "ppo.lrr: unknown field"),
        (
            ["rl", "train", "--agent", "rnn", "--out", "OUT"],
            "agent: must be one of 'xl', 'gru', 'lstm', 'mlp'",
        ),
        (["rl", "train", "--config", "NoSuchTask", "--out", "OUT"], "unknown preset 'NoSuchTask'"),
        (["rl", "train", "--task", "NoSuchTask", "--out", "OUT"], "task 'NoSuchTask': unknown task"),
        (["rl", "train", "--steps", "0", "--out", "OUT"], "--steps must be a positive integer, got 0"),
        (["rl", "eval", "NOWHERE"], "run folder not found: NOWHERE"),
        (["rl", "eval", "RUN", "--deterministic", "--sample"], "not allowed with argument"),
    ],
)
def test_mistakes_are_one_line_errors(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("txl: error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "OUT").exists()
