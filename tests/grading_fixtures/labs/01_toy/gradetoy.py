"""Toy lab module used to test the grader (not part of the book)."""


def add(a, b):
    """Return a + b."""
    # BEGIN SOLUTION hint: return the sum of a and b
    return a + b
    # END SOLUTION


def chunk(xs, n, i):
    """Return block i of xs cut into n equal blocks."""
    size = len(xs) // n
    # BEGIN SOLUTION hint: slice the i-th block of length len(xs) // n
    start = i * size
    return xs[start : start + size]
    # END SOLUTION


def mean(xs):
    """Arithmetic mean of a non-empty list."""
    # BEGIN SOLUTION hint: sum divided by count
    total = sum(xs)
    return total / len(xs)
    # END SOLUTION


def scale(xs, factor):
    """Every element of xs times factor."""
    out = []
    for x in xs:
        # BEGIN SOLUTION hint: append x times factor
        out.append(x * factor)
        # END SOLUTION
    return out
