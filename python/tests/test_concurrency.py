"""Twenty sandboxes from twenty threads, and many threads on one sandbox."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import hako


def test_twenty_sandboxes_from_twenty_threads(tmp_path: Path) -> None:
    def one(i: int) -> str:
        ws = tmp_path / f"ws{i}"
        ws.mkdir()
        with hako.Sandbox(backend="linux", workspace=ws) as sb:
            sb.files.write("me.txt", f"thread {i}")
            return sb.run("cat me.txt; ls | wc -l").stdout

    with ThreadPoolExecutor(20) as pool:
        outs = list(pool.map(one, range(20)))
    assert outs == [f"thread {i}1\n" for i in range(20)]


def test_one_sandbox_shared_by_many_threads(sb: hako.Sandbox) -> None:
    def one(i: int) -> str:
        sb.files.write(f"f{i}", str(i))
        return sb.run(["cat", f"f{i}"]).stdout

    with ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(one, range(64)))
    assert outs == [str(i) for i in range(64)]
