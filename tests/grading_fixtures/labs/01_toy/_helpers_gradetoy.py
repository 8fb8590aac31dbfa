"""Instructor-provided helper used by the tests (always copied from the instructor's lab)."""


def approx_equal(a, b, tol=1e-9):
    return abs(a - b) <= tol
