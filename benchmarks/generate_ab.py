"""Generation at memory 64, two decoding loops alternated in one process: another tree's
``inference/loop.py`` (loaded as ``txl.inference._old_loop``, its relative imports resolved against this
tree's ``txl.inference``) against this tree's ``txl.inference.loop``; same model, same prompt, greedy, one
thread. Prints one JSON line. For a change that touches only the loop module (its rows, model, cache and
decoder stay this tree's).

    PYTHONPATH=src python3 benchmarks/generate_ab.py OLD_TREE/src/txl/inference/loop.py 25
"""

import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import generate as bench  # noqa: E402  (benchmarks/generate.py: the sizes and the model)

import txl.inference.loop as new  # noqa: E402
from txl.inference import DecodeSettings, SamplingParams  # noqa: E402

spec = importlib.util.spec_from_file_location("txl.inference._old_loop", sys.argv[1])
old = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = old
spec.loader.exec_module(old)
torch.set_num_threads(1)
torch.manual_seed(0)
mem = 64
prompt = torch.randint(0, bench.SIZES["vocab"], (1, bench.SIZES["prompt"]))
model = bench.txl_model(mem)
memory = bench.full_memory(model, mem)
params = SamplingParams(max_new_tokens=200, temperature=0)
settings = DecodeSettings(span=bench.Span(mem_len=mem))


def run(mod, memory):
    start = time.perf_counter()
    out = mod.generate(model, prompt, params, settings=settings, memory=memory).new_tokens
    return time.perf_counter() - start, out


for mod in (old, new):  # warm up
    run(mod, memory)
    run(mod, None)
times = {"old_full": [], "new_full": [], "old_fresh": [], "new_fresh": []}
for r in range(int(sys.argv[2])):
    order = [("old", old), ("new", new)] if r % 2 == 0 else [("new", new), ("old", old)]
    for name, mod in order:
        for kind, m in (("full", memory), ("fresh", None)):
            t, out = run(mod, m)
            times[f"{name}_{kind}"].append(t)
    assert torch.equal(run(old, memory)[1], run(new, memory)[1])
med = {k: statistics.median(v) for k, v in times.items()}
print(
    json.dumps(
        {
            "repeats": int(sys.argv[2]),
            **{f"{k}_tokens_per_s": round(200 / v, 1) for k, v in med.items()},
            "new_over_old_full": round(med["old_full"] / med["new_full"], 3),
            "new_over_old_fresh": round(med["old_fresh"] / med["new_fresh"], 3),
            "paired_median_full": round(
                statistics.median(o / n for o, n in zip(times["old_full"], times["new_full"], strict=True)), 3
            ),
            "paired_median_fresh": round(
                statistics.median(o / n for o, n in zip(times["old_fresh"], times["new_fresh"], strict=True)),
                3,
            ),
        }
    )
)
