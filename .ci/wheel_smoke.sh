#!/usr/bin/env bash
# The built artifacts, as a user gets them: build the wheel and the sdist, check them with twine, install the
# WHEEL (not editable) into a fresh virtual environment and, from a folder outside the checkout, run what
# needs the package's data files: the version, the demo, a preset, the serve page, the harness task, an
# analysis. Usage: .ci/wheel_smoke.sh [WORK_DIR]   (default: a new temporary folder, removed at the end)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
work="${1:-$(mktemp -d)}"
[ $# -ge 1 ] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work"
say() { echo "wheel smoke: [${SECONDS}s] $*"; }
export PIP_QUIET=1 PIP_DISABLE_PIP_VERSION_CHECK=1

say "python -m build (wheel and sdist) into $work/dist, from a copy of the files git tracks or would track"
mkdir -p "$work/tree"   # a clean copy: an egg-info left in src/ by an earlier build would add files to the sdist
git ls-files -z --cached --others --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$work/tree"
(cd "$work/tree" && python3 -m build --outdir "$work/dist" . >"$work/build.log" 2>&1) || { cat "$work/build.log"; exit 1; }
python3 -m twine check --strict "$work"/dist/*
wheel=$(ls "$work"/dist/*.whl)
sdist=$(ls "$work"/dist/*.tar.gz)

say "the package data is in the wheel and the sdist"
python3 - "$wheel" "$sdist" <<'EOF'
import sys, tarfile, zipfile
from pathlib import Path
wheel = set(zipfile.ZipFile(sys.argv[1]).namelist())
sdist = {name.split("/", 1)[1] for name in tarfile.open(sys.argv[2]).getnames() if "/" in name}
src = Path("src/txl")
expected = [p for pattern in ("configs/*.toml", "configs/rl/*.toml", "serve/static/*", "harness_tasks/*.yaml",
                                "**/__init__.py")
            for p in src.glob(pattern)]
missing = [str(p) for p in expected if f"txl/{p.relative_to(src)}" not in wheel]
missing += [f"sdist: {p}" for p in expected if str(p) not in sdist]
assert not missing, f"not shipped: {missing}"
print(f"  {len(expected)} data files and packages in both ({len(wheel)} files in the wheel)")
EOF

say "a fresh virtual environment: torch==2.13.0, then the wheel with the serve and harness extras"
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
txl="$work/venv/bin/txl"
"$py" -m pip install torch==2.13.0
"$py" -m pip install "$wheel[serve,harness]"

outside="$work/outside"   # every command below runs here, where no src/ or checkout is in reach
mkdir -p "$outside/data/tinyshakespeare"
cd "$outside"
"$py" - <<'EOF'
import txl, pathlib
assert "site-packages" in txl.__file__, f"txl imported from {txl.__file__}, not the installed wheel"
lines = [f"{name}: {verb} the {thing}, good {name.lower()}, and {verb} again.\n"
         for name in ("ROMEO", "JULIET", "MERCUTIO", "NURSE") for verb in ("speak", "hear", "mark", "call")
         for thing in ("moon", "sun", "night", "wall", "rose", "name")]
pathlib.Path("data/tinyshakespeare/input.txt").write_text("".join(lines) * 12)
EOF

say "txl --version"
version=$("$txl" --version)
expected="txl $("$py" -c 'import importlib.metadata as m; print(m.version("transformer-xl"))')"
[ "$version" = "$expected" ] || { echo "txl --version said '$version', expected '$expected'"; exit 1; }
echo "  $version"

say "txl demo --steps 2"
"$txl" demo --steps 2 --out demo --quiet >demo.log
test -s demo/demo.json

say "txl train --config shakespeare-char --set train.steps=2 (a preset shipped in the wheel)"
TXL_DATA_DIR="$outside/data" "$txl" train --config shakespeare-char --set train.steps=2 \
    --set train.eval_every=0 --set train.checkpoint_every=0 --out shakespeare --quiet
test -s shakespeare/summary.json

say "txl serve: the page and the API answer 200"
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$txl" serve shakespeare --host 127.0.0.1 --port "$port" --log-level warning >serve.log 2>&1 &
server=$!
"$py" - "$port" <<'EOF' || { kill "$server"; cat serve.log; exit 1; }
import json, sys, time, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(600):
    try:
        urllib.request.urlopen(base + "/v1/health", timeout=2)
        break
    except OSError:
        time.sleep(0.1)
page = urllib.request.urlopen(base + "/", timeout=10)
body = page.read().decode()
assert page.status == 200 and "<html" in body.lower(), "the page"
for path in ("/v1/health", "/v1/model", "/v1/models"):
    assert urllib.request.urlopen(base + path, timeout=10).status == 200, path
request = urllib.request.Request(base + "/v1/completions", data=json.dumps(
    {"prompt": "ROMEO:", "max_tokens": 5, "seed": 1}).encode(), headers={"Content-Type": "application/json"})
answer = json.load(urllib.request.urlopen(request, timeout=60))
assert answer["usage"]["completion_tokens"] == 5, answer
print(f"  / ({len(body):,} bytes), /v1/health, /v1/model, /v1/models, /v1/completions: 200")
EOF
kill "$server"
wait "$server" 2>/dev/null || true

say "the shipped harness task is found"
"$py" -c '
import txl.harness
names = txl.harness.task_manager().all_tasks
assert "txl_wikitext_local" in names, "txl_wikitext_local not found"
print("  txl_wikitext_local")'

say "the shipped RL presets are found and load"
"$py" -c '
from txl.rl.config import load_rl_config, rl_preset_names
names = rl_preset_names()
assert "RepeatPreviousEasy" in names, names
print(f"  {len(names)} presets:", ", ".join(load_rl_config(name).task for name in names))'

say "txl analyze recall on a tiny budget"
"$txl" analyze recall --steps 2 --out recall --no-plots --quiet >recall.log
test -s recall/results.json
say "passed in ${SECONDS} s"
