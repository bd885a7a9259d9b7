"""Griffe extension (mkdocs.yml, the mkdocstrings python handler's ``extensions``): the Sphinx roles of the
docstrings become cross-reference links on the API pages.

The docstrings of ``analyze`` name other objects the Sphinx way (``:func:`analyze```, ``:class:`~analyze.model.Result```,
``:mod:`.plots```); mkdocstrings would print the role as text (":func:" before the name). Here, once griffe has
loaded a package and before any docstring is parsed, each role is replaced by an autoref to the object's full
path, resolved as Sphinx does: ``~`` shows the last component only; a leading ``.`` is relative to the
docstring's package; a bare name is looked up in the docstring's scope (its class, its module and what that
imports), else taken as a full path. mkdocs-autorefs turns the autoref into a link where the site renders that
object, and into its name in code (the full path as a tooltip) where it does not (an internal module): never a
broken link, so ``mkdocs build --strict`` stays clean. The docstrings themselves are left as they are.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:mod|func|class|data|attr|meth|exc|obj|const|type):`(?P<target>[^`]+)`")


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and every object defined under it (aliases, i.e. imports, are left to where they are defined)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)  # type: ignore[arg-type]


def _find(collection: Any, path: str) -> str | None:
    """The full path of the object at ``path`` (an import's target path), or None when there is none."""
    try:
        found = collection[path]
    except (KeyError, ValueError, AttributeError, IndexError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    if found.is_alias:
        try:
            return found.final_target.path
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return found.target_path
    return found.path


def _resolve(obj: griffe.Object, target: str, collection: Any) -> str:
    """The full path that ``target`` (a role's target without ``~``) names in the scope of ``obj``."""
    module = obj if obj.is_module else obj.module
    if target.startswith("."):
        name = target.lstrip(".")
        package = module if module.is_package or module.parent is None else module.parent
        for base in (module, package):
            if found := _find(collection, f"{base.path}.{name}"):
                return found
        return f"{package.path}.{name}"
    head, _, rest = target.partition(".")
    try:
        scoped = obj.resolve(head)
    except griffe.NameResolutionError:
        scoped = None
    for candidate in ([f"{scoped}.{rest}" if rest else scoped] if scoped else []) + [target]:
        if found := _find(collection, candidate):
            return found
    return target


def link_roles(text: str, obj: griffe.Object, collection: Any) -> str:
    """``text`` with each Sphinx role replaced by an optional autoref to the object it names."""

    def one(m: re.Match[str]) -> str:
        target = m["target"].strip()
        short = target.startswith("~")
        target = target.lstrip("~!")
        shown = target.rsplit(".", 1)[-1] if short else target.lstrip(".")
        path = _resolve(obj, target, collection)
        return f'<autoref identifier="{html.escape(path)}" optional><code>{html.escape(shown)}</code></autoref>'

    return ROLE.sub(one, text)


class SphinxRoles(griffe.Extension):
    """Rewrites the docstrings of a loaded package: Sphinx roles to autorefs (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = link_roles(obj.docstring.value, obj, loader.modules_collection)
