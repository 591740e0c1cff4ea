#!/usr/bin/env python3
"""Issue 13's Python targets, measured side by side in one run (docs/benchmarks.md):

1. Sequential write and read of one file (1 GiB by default, 4 MiB calls, fsync at close)
   through the Python package against the Rust client (`shoal bench io` with the same
   pattern), alternating, medians of --reps runs: the ratio Python / Rust.
2. `pandas.read_parquet` of a ~200 MB file through fsspec (`shoal://`) against reading the
   same file through the FUSE mount (`shoal mount`), alternating, medians: the ratio
   of times shoal:// / mount.

The sequential reads follow their writes at once (as in `shoal bench io`); before every
`read_parquet` the page caches are dropped when this runs as root (`caches_dropped`).

    python3 bench/python_rates.py --config /tmp/shoal/cluster.toml [--size 1G] [--parquet-mb 200]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pandas as pd

import shoal

CALL = 4 << 20


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def drop_caches():
    """Drop the kernel's page cache (the mount's and the servers' files); False if not allowed."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def shoal_cli(args):
    exe = os.environ.get("SHOAL_BIN") or shutil.which("shoal")
    if exe is None:
        target = os.environ.get("CARGO_TARGET_DIR") or os.path.expanduser("~/.cache/shoal/target")
        exe = os.path.join(target, "release", "shoal")
    return [exe, *args]


def rust_rates(config, size):
    """One run of `shoal bench io` (one process, one file, CALL-byte transfers, fsync at close)."""
    out = subprocess.run(
        shoal_cli(["--config", config, "bench", "io", "-T", "native", "-n", "1", "-F", "-t", str(CALL),
                   "-b", str(size), "-e", "--reps", "1", "--json", "-q", "--base", "/bench-python-rust"]),
        check=True, capture_output=True, text=True).stdout
    rows = {r["phase"]: r["median"] for r in json.loads(out)["summary"]}
    return rows["write"], rows["read"]


def python_rates(fs, size, path):
    block = np.random.default_rng(1).integers(0, 256, size=CALL, dtype=np.uint8)
    t0 = time.perf_counter()
    with fs.open(path, "wb", buffering=0) as f:
        done = 0
        while done < size:
            done += f.write(block[: min(CALL, size - done)])
    write = size / (1 << 20) / (time.perf_counter() - t0)
    # No cache dropping here: `shoal bench io`'s read phase follows its write phase the same way.
    into = bytearray(CALL)
    view = memoryview(into)
    t0 = time.perf_counter()
    with fs.open(path, "rb", buffering=0) as f:
        got = 0
        while True:
            n = f.readinto(view)
            if not n:
                break
            got += n
    read = size / (1 << 20) / (time.perf_counter() - t0)
    assert got == size, f"read {got} of {size} bytes"
    fs.unlink(path)
    return write, read


def parquet_table(mb):
    rows = mb * (1 << 20) // (8 * 5)
    rng = np.random.default_rng(2)
    return pd.DataFrame({f"c{i}": rng.random(rows) for i in range(5)})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.environ.get("SHOAL_CONFIG"), help="cluster configuration")
    ap.add_argument("--size", default="1G", help="file size of the sequential case (default 1G)")
    ap.add_argument("--parquet-mb", type=int, default=200, help="size of the Parquet file in MB (default 200)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args()
    if not a.config:
        sys.exit("python_rates: no --config and $SHOAL_CONFIG is not set")
    size = parse_size(a.size)
    fs = shoal.Client(a.config)
    dropped = drop_caches()
    results = {"size": size, "parquet_mb": a.parquet_mb, "caches_dropped": dropped}

    # 1. Python against Rust, alternating.
    runs = {"rust write": [], "rust read": [], "python write": [], "python read": []}
    fs.makedirs("/bench-python", exist_ok=True)
    for rep in range(a.reps):
        w, r = rust_rates(a.config, size)
        runs["rust write"].append(w)
        runs["rust read"].append(r)
        w, r = python_rates(fs, size, f"/bench-python/seq.{rep}")
        runs["python write"].append(w)
        runs["python read"].append(r)
        print(f"run {rep + 1}: " + ", ".join(f"{k} {v[-1]:.0f} MiB/s" for k, v in runs.items()), file=sys.stderr)
    med = {k: statistics.median(v) for k, v in runs.items()}
    results["sequential"] = {"runs": runs, "median": med,
                             "python/rust write": med["python write"] / med["rust write"],
                             "python/rust read": med["python read"] / med["rust read"]}

    # 2. read_parquet through fsspec against the FUSE mount.
    mnt = tempfile.mkdtemp(prefix="shoal-bench-mnt-")
    subprocess.run(shoal_cli(["--config", a.config, "mount", mnt]), check=True)
    try:
        deadline = time.time() + 30
        while not os.path.ismount(mnt) and time.time() < deadline:
            time.sleep(0.1)
        df = parquet_table(a.parquet_mb)
        df.to_parquet("shoal:///bench-python/t.parquet", storage_options={"config": a.config})
        file_mb = fs.stat("/bench-python/t.parquet").st_size / 1e6
        times = {"shoal://": [], "mount": []}
        for rep in range(a.reps):
            for how, url in (("shoal://", "shoal:///bench-python/t.parquet"),
                             ("mount", os.path.join(mnt, "bench-python/t.parquet"))):
                if dropped:
                    drop_caches()
                t0 = time.perf_counter()
                back = pd.read_parquet(url, storage_options={"config": a.config} if how == "shoal://" else None)
                times[how].append(time.perf_counter() - t0)
                assert len(back) == len(df)
            print(f"run {rep + 1}: read_parquet shoal:// {times['shoal://'][-1]:.2f} s, "
                  f"mount {times['mount'][-1]:.2f} s", file=sys.stderr)
        med_t = {k: statistics.median(v) for k, v in times.items()}
        results["parquet"] = {"file_mb": file_mb, "seconds": times, "median": med_t,
                              "shoal/mount time": med_t["shoal://"] / med_t["mount"]}
    finally:
        subprocess.run(["fusermount3", "-u", mnt], check=False)
        os.rmdir(mnt)
        fs.rmtree("/bench-python")

    if a.json:
        print(json.dumps(results, indent=1))
        return
    s, p = results["sequential"], results["parquet"]
    print(f"\nsequential {size >> 20} MiB, {CALL >> 20} MiB calls, fsync at close, read right after the write; "
          f"medians of {a.reps}:")
    print("| phase | Rust client | Python | Python / Rust | target |\n|---|---:|---:|---:|---|")
    for ph in ("write", "read"):
        ratio = s[f"python/rust {ph}"]
        print(f"| {ph} | {s['median'][f'rust {ph}']:.0f} MiB/s | {s['median'][f'python {ph}']:.0f} MiB/s | "
              f"{ratio:.2f} | >= 0.9: {'met' if ratio >= 0.9 else 'missed'} |")
    ratio = p["shoal/mount time"]
    print(f"\npandas.read_parquet of {p['file_mb']:.0f} MB, medians of {a.reps}:")
    print("| through | seconds |\n|---|---:|")
    print(f"| shoal:// (fsspec) | {p['median']['shoal://']:.2f} |\n| FUSE mount | {p['median']['mount']:.2f} |")
    print(f"\ntime shoal:// / mount: {ratio:.2f} (target <= 1.2: {'met' if ratio <= 1.2 else 'missed'})")


if __name__ == "__main__":
    main()
