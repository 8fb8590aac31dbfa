"""Toy lab module whose tests are compared outside the sandbox (tests/test_grading_outside.py)."""

def double(t):
    """Return a new tensor, every element of t times 2."""
    # BEGIN SOLUTION hint: multiply by 2
    return t * 2
    # END SOLUTION

def halves(xs):
    """Every float of xs divided by 2, as a list."""
    # BEGIN SOLUTION hint: divide each by 2
    return [x / 2 for x in xs]
    # END SOLUTION

def nbytes(t):
    """Bytes of t's elements."""
    # BEGIN SOLUTION hint: numel times element size
    return t.numel() * t.element_size()
    # END SOLUTION

def sent_per_rank(v, d):
    """Bytes each of d ranks sends in a ring all-reduce of v bytes (d divides v)."""
    # BEGIN SOLUTION hint: 2 v (d - 1) / d
    return [2 * v * (d - 1) // d] * d
    # END SOLUTION
