"""Planted bug for 01_toy: the mean forgets to divide by the count."""

FILE = "gradetoy.py"
OLD = "return total / len(xs)"
NEW = "return total"
LOST = {"test_gradetoy.py::test_mean", "test_gradetoy_hidden.py::test_mean_hidden"}
