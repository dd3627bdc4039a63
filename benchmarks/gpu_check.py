r"""``make gpu-check``: the one prepared check of the package on a GPU (about 7 minutes on an H100, an estimate).

1. **Tests on the device** (:data:`DEVICE_TESTS`, ``pytest --device DEVICE -m device``; ``tests/test_cuda.py``
   compares CUDA with CPU results). ``polyagamma`` is not needed: on a GPU the draws use the torch-native sampler.
2. **Benchmarks** (``benchmarks/gpu.py``): ``--size short`` on a GPU, ``--size tiny`` on the CPU.

Results go to ``--output-dir`` (default ``benchmarks/results/gpu``): ``gpu_check.{json,md}`` (the steps, the card;
the logs' tails in the JSON), ``gpu.{json,md}`` and ``pytest.log``; ``--copy-to`` (e.g. ``$OUT`` on the device
machine) copies them there. No run of its own: a driver, so a small parser of its own, not ``run_arguments``::

    make gpu-check                                       # = python benchmarks/gpu_check.py --device cuda
    python benchmarks/gpu_check.py --device cpu --output-dir /tmp/gpu-check   # a rehearsal, tiny sizes
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _report import Table, write_report  # noqa: E402

#: the test modules run on the device (those with tests that take the `device` fixture) and the CUDA module
DEVICE_TESTS = [
    "tests/test_cuda.py",
    "tests/inference/test_cavi.py",
    "tests/inference/test_host_sync.py",
    "tests/inference/test_gibbs.py",
    "tests/inference/test_hmc.py",
    "tests/likelihoods/test_count_likelihoods.py",
    "tests/distributions/test_polya_gamma.py",
    "tests/distributions/test_polya_gamma_torch.py",
]


def _run(command: list[str], what: str, timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``command`` from the repository root; its output, exit status (124 past ``timeout``) and seconds."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        output, returncode = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as err:
        output = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        output, returncode = output + f"\n[gpu-check] {what} stopped after {timeout:.0f} s", 124
    return {"command": " ".join(command[1:]), "returncode": returncode, "seconds": time.perf_counter() - start,
            "output": output}  # fmt: skip


def run_tests(device: str, log: Path, timeout: float) -> dict[str, Any]:
    """``pytest --device DEVICE -m device`` over :data:`DEVICE_TESTS` (``tests/test_cuda.py`` is marked ``device``
    as a whole and skips itself without CUDA); the outcome counts from pytest's summary line."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", "-rfEs",
               "--device", device, "-m", "device", *DEVICE_TESTS]  # fmt: skip
    path = [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    result = _run(command, "pytest", timeout, env={**os.environ, "PYTHONPATH": os.pathsep.join(path)})
    output = result.pop("output")
    log.write_text(output)
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed)", output)}
    return {**result, "counts": counts, "tail": output[-4000:]}


def run_benchmark(device: str, size: str, output_dir: Path, timeout: float) -> dict[str, Any]:
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", device, "--size", size,
               "--output-dir", str(output_dir)]  # fmt: skip
    result = _run(command, "benchmark", timeout)
    result["tail"] = result.pop("output")[-4000:]
    return result


def card(device: str) -> str:
    import torch

    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return "CPU"


def report(record: dict[str, Any]) -> tuple[str, dict[str, Any], list[Any]]:
    """Title, settings and the table of steps (what ``_report.write_report`` renders)."""
    tests, bench = record["tests"], record["benchmark"]
    counts = ", ".join(f"{v} {k}" for k, v in sorted(tests["counts"].items())) or "no summary line"
    settings = {"device": record["device"], "card": record["card"], "benchmark size": record["size"],
                "date (UTC)": record["date_utc"], "wall time [s]": record["seconds"]}  # fmt: skip
    rows = [["tests", tests["command"], tests["returncode"], tests["seconds"], counts],
            ["benchmark", bench["command"], bench["returncode"], bench["seconds"], "tables in gpu.md"]]  # fmt: skip
    return f"gpu-check on {record['card']}", settings, [Table("Steps", ["step", "command", "exit status",
                                                                          "seconds", "outcome"], rows)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (the check) or cpu (a rehearsal with tiny sizes)")
    p.add_argument("--size", choices=["tiny", "short", "full"], default=None,
                   help="benchmark size (default: short on CUDA, tiny on the CPU)")  # fmt: skip
    p.add_argument("--output-dir", type=Path, default=ROOT / "benchmarks" / "results" / "gpu")
    p.add_argument("--copy-to", type=Path, default=None, help="also copy the result files there (e.g. $OUT)")
    p.add_argument("--test-timeout", type=float, default=150.0, help="seconds")
    p.add_argument("--benchmark-timeout", type=float, default=300.0,
                   help="seconds; the benchmark rewrites its report after each part, so a stopped run keeps its tables")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--skip-benchmark", action="store_true")
    args = p.parse_args(argv)
    device_type = args.device.split(":")[0]
    if device_type not in ("cuda", "cpu"):
        p.error(f"--device must be cuda[:index] or cpu; got {args.device!r}")
    size = args.size or ("short" if device_type == "cuda" else "tiny")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    record: dict[str, Any] = {"device": args.device, "card": card(args.device), "size": size,
                              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    print(f"gpu-check on {record['card']} ({args.device}, benchmark size {size})", flush=True)
    skipped = {"command": "skipped", "returncode": 0, "seconds": 0.0, "counts": {}, "tail": ""}
    record["tests"] = skipped if args.skip_tests else run_tests(args.device, args.output_dir / "pytest.log",
                                                                 args.test_timeout)  # fmt: skip
    print(f"tests: {record['tests']['counts']} (exit status {record['tests']['returncode']})", flush=True)
    record["benchmark"] = skipped if args.skip_benchmark else run_benchmark(args.device, size, args.output_dir,
                                                                             args.benchmark_timeout)  # fmt: skip
    print(f"benchmark: exit status {record['benchmark']['returncode']}", flush=True)
    record["seconds"] = time.perf_counter() - start
    write_report(args.output_dir, "gpu_check", record, *report(record), echo=False)
    if args.copy_to is not None:
        args.copy_to.mkdir(parents=True, exist_ok=True)
        for name in ("gpu_check.md", "gpu_check.json", "gpu.md", "gpu.json", "pytest.log"):
            if (args.output_dir / name).exists():
                shutil.copy(args.output_dir / name, args.copy_to / name)
    print(f"gpu-check done in {record['seconds']:.0f} s -> {args.output_dir}", flush=True)
    failed = record["tests"]["returncode"] not in (0, 5) or record["benchmark"]["returncode"] != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
