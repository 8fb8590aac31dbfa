"""Instructor helper of the toy lab (always the instructor's copy in a sandbox)."""


def same(got, want, tol=1e-12):
    return len(got) == len(want) and all(abs(a - b) <= tol for a, b in zip(got, want))
