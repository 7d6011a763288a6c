"""Shared test set-up: mpmath's working precision per test module.

A module that needs more digits than mpmath's default 15 sets ``MPMATH_DPS``; every test runs
inside ``mpmath.workdps`` of it, so a precision set by one module (or changed inside a test)
never leaks into another module's tests, whatever order pytest-xdist gives them."""

import mpmath
import pytest


@pytest.fixture(autouse=True)
def _mpmath_precision(request):
    with mpmath.workdps(getattr(request.module, "MPMATH_DPS", 15)):
        yield
