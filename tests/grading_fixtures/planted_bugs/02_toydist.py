"""Planted bug for 02_toydist: forgetting to average (sum instead of mean)."""

FILE = "distmean.py"
OLD = "t /= dist.get_world_size()"
NEW = "t /= 1  # get_world_size() forgotten"
LOST = {"test_distmean.py::test_mean_two_ranks"}
