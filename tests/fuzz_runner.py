"""The runner of the fuzz matrix (``tests/test_fuzz.py``): one case, a per-case timeout, and its outcome."""

from __future__ import annotations

import math
import multiprocessing
import os
import re
import signal
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

#: seconds a case may run before it counts as a hang
TIMEOUT = 5


@dataclass
class Case:
    id: str
    run: Callable[[], Any]
    names: tuple[str, ...] = ()  #: an error message must match one of these (regular expressions)
    must_fail: bool = False  #: a finite result is a silent failure (the input is wrong)
    isolate: bool = False  #: run in a forked process (a hang inside C code ignores signals)


class _Timeout(BaseException):
    pass


@contextmanager
def _alarm(seconds: int) -> Iterator[None]:
    def handler(signum: int, frame: Any) -> None:
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, handler)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _finite(out: Any) -> bool:
    if isinstance(out, torch.Tensor):
        return not out.is_floating_point() or bool(torch.isfinite(out).all())
    if isinstance(out, float):
        return math.isfinite(out)
    if isinstance(out, (list, tuple)):
        return all(_finite(o) for o in out)
    if isinstance(out, dict):
        return all(_finite(o) for o in out.values())
    if isinstance(out, torch.distributions.Distribution):
        return _finite(out.mean) if hasattr(out, "mean") else True
    return True


def classify(case: Case) -> tuple[str, str]:
    """``(outcome, detail)``: outcome is ``finite``, ``clear`` (a ValueError/TypeError naming the argument),
    ``unclear`` (one that does not), ``nan``, ``silent`` (a finite result for wrong input), ``raw`` (any other
    exception) or ``hang``."""
    if not case.isolate:
        return _classify(case)
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(case, sender), daemon=True)
    process.start()
    sender.close()
    result = receiver.recv() if receiver.poll(TIMEOUT) else ("hang", f"no result after {TIMEOUT} s")
    if process.is_alive():
        process.kill()
    process.join()
    return result


def _child(case: Case, sender: Any) -> None:
    try:
        sender.send(_classify(case))
    finally:
        os._exit(0)


def _classify(case: Case) -> tuple[str, str]:
    try:
        with warnings.catch_warnings(), _alarm(TIMEOUT):
            warnings.simplefilter("ignore")
            out = case.run()
    except _Timeout:
        return "hang", f"no result after {TIMEOUT} s"
    except (ValueError, TypeError, UserWarning) as err:  # a case may escalate a warning it expects to an error
        msg = str(err)
        if not case.names or any(re.search(n, msg, re.IGNORECASE) for n in case.names):
            return "clear", msg
        return "unclear", f"{type(err).__name__}: {msg}"
    except Exception as err:  # noqa: BLE001
        return "raw", f"{type(err).__name__}: {str(err)[:300]}"
    if not _finite(out):
        return "nan", "non-finite result"
    return ("silent", "a finite result for wrong input") if case.must_fail else ("finite", "")
