"""The documentation site: strict build, maths, cross-references, and a real browser.

* The site builds with ``mkdocs build --strict`` (what ``make docs`` runs) and has an API page for
  every public module (``docs/_build/gen_pages.py``).
* The build-time pieces fail loudly: a formula latex2mathml cannot convert names its page
  (``docs/_build/hooks.py``); an unresolvable ``:func:`...``` role in a docstring names the object
  (``docs/_build/sphinx_roles.py``); a broken link fails a strict build.
* Debian's chromium (driven by selenium through Debian's chromedriver, both installed by
  ``.ci/run``) opens the built site over HTTP and checks that the home page, the concepts guide,
  the EnvSched guide and an API page render: their formulas are laid out as MathML (non-empty boxes,
  ``display: math``), no TeX source is left in the text, and every image loaded.
  Without chromium the browser tests are skipped with that reason; CI installs it.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
DOCS_ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}

pytestmark = pytest.mark.xdist_group("docs_site")   # one build per worker


def _load(name: str, path: Path) -> types.ModuleType:
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mkdocs(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", *args], cwd=cwd, env=DOCS_ENV,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = mkdocs("build", "--strict", "--site-dir", str(out))
    assert result.returncode == 0, f"strict build failed:\n{result.stderr[-4000:]}"
    return out


# -- the build ---------------------------------------------------------------------------------


def test_strict_build_has_an_api_page_per_public_module(site):
    modules = []
    for path in sorted((ROOT / "envsched_jax").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts) or parts[1:4] in {("pool", "embedded", "envs"),
                                                                   ("pool", "embedded", "tasks")}:
            continue
        modules.append(parts)
    assert len(modules) > 100
    missing = []
    for parts in modules:
        rel = Path("reference", *parts[1:])
        page = site / rel / "index.html"
        if not page.exists():
            missing.append(".".join(parts))
            continue
        text = page.read_text(encoding="utf-8")
        # mkdocstrings gives the module's heading the dotted path as its anchor id
        if f'id="{".".join(parts)}"' not in text:
            missing.append(".".join(parts) + " (no heading)")
    assert not missing, f"API pages missing: {missing}"
    # the notebooks are rendered into the site
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        assert (site / "notebooks" / nb.stem / "index.html").exists(), nb.name


def test_docstring_roles_became_links(site):
    page = (site / "reference/sched/kernels/index.html").read_text(encoding="utf-8")
    # ":class:`~envsched_jax.sched.config.EnvSchedConfig`" in the module docstring
    assert 'href="../config/#envsched_jax.sched.config.EnvSchedConfig"' in page
    assert ":class:`" not in page and ":func:`" not in page


def test_unconvertible_formula_names_the_page():
    hooks = _load("docs_hooks_for_test", ROOT / "docs/_build/hooks.py")
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_uri="guides/x.md"))
    good = hooks.on_page_content('<span class="arithmatex">\\(a^2\\)</span>', page, None, None)
    assert "<math" in good and "<msup>" in good
    with pytest.raises(hooks.MathError, match=r"guides/x.md: formula 'a\^' does not convert"):
        hooks.on_page_content('<span class="arithmatex">\\(a^\\)</span>', page, None, None)
    with pytest.raises(hooks.MathError, match=r"formula '\\\\foo x' does not convert to MathML: unknown command"):
        hooks.on_page_content('<div class="arithmatex">\\[\\foo x\\]</div>', page, None, None)


def test_unresolved_docstring_reference_fails(tmp_path):
    roles = _load("docs_roles_for_test", ROOT / "docs/_build/sphinx_roles.py")
    import griffe
    name = "rolestestpkg"   # not envsched_jax: griffe would find the installed package first
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""See :func:`.mod.f`, :func:`numpy.sum` and :class:`.Missing`."""\n')
    (pkg / "mod.py").write_text('def f():\n    """See :func:`f` and :func:`_g`."""\n\ndef _g():\n    pass\n')

    def load():
        return griffe.load(name, search_paths=[tmp_path],
                           extensions=griffe.load_extensions(roles.SphinxRoles(package=name)))

    with pytest.raises(roles.UnresolvedReference, match=rf"{name}: :class:`.Missing` names nothing in {name}"):
        load()
    (pkg / "__init__.py").write_text('"""See :func:`.mod.f` and :func:`numpy.sum`."""\n')
    loaded = load()
    assert loaded.docstring.value == f"See [`mod.f()`][{name}.mod.f] and `numpy.sum()`."
    # a private target is shown as code, not linked (it has no page)
    assert loaded["mod.f"].docstring.value == f"See [`f()`][{name}.mod.f] and `_g()`."


def test_strict_build_fails_on_a_broken_link(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [a page that does not exist](missing.md) and $x^2$.\n")
    shutil.copytree(ROOT / "docs/_build", docs / "_build")
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    # the project's markdown settings, hooks and validation; only the plugins that need the package
    # (API pages, notebooks) are left out to keep this build small
    head, _, rest = config.partition("\nplugins:\n")
    _, _, tail = rest.partition("\nmarkdown_extensions:\n")
    tail = tail.partition("\nnav:\n")[0]
    (tmp_path / "mkdocs.yml").write_text(head + "\nplugins:\n  - search\n\nmarkdown_extensions:\n" + tail + "\n")
    result = mkdocs("build", "--strict", cwd=tmp_path)
    assert result.returncode != 0
    assert "contains a link 'missing.md', but the target is not found" in result.stderr
    (docs / "index.md").write_text("# Home\n\nNo broken link, and $x^2$.\n")
    result = mkdocs("build", "--strict", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "<math" in (tmp_path / "build/site/index.html").read_text(encoding="utf-8")


# -- the browser -------------------------------------------------------------------------------


def _chromium_reason() -> str | None:
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            return f"Debian's {package} is not installed ({path}); bash .ci/run installs it"
    return None


@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    reason = _chromium_reason()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1280,1600", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


PAGE_REPORT = """
const maths = Array.from(document.querySelectorAll('article math'));
const images = Array.from(document.querySelectorAll('article img'));
return {
  title: document.title,
  maths: maths.map(m => { const r = m.getBoundingClientRect();
                          return [r.width, r.height, getComputedStyle(m).display]; }),
  images: images.map(i => [i.getAttribute('src'), i.complete, i.naturalWidth]),
  text: document.querySelector('article').innerText,
};
"""


@pytest.mark.parametrize("path, min_maths, min_images", [
    ("", 5, 2),                          # home: the exploitation pick, the loop figure, Figure 4
    ("concepts/", 5, 1),                 # a guide
    ("papers/envsched/", 20, 0),         # the EnvSched paper guide: its equations
    ("reference/sched/", 20, 0),         # an API page: the package docstring's equations
])
def test_page_renders_maths_and_images(browser, served, path, min_maths, min_images):
    browser.get(f"{served}/{path}")
    report = browser.execute_script(PAGE_REPORT)
    assert "404" not in report["title"], report["title"]
    maths, images = report["maths"], report["images"]
    assert len(maths) >= min_maths, f"{path!r}: {len(maths)} formulas rendered"
    flat = [m for m in maths if not (m[0] > 0 and m[1] > 0 and "math" in m[2])]
    assert not flat, f"{path!r}: formulas not laid out as MathML: {flat[:5]}"
    assert len(images) >= min_images, f"{path!r}: {len(images)} images"
    broken = [i for i in images if not (i[1] and i[2] > 0)]
    assert not broken, f"{path!r}: images that did not load: {broken}"
    for raw in ("\\(", "\\[", "$$", "\\frac", ":func:`", ":class:`"):
        assert raw not in report["text"], f"{path!r}: raw {raw!r} left in the page text"
