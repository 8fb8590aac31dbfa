"""``[needs]`` in a rubric: earlier labs' modules mounted into the sandbox as _earlier_labs/."""

from __future__ import annotations

import pytest
from shardlab.grading.rubric import RubricError, load_rubric, sandbox_files


def _lab(tmp_path, needs: str):
    (tmp_path / "01_base").mkdir()
    (tmp_path / "01_base" / "base.py").write_text("X = 1\n")
    lab = tmp_path / "02_top"
    lab.mkdir()
    (lab / "top.py").write_text("def f():\n    return 1\n")
    (lab / "test_top.py").write_text("def test_f():\n    assert True\n")
    (lab / "rubric.toml").write_text(
        'lab = "02_top"\nsubmit = ["top.py"]\n' + needs + '[points]\n"test_top.py::test_f" = 1\n'
    )
    return lab


def test_needs_are_mounted_as_earlier_labs(tmp_path):
    lab = _lab(tmp_path, '[needs]\n"01_base" = ["base.py"]\n')
    rubric = load_rubric(lab)
    assert rubric.needs == (("01_base", "base.py"),)
    files = sandbox_files(rubric)
    assert files["_earlier_labs/base.py"] == tmp_path / "01_base" / "base.py"
    assert "top.py" not in files  # the submitted file still comes from the student


@pytest.mark.parametrize(
    "needs, match",
    [
        ('[needs]\n"01_base" = ["gone.py"]\n', "gone.py does not exist"),
        ('[needs]\n"01_base" = ["../x.py"]\n', "plain .py file name"),
        ('[needs]\n"02_top" = ["top.py"]\n', "another lab folder"),
        ('[needs]\n"01_base" = []\n', "non-empty list"),
    ],
)
def test_bad_needs_are_a_sentence(tmp_path, needs, match):
    with pytest.raises(RubricError, match=match):
        load_rubric(_lab(tmp_path, needs))
