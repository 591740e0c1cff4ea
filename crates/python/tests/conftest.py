"""A real Shoal cluster for the Python tests: `shoal cluster up` with real shoald processes
on 127.0.0.1, stopped (by `shoal cluster down`) when the session ends."""

import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest


def shoal_binary():
    """The `shoal` CLI: $SHOAL_BIN, else the workspace's release build."""
    if os.environ.get("SHOAL_BIN"):
        return os.environ["SHOAL_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.expanduser("~/.cache/shoal/target")
    for candidate in (pathlib.Path(target) / "release" / "shoal",
                      pathlib.Path(__file__).resolve().parents[3] / "target" / "release" / "shoal"):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("shoal")
    if not found:
        pytest.exit("no shoal binary: build the workspace (cargo build --release) or set SHOAL_BIN", 2)
    return found


@pytest.fixture(scope="session")
def cluster():
    """The configuration path of a 3-server cluster (stripes of 64 KiB over every server,
    so files of a few hundred KiB already span all three)."""
    shoal = shoal_binary()
    work = tempfile.mkdtemp(prefix="shoal-pytest-")
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_CONFIG"}
    subprocess.run([shoal, "cluster", "up", "-n", "3", "--dir", work, "--stripe-size", "64K", "--stripe-count", "0"],
                   check=True, stdout=subprocess.DEVNULL, env=env, timeout=120)
    try:
        yield os.path.join(work, "cluster.toml")
    finally:
        subprocess.run([shoal, "cluster", "down", "--dir", work], check=False, stdout=subprocess.DEVNULL, env=env,
                       timeout=60)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def fs(cluster):
    import shoal
    return shoal.Client(cluster)


@pytest.fixture
def base(fs, request):
    """A fresh directory for one test."""
    path = "/" + request.node.name.replace("[", "_").replace("]", "")
    fs.makedirs(path, exist_ok=True)
    return path
