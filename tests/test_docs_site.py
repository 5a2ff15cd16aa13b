"""The docs site builds (mkdocs build --strict) and renders: real defaults in the option tables,
no raw Sphinx roles, doctest examples as code blocks, every table row as wide as its header."""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RAW_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`")


class Tables(HTMLParser):
    """The cell count of each row of each table, and the text of the <pre> blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[int]] = []
        self.pre: list[str] = []
        self._in_pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append(0)
        elif tag in ("td", "th"):
            self.tables[-1][-1] += 1
        elif tag == "pre":
            self._in_pre += 1
            self.pre.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "pre":
            self._in_pre -= 1

    def handle_data(self, data: str) -> None:
        if self._in_pre:
            self.pre[-1] += data


@pytest.fixture(scope="module")
def site(docs_site) -> Path:
    return docs_site.path


def pages(site: Path) -> list[Path]:
    found = sorted(site.glob("**/index.html"))
    assert len(found) > 20
    return found


def test_no_sentinel_or_raw_roles(site: Path) -> None:
    for page in pages(site):
        text = page.read_text(encoding="utf-8")
        assert "Sentinel" not in text, page
        assert "UNSET" not in text, page
        assert not RAW_ROLE.search(text), (page, RAW_ROLE.search(text))


def test_no_page_repeats_a_heading(site: Path) -> None:
    for page in pages(site):
        text = page.read_text(encoding="utf-8")
        article = text[text.find("<article") : text.find("</article>")]
        headings = [
            " ".join(re.sub(r"<[^>]+>|&para;|¶", "", found).split())
            for found in re.findall(r"<h[1-3][^>]*>(.*?)</h[1-3]>", article, re.DOTALL)
        ]
        repeated = {h for h in headings if headings.count(h) > 1}
        assert not repeated, (page, repeated)


def test_every_table_row_has_the_header_width(site: Path) -> None:
    widths = 0
    for page in pages(site):
        parser = Tables()
        parser.feed(page.read_text(encoding="utf-8"))
        for table in parser.tables:
            assert table and all(row == table[0] for row in table), (page, table)
            widths += len(table)
    assert widths > 300  # the command pages' option tables are among them


def cells(row: str) -> int:
    """The cells of a Markdown table row: ``|`` outside code spans and not escaped."""
    outside = re.sub(r"(`+).*?\1", "", row.replace("\\|", ""))
    return outside.strip().strip("|").count("|") + 1


def table_rows(markdown: str) -> list[list[int]]:
    tables: list[list[int]] = []
    previous = ""
    for line in markdown.splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append(cells(line))
        previous = line
    return tables


def test_markdown_table_rows_have_the_header_width() -> None:
    """Python-Markdown drops the cells past the header's, so a row split by a stray ``|`` is
    caught in the Markdown: the docs' own pages and every generated option table."""
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import options
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    sources = {path: path.read_text(encoding="utf-8") for path in (ROOT / "docs").glob("**/*.md")}
    generated = 0
    for path, text in sources.items():
        sources[path] = options.on_page_markdown(text)
        generated += text.count("::: curvcal-options")
    assert generated == 10  # one per command page
    rows = 0
    for path, text in sources.items():
        for table in table_rows(text):
            assert all(width == table[0] for width in table), (path, table)
            rows += len(table)
    assert rows > 300


def test_option_tables_show_the_defaults_help_shows(site: Path) -> None:
    text = (site / "commands" / "hessian" / "index.html").read_text(encoding="utf-8")
    row = re.search(r"<code>--data</code>.*?</tr>", text, re.DOTALL)
    assert row is not None
    assert "tv:NAME[:train|test]" in re.sub(r"<[^>]+>", "", row.group(0))
    row = re.search(r"<code>--top-k</code>.*?</tr>", text, re.DOTALL)
    assert row is not None and "<code>1</code></td>" in row.group(0)
    # a default only a sentence can say moves from the help text to the default column
    row = re.search(r"<code>--tokenizer</code>.*?</tr>", text, re.DOTALL)
    assert row is not None and "[default:" not in row.group(0)
    assert "the model folder" in row.group(0)
    assert text.count("<h1") == 1


def test_api_pages_render_examples_and_cross_references(site: Path) -> None:
    text = (site / "api" / "curvature" / "index.html").read_text(encoding="utf-8")
    parser = Tables()
    parser.feed(text)
    examples = [block for block in parser.pre if ">>> H.shape" in block]
    assert examples and "(15, 15)" in examples[0]
    assert 'class="autorefs autorefs-internal"' in text
    assert "HessianSettings" in text and "int" in text


def test_the_timm_recipe_names_the_files_save_for_hf_writes(tmp_path: Path) -> None:
    """timm's ``save_for_hf`` writes ``pytorch_model.bin`` unless ``safe_serialization=True``
    (then ``model.safetensors``): the recipe says so and saves the second."""
    import timm
    from timm.models import save_for_hf

    model = timm.create_model("test_resnet", num_classes=3)
    save_for_hf(model, str(tmp_path / "default"))
    save_for_hf(model, str(tmp_path / "safe"), safe_serialization=True)
    assert (tmp_path / "default" / "pytorch_model.bin").is_file()
    assert not (tmp_path / "default" / "model.safetensors").exists()
    assert (tmp_path / "safe" / "model.safetensors").is_file()
    recipe = (ROOT / "docs" / "recipes" / "timm.md").read_text(encoding="utf-8")
    assert "`pytorch_model.bin`" in recipe and "`model.safetensors`" in recipe
    assert 'save_for_hf(model, "test_resnet-cifar10", safe_serialization=True)' in recipe
