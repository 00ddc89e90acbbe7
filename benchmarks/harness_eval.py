"""lm-evaluation-harness on a trained run: its ``word_perplexity`` / ``bits_per_byte`` against ``txl eval`` on
the same text, and the time of the rolling evaluation with memory against the harness's own way of scoring a
fixed-context model (the same model with ``mem_len=0``: windows of the training length, each read alone).
Needs the ``harness`` extra; prints one JSON line per measurement, then one with the ratios.

    PYTHONPATH=src OMP_NUM_THREADS=1 TXL_DATA_DIR=../shared/data /tmp/venv-harness/bin/python \\
        benchmarks/harness_eval.py runs/shakespeare --split valid --docs 16

Two tasks are written (``dataset_path: json`` with ``data_files``, the way to point a task at local files)
from the run's corpus split:

- ``whole``: the split as one document, read by ``txl eval --batch-size 1`` too; the figures differ only by
  the split's first token, which the harness predicts from the start token and ``txl eval`` does not predict.
- ``pieces``: the split cut at line ends into ``--docs`` documents of about equal size, read ``--docs`` rows
  at a time both with memory and without, so the two ways are timed with the same batch.

Each configuration runs once through ``lm_eval.simple_evaluate``, in one process, one after the other.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import tempfile
import time
from pathlib import Path

from txl.data.corpora import load_corpus
from txl.evaluation import EvalSettings, evaluate_run, perplexity
from txl.harness import HarnessSettings, TxlLM, run_tasks
from txl.runs import load_run, load_run_config


def _pieces(text: str, n: int) -> list[str]:
    """``text`` cut at line ends into ``n`` parts of about equal length (joined, they are ``text``)."""
    lines = text.splitlines(keepends=True)
    size = len(text) / n
    parts, current, length = [], [], 0
    for line in lines:
        current.append(line)
        length += len(line)
        if length >= size * (len(parts) + 1) and len(parts) < n - 1:
            parts.append("".join(current))
            current = []
    parts.append("".join(current))
    return parts


def _task(folder: Path, name: str, docs: list[str]) -> None:
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data))}\n"
        f"  cache_dir: {json.dumps(str(folder / 'cache'))}\n"
        'output_type: loglikelihood_rolling\ntest_split: test\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n"
        "  - metric: word_perplexity\n    aggregation: weighted_perplexity\n    higher_is_better: false\n"
        "  - metric: bits_per_byte\n    aggregation: bits_per_byte\n    higher_is_better: false\n",
        encoding="utf-8",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--split", default="valid", help="the corpus split to read (default: valid)")
    parser.add_argument("--docs", type=int, default=16, help="documents of the timed task (default: 16)")
    args = parser.parse_args()

    config = load_run_config(args.run_dir)
    text = load_corpus(config.data.corpus).require(args.split).decode("utf-8")
    words = len(re.split(r"\s+", text))  # as the harness counts words
    load = os.getloadavg()
    print(
        json.dumps(
            {
                "run": str(args.run_dir),
                "split": args.split,
                "chars": len(text),
                "words": words,
                "bytes": len(text.encode()),
                "loadavg_start": load,
            }
        ),
        flush=True,
    )

    start = time.perf_counter()
    own = evaluate_run(load_run(Path(args.run_dir)), EvalSettings(batch_size=1), split=args.split)
    seconds = time.perf_counter() - start
    nats = own["loss"] * own["tokens"]
    print(
        json.dumps(
            {
                "what": "txl eval --batch-size 1",
                "seconds": round(seconds, 1),
                "bits_per_token": own["bits_per_token"],
                "bits_per_byte": nats / math.log(2) / len(text.encode()),
                "word_perplexity": perplexity(nats / words),
                "tokens": own["tokens"],
                "mem_len": own["mem_len"],
                "tgt_len": own["tgt_len"],
                "loadavg": os.getloadavg(),
            }
        ),
        flush=True,
    )

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _task(folder, "whole", [text])
        _task(folder, "pieces", _pieces(text, args.docs))
        figures = {}
        for task, batch in (("whole", 1), ("pieces", args.docs)):
            for mem_len in (None, 0):
                lm = TxlLM(run=str(args.run_dir), batch_size=batch, mem_len=mem_len)
                settings = HarnessSettings(tasks=(task,), include_path=(str(folder),))
                start = time.perf_counter()
                results = run_tasks(lm, settings)["results"][task]
                seconds = time.perf_counter() - start
                key = (task, "memory" if lm.span.mem_len else "windows")
                figures[key] = seconds
                print(
                    json.dumps(
                        {
                            "what": f"harness {task}",
                            "way": key[1],
                            "mem_len": lm.span.mem_len,
                            "tgt_len": lm.tgt_len,
                            "batch_size": batch,
                            "seconds": round(seconds, 1),
                            "word_perplexity": results["word_perplexity,none"],
                            "bits_per_byte": results["bits_per_byte,none"],
                            "loadavg": os.getloadavg(),
                        }
                    ),
                    flush=True,
                )
    ratios = {
        f"{t}_memory_over_windows": round(figures[(t, "memory")] / figures[(t, "windows")], 2)
        for t in ("whole", "pieces")
    }
    print(json.dumps({"ratios": ratios, "loadavg_end": os.getloadavg()}))


if __name__ == "__main__":
    main()
