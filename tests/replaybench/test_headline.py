"""The README's headline table is what replaybench.headline makes from the committed baseline."""
from pathlib import Path

import pytest

from replaybench import headline

ROOT = Path(__file__).resolve().parents[2]


def test_readme_headline_block_matches_the_generator():
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    if headline.START not in text or headline.END not in text:
        pytest.skip("README.md has no generated-block markers (<!-- headline:start --> ... <!-- headline:end -->)")
    if not (ROOT / "results" / headline.RUN).exists():
        pytest.skip(f"the baseline run results/{headline.RUN} is not in this checkout")
    new = headline.render(text, headline.table(results_dir=ROOT / "results"))
    assert new == text, "README.md's headline table is stale: python -m replaybench.headline --write README.md"


def test_table_has_a_row_per_study_model_and_the_ratios():
    if not (ROOT / "results" / headline.RUN).exists():
        pytest.skip(f"the baseline run results/{headline.RUN} is not in this checkout")
    rows = headline.table(results_dir=ROOT / "results").splitlines()
    assert rows[0].startswith("| model | SSM | eager (ours) | replay |") and len(rows) == 2 + 4
    assert all("×" in r and "%" in r and "—" not in r for r in rows[2:])


def test_names_and_markers():
    assert headline.display_name("nemotron-3-super-120b-a12b") == "Nemotron-3-Super-120B-A12B"
    assert headline.display_name("qwen3.5-4b") == "Qwen3.5-4B"
    with pytest.raises(ValueError, match="no generated-block markers"):
        headline.render("no markers", "x")
    assert headline.render(f"a\n{headline.START}\nold\n{headline.END}\nb", "new\n") == \
        f"a\n{headline.START}\nnew\n{headline.END}\nb"
