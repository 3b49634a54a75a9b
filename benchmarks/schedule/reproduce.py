"""Re-run every committed `rhymerl bench schedule` result and compare it field by field (the
machine, the wall time and the command's --out excepted). Usage: python benchmarks/schedule/reproduce.py [PATH-FILTER ...]"""
import glob
import json
import os
import shlex
import subprocess
import sys

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
env = dict(os.environ, PYTHONSAFEPATH="1")
bad = 0
only = sys.argv[1:]
for path in sorted(glob.glob("benchmarks/schedule/**/results.json", recursive=True)):
    with open(path) as f:
        old = json.load(f)
    cmd = old.get("command", "")
    if not cmd.startswith("rhymerl bench schedule") or (only and not any(o in path for o in only)):
        continue
    args = shlex.split(cmd)
    out = "/tmp/sched_after/" + path.replace("/", "_")
    args[args.index("--out") + 1] = out
    subprocess.run([".venv/bin/rhymerl", *args[1:]], check=True, env=env, capture_output=True)
    with open(out + "/results.json") as f:
        new = json.load(f)
    for k in ("machine", "seconds", "command"):
        old.pop(k, None)
        new.pop(k, None)
    same = old == new
    bad += not same
    print(("same     " if same else "DIFFERENT"), path, flush=True)
    if not same:
        for k in old:
            if old.get(k) != new.get(k):
                print("   key", k)
sys.exit(1 if bad else 0)
