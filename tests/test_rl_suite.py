"""The RL comparison's script (benchmarks/rl_suite.py): the RL page's tables are what its result files draw,
every result file is a run of the plan with the command it says, and each agent's learning rate is picked as
the page says (its best final return; ties: the larger mean return over the run, then the smaller rate)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "rl_suite.py"


@pytest.fixture(scope="module", autouse=True)
def benchmarks_importable():
    """The scripts import their shared helpers as ``_common`` (their own folder on ``sys.path``)."""
    patch = pytest.MonkeyPatch()
    patch.syspath_prepend(str(REPO / "benchmarks"))
    yield
    patch.undo()


@pytest.fixture(scope="module")
def suite():
    spec = importlib.util.spec_from_file_location("rl_suite", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["rl_suite"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("rl_suite", None)


def _result(suite, task, agent, lr, seed, final, curve=(0.0,)):
    run = suite.Run(task, agent, lr, seed)
    return run.name, {
        "name": run.name, "task": task, "agent": agent, "lr": lr, "seed": seed, "final_return": final,
        "curve": [[i, r] for i, r in enumerate(curve)],
    }  # fmt: skip


def test_the_page_is_what_the_result_files_draw(suite):
    assert suite.main(["draw", "--check"]) == 0, "docs/rl.md differs: run python3 benchmarks/rl_suite.py draw"


def test_every_result_file_is_a_run_of_the_plan_with_its_command(suite):
    results = suite.read_results()
    planned = {r.name: r for r in suite.sweep_runs() + suite.table_runs(results)[0]}
    for name, result in results.items():
        assert name in planned, f"{name}: not a run of the plan"
        run = planned[name]
        assert result["command"] == run.command()
        assert (result["task"], result["agent"], result["lr"], result["seed"]) == (
            run.task,
            run.agent,
            run.lr,
            run.seed,
        )
        steps = suite._preset_steps(run.task)
        assert result["env_steps"] == steps and result["curve"][-1][0] == steps, (
            f"{name}: not the preset's budget"
        )


def test_the_plan_is_the_sweep_then_three_seeds_at_each_agents_pick(suite):
    sweep = suite.sweep_runs()
    assert len(sweep) == 4 * 4 * 3 and {r.seed for r in sweep} == {1}
    assert {r.lr for r in sweep} == {3e-4, 1e-3, 3e-3, 1e-2}
    assert suite.table_runs({})[0] == []  # nothing is decided before its sweep
    results = {}
    for task in suite.SWEEP_TASKS:
        for agent in suite.AGENTS:
            for lr in suite.LRS:
                final = (
                    {3e-4: 0.1, 1e-3: 0.5, 3e-3: 0.9, 1e-2: 0.2}[lr] if task != "CartPoleNoVelocity" else lr
                )
                name, result = _result(suite, task, agent, lr, 1, final)
                results[name] = result
    runs, waiting = suite.table_runs(results)
    assert waiting == []
    assert len(runs) == len(suite.TABLE_TASKS) * 4 * 3
    by_task = {(r.task, r.agent): r.lr for r in runs}
    assert by_task[("RepeatPreviousHard", "gru")] == 3e-3  # the POPGym tasks' best mean
    assert by_task[("PendulumNoVelocity", "xl")] == 1e-2  # CartPole's pick
    assert by_task[("CartPoleNoVelocity", "mlp")] == 1e-2


def test_the_pick_breaks_ties_by_the_whole_run_then_the_smaller_rate(suite):
    task = "RepeatPreviousEasy"
    results = dict(
        [
            _result(suite, task, "gru", 3e-4, 1, 0.5, curve=(0.0, 0.1)),
            _result(suite, task, "gru", 1e-3, 1, 1.0, curve=(0.0, 0.2)),
            _result(suite, task, "gru", 3e-3, 1, 1.0, curve=(0.0, 0.6)),
            _result(suite, task, "gru", 1e-2, 1, 1.0, curve=(0.0, 0.6)),
        ]
    )
    assert suite.best_lr(results, "gru", (task,)) == 3e-3
    results[suite.Run(task, "gru", 1e-2, 1).name]["final_return"] = None  # no episode ended: last
    assert suite.best_lr(results, "gru", (task,)) == 3e-3
    del results[suite.Run(task, "gru", 3e-4, 1).name]
    assert suite.best_lr(results, "gru", (task,)) is None  # one rate not run yet


def test_the_drawn_table_shows_the_mean_and_each_seed(suite):
    results = {}
    for task in suite.SWEEP_TASKS:
        for agent in suite.AGENTS:
            for lr in suite.LRS:
                name, result = _result(suite, task, agent, lr, 1, 0.5 if lr == 1e-3 else 0.0)
                results[name] = result
    for seed, final in ((2, 0.75), (3, 1.0)):
        name, result = _result(suite, "RepeatPreviousEasy", "xl", 1e-3, seed, final)
        results[name] = result
    table = suite.main_table(results)
    row = next(line for line in table.splitlines() if line.startswith("| RepeatPreviousEasy |"))
    assert row.split(" | ")[1] == "**0.750** (0.500 / 0.750 / 1.000; lr 0.001)"
    sweep = suite.sweep_table(results)
    assert "| RepeatPreviousEasy | xl | 0.000 | **0.500** | 0.000 | 0.000 |" in sweep


def test_the_cartpole_100k_tables_are_what_their_result_files_draw():
    """The RL page's two tables of CartPole at 100,000 steps (txl's runs and SB3's) are drawn from the result
    files by benchmarks/rl_cartpole_100k.py --draw; SB3's final return is computed from its episodes as
    txl's summary defines it (the last 20,480 steps)."""
    spec = importlib.util.spec_from_file_location(
        "rl_cartpole_100k", REPO / "benchmarks" / "rl_cartpole_100k.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--draw", "--check"]) == 0, (
        "docs/rl.md differs: run python3 benchmarks/rl_cartpole_100k.py --draw"
    )
    sb3 = {"benchmark": "rl_sb3", "env_steps": 100_000, "first_step_mean_ge_475": None, "train_cpu_s": 1.0}
    sb3["final_eval"] = {"return_mean": 9.0}
    sb3["episodes"] = [[79_000, 100.0, 100], [79_600, 200.0, 200], [99_000, 400.0, 400]]
    assert module.figures(sb3) == (300.0, 9.0, None, 1.0)  # 79,000 ends before the last 20,480 steps


def test_the_memory_length_tables_are_what_their_result_files_draw(tmp_path):
    """The memory-length tables of the RL and results pages (the grid of L against the agents, and the runs
    beside it) are drawn from the result files by benchmarks/rl_memory_length.py --draw --page."""
    spec = importlib.util.spec_from_file_location(
        "rl_memory_length", REPO / "benchmarks" / "rl_memory_length.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = REPO / "benchmarks" / "results" / "rl" / "memory_length"
    pages = [str(REPO / "docs" / "rl.md"), str(REPO / "docs" / "results.md")]
    argv = ["--draw", "--check", "--results", str(results), "--page", *pages]
    with pytest.raises(SystemExit) as done:
        module.main([*argv, "--out", str(tmp_path / "figure.png")])
    assert done.value.code == 0, (
        "a page differs: run benchmarks/rl_memory_length.py --draw --page docs/rl.md docs/results.md"
    )
    assert not (tmp_path / "figure.png").exists()  # a check draws nothing


def test_the_plotted_curves_carry_a_return_over_updates_without_an_episode(suite):
    """An update in which no episode ended shows the last return seen (a task whose episodes outlast an update
    still draws a line), then a trailing mean."""
    assert suite.smoothed([None, 1.0, None, 3.0, None], window=2) == [None, 1.0, 1.0, 2.0, 3.0]
    assert suite.smoothed([2.0, 4.0, 6.0], window=10) == [2.0, 3.0, 4.0]
