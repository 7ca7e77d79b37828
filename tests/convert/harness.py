"""Shared check counter of the converter script tests: check() records a
failure and keeps going, finish() prints "<name>: N passed, N failed" and
exits non-zero on any failure."""
import sys

_failures = 0
_checks = 0


def check(cond, msg):
    global _failures, _checks
    _checks += 1
    if not cond:
        _failures += 1
        print("FAIL", msg)


def finish(name):
    print(f"{name}: {_checks - _failures} passed, {_failures} failed")
    sys.exit(1 if _failures else 0)
