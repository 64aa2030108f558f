"""The documentation site (docs/conf.py): every public module has its API page, and the build fails on
a broken reference (the negative control of ``python -m sphinx -W --keep-going -b html docs ...``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = sorted(p.stem for p in (ROOT / "cbdp_jax").glob("*.py") if not p.stem.startswith("_"))


def test_every_public_module_has_an_api_page_in_the_toctree():
    index = (ROOT / "docs" / "api" / "index.md").read_text()
    toctree = re.search(r"```\{toctree\}\n(.*?)```", index, re.S).group(1).split()
    assert len(PUBLIC) >= 15
    for name in PUBLIC:
        page = ROOT / "docs" / "api" / f"{name}.md"
        assert page.exists(), f"no API page for cbdp_jax.{name}"
        assert f".. automodule:: cbdp_jax.{name}\n" in page.read_text(), page
        assert name in toctree, f"docs/api/{name}.md is not in the API toctree"


def missing_links(text: str) -> tuple[int, list[str]]:
    """The number of relative links in a Markdown text, and those naming no file of the repository."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    return len(local), [link for link in local if not (ROOT / link).exists()]


def test_every_link_of_the_readme_names_a_file_that_exists():
    """The README is outside the site's build (docs/), so its links are checked here."""
    count, missing = missing_links((ROOT / "README.md").read_text())
    assert count >= 10 and missing == []
    # negative control: a link to a page that is not there is reported
    assert missing_links("[x](docs/guide/cli.md) [y](docs/guide/nowhere.md#a)") == (
        2,
        ["docs/guide/nowhere.md"],
    )


# A page that documents one small public module and refers to it; each planted error below alone must
# fail the build that the same page without it passes.
PAGE = """# Planted

```{{eval-rst}}
.. automodule:: cbdp_jax.one_run
```

{{func}}`cbdp_jax.one_run.one_run_audit` and {{class}}`cbdp_jax._src.infra.validation.InvalidParameterError`;
[the section](#planted). {error}
"""
ERRORS = {
    "misspelt-api-name": "{func}`cbdp_jax.one_run.one_run_audt`",
    "misspelt-short-name": "{func}`one_run_audt`",
    "missing-page": "[a page](nowhere.md)",
    "missing-anchor": "[a section](#no-such-section)",
    "rst-that-does-not-parse": "\n```{eval-rst}\nThe bound \\|v\\| is |v| here.\n```\n",
    "page-in-no-toctree": "",  # an extra page, orphan.md, that no toctree lists
}


def _build(tmp_path: Path, text: str, orphan: bool = False) -> tuple[int, str]:
    import io
    from contextlib import redirect_stderr

    from sphinx.cmd.build import build_main

    src = tmp_path / "src"
    src.mkdir()
    (src / "index.md").write_text(text)
    if orphan:
        (src / "orphan.md").write_text("# Orphan\n\nA page no toctree lists.\n")
    err = io.StringIO()
    with redirect_stderr(err):
        code = build_main(["-W", "--keep-going", "-q", "-b", "html", "-c", str(ROOT / "docs"),
                           str(src), str(tmp_path / "out")])  # fmt: skip
    return code, err.getvalue()


@pytest.mark.ci
@pytest.mark.slow  # about 3 s a build, 15 s the five at load 15 on 2 cores; CI builds the whole site with the same configuration
@pytest.mark.parametrize("planted", [None, *ERRORS])
def test_a_broken_reference_fails_the_docs_build(tmp_path, planted):
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    text = PAGE.format(error=ERRORS[planted] if planted else "")
    code, err = _build(tmp_path, text, orphan=planted == "page-in-no-toctree")
    if planted is None:
        assert code == 0, err  # the page itself builds clean: the failures below are the plants'
    else:
        assert code != 0 and ("WARNING" in err or "ERROR" in err), (planted, err)
