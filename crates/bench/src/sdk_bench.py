"""One command's round trip through two Python SDKs, alternately.

Usage: sdk_bench.py N E2B_URL HAKO_URL TOKEN
`commands.run("true")` through the `e2b` SDK against `hako serve --e2b`,
and `Sandbox.run("true")` through hako's own SDK against `hako serve`;
prints {"e2b": [us, ...], "hako": [us, ...]}.
"""

import json
import os
import sys
import time

n, e2b_url, hako_url, token = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
os.environ["E2B_API_URL"] = e2b_url
os.environ["E2B_SANDBOX_URL"] = e2b_url
os.environ["E2B_API_KEY"] = token

import e2b  # noqa: E402
import hako  # noqa: E402

theirs = e2b.Sandbox.create(timeout=600)
ours = hako.Sandbox(url=hako_url, token=token)


def timed(f):
    start = time.perf_counter()
    f()
    return (time.perf_counter() - start) * 1e6


def run_e2b():
    theirs.commands.run("true")


def run_hako():
    if ours.run("true").exit_code != 0:
        raise SystemExit("true failed through hako's SDK")


run_e2b()
run_hako()
out = {"e2b": [], "hako": []}
for i in range(n):
    pair = [("e2b", run_e2b), ("hako", run_hako)]
    for name, f in pair if i % 2 == 0 else reversed(pair):
        out[name].append(timed(f))
theirs.kill()
ours.close()
print(json.dumps(out))
