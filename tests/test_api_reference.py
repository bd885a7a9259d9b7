"""The API reference (docs/reference/api.md) shows the docstrings' Sphinx roles as links, not as text.

docs/hooks/sphinx_roles.py (a griffe extension named in mkdocs.yml) rewrites each ``:func:`x``` and kin into an
autoref at build time. The fast tests load the package with griffe as mkdocstrings does (they need the docs extra:
``pip install -e '.[docs]'``, as CI has); the ``slow`` one builds the whole site with ``--strict`` (CI:
``make test-all``).
"""

from __future__ import annotations

import importlib.util
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "docs" / "hooks" / "sphinx_roles.py"
RAW_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`")  # what Sphinx would read as a role; mkdocs prints it as text


def _griffe():
    return pytest.importorskip("griffe", reason="needs the docs extra: pip install -e '.[docs]'")


def _extension():
    spec = importlib.util.spec_from_file_location("sphinx_roles", HOOK)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _docstrings(obj):
    """(path, docstring text) of ``obj`` and every object defined under it."""
    if obj.docstring is not None:
        yield obj.path, obj.docstring.value
    for m in obj.members.values():
        if not m.is_alias:
            yield from _docstrings(m)


def _load(griffe, name, search):
    return griffe.load(name, search_paths=[str(search)], docstring_parser="sphinx",
                       extensions=griffe.load_extensions(_extension().SphinxRoles))


def test_roles_resolve_as_sphinx_does(tmp_path):
    """``~`` keeps the last component, ``.x`` is relative to the package, a bare name is looked up in the
    docstring's scope (class members, the module's names and imports), a full path is taken as it is."""
    griffe = _griffe()
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Parts: :mod:`.sub`, :mod:`.sub.leaf`."""\n')
    (pkg / "sub" / "__init__.py").write_text('"""The sub package."""\n')
    (pkg / "sub" / "leaf.py").write_text(textwrap.dedent('''\
        """Leaf: :class:`~pkg.sub.leaf.Thing` and :func:`helper`; :data:`LIMIT`; :mod:`.leaf`."""
        from pkg.other import far as near

        LIMIT = 3
        """A bound."""


        def helper():
            """Uses :func:`near` (an import) and :class:`Thing`; :func:`nowhere.at.all` is unknown."""


        class Thing:
            """Its :attr:`size` and :meth:`grow`; :exc:`ValueError`."""

            size: int = 1
            """How big."""

            def grow(self):
                """See :py:func:`helper`."""
        '''))
    (pkg / "other.py").write_text('def far():\n    """Far away."""\n')
    loaded = _load(griffe, "pkg", tmp_path)

    def refs(path):
        return re.findall(r'<autoref identifier="([^"]+)" optional><code>([^<]+)</code></autoref>',
                          loaded[path].docstring.value)

    assert re.findall(r'identifier="([^"]+)"', loaded.docstring.value) == ["pkg.sub", "pkg.sub.leaf"]
    assert refs("sub.leaf") == [("pkg.sub.leaf.Thing", "Thing"), ("pkg.sub.leaf.helper", "helper"),
                                ("pkg.sub.leaf.LIMIT", "LIMIT"), ("pkg.sub.leaf", "leaf")]
    assert refs("sub.leaf.helper") == [("pkg.other.far", "near"), ("pkg.sub.leaf.Thing", "Thing"),
                                       ("nowhere.at.all", "nowhere.at.all")]
    assert refs("sub.leaf.Thing") == [("pkg.sub.leaf.Thing.size", "size"), ("pkg.sub.leaf.Thing.grow", "grow"),
                                      ("ValueError", "ValueError")]
    assert refs("sub.leaf.Thing.grow") == [("pkg.sub.leaf.helper", "helper")]


@pytest.mark.parametrize("package", ["analyze", "nvtx_hooks"])
def test_no_docstring_keeps_a_raw_role(package):
    """Every role form the code base writes is one the extension knows (none is left to print as text)."""
    griffe = _griffe()
    loaded = _load(griffe, package, ROOT)
    left = [(path, m.group()) for path, text in _docstrings(loaded) for m in RAW_ROLE.finditer(text)]
    assert not left, left
    assert sum(text.count("<autoref ") for _, text in _docstrings(loaded)) > (50 if package == "analyze" else 0)


@pytest.mark.slow
def test_api_pages_show_links_not_roles(tmp_path):
    """The built site (mkdocs build --strict, as CI builds it): no raw role on any page, and the roles of the
    API reference are links to the objects it renders."""
    pytest.importorskip("mkdocs", reason="needs the docs extra: pip install -e '.[docs]'")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    site = tmp_path / "site"
    build(load_config(str(ROOT / "mkdocs.yml"), site_dir=str(site), strict=True))
    pages = {p.relative_to(site).as_posix(): p.read_text() for p in site.rglob("*.html")}
    raw = {name: re.findall(r".{40}:[a-z]+:<code>[^<]*</code>", text) for name, text in pages.items()}
    assert not any(raw.values()), {k: v for k, v in raw.items() if v}
    api = pages["reference/api/index.html"]
    assert 'href="#analyze.api.analyze"><code>analyze</code></a>' in api  # :func:`analyze` in comm's docstring
