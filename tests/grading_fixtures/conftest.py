"""The fixture labs are graded in sandboxes by tests/test_grading_*.py, never collected directly."""

collect_ignore_glob = ["*"]
