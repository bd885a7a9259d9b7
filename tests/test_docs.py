"""The documentation covers what the code offers: every verb, flag, ``--table`` name, finding code, diagnostic code
and JSON key is named in the hand-written pages (README.md and docs/), each derived from the code itself (the
argparse parser, the findings' RULES, the Diagnostic(...) calls, the JSON printed on bundled captures), so a new
flag or key fails here until it is documented. Also: the README stays a front page, every page is in the site's
nav, the generated CLI reference has every verb and flag, the API page has every public name.

"Named" means inside inline code or a code block (`--top`, ``span_p50_ns``), where a word cannot match by accident.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import json
import re
from pathlib import Path

import pytest

from analyze.cli import build_parser, main
from nvtx_hooks.capture import samples

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HOOK = DOCS / "hooks" / "cli_reference.py"
FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1", re.S | re.M)
INLINE = re.compile(r"(`+)(.+?)\1", re.S)
WORD = re.compile(r"--?[A-Za-z0-9][\w-]*|[A-Za-z_][\w]*")


def pages() -> list[Path]:
    """The hand-written pages (the CLI reference's generated part is not in its file)."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def code_words(text: str) -> set[str]:
    """Every word and flag inside code blocks and inline code of a Markdown text."""
    words = set()
    for m in FENCE.finditer(text):
        words |= set(WORD.findall(m.group(2)))
    for m in INLINE.finditer(FENCE.sub("", text)):
        words |= set(WORD.findall(m.group(2)))
    return words


@pytest.fixture(scope="module")
def documented() -> set[str]:
    return set().union(*(code_words(p.read_text(encoding="utf-8")) for p in pages()))


@pytest.fixture(scope="module")
def all_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in pages())


def test_code_words_reads_only_code():
    md = "a `--top N` and `span_ns`, not prose_word nor --prose\n\n```sh\nspectrace analyze --db X\n```\n"
    assert code_words(md) == {"--top", "N", "span_ns", "spectrace", "analyze", "--db", "X"}


# ---- the CLI -----------------------------------------------------------------------------------------------


def commands(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) of every verb and sub-verb."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                yield (*path, name), sp
                yield from commands(sp, (*path, name))


def flags(p: argparse.ArgumentParser) -> list[str]:
    return [s for a in p._actions if not isinstance(a, argparse._HelpAction)
            for s in a.option_strings if s.startswith("--")]


VERBS = list(commands(build_parser()))


def test_the_parser_is_walked():
    names = {" ".join(c) for c, _ in VERBS}
    assert {"analyze", "comm", "compare", "whatif", "report", "trace", "scrub", "hooks check"} <= names
    assert "--fail-if-slower" in flags(dict(VERBS)[("compare",)])


@pytest.mark.parametrize("command", [" ".join(c) for c, _ in VERBS])
def test_every_verb_is_documented(command, all_text):
    assert f"spectrace {command}" in all_text, f"`spectrace {command}` is in no page of docs/ or the README"


@pytest.mark.parametrize("command,flag", [(" ".join(c), f) for c, p in VERBS for f in flags(p)])
def test_every_flag_is_documented(command, flag, documented):
    assert flag in documented, f"spectrace {command} {flag} is named in no page of docs/ (inline code or a code block)"


def test_every_option_has_help():
    missing = [f"{' '.join(c)} {a.option_strings or a.dest}" for c, p in VERBS for a in p._actions
               if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction) and not a.help]
    assert not missing, f"options without help (the CLI reference is made of it): {missing}"


def test_every_table_is_documented(documented):
    from analyze.output.data import CSV_TABLES

    assert len(CSV_TABLES) >= 10
    assert not [t for t in CSV_TABLES if t not in documented]


# ---- codes -------------------------------------------------------------------------------------------------


def test_every_finding_code_is_documented(documented):
    from analyze.compute.findings import RULES

    codes = [r.code for r in RULES]
    assert "GAP_HOST_BOUND" in codes and len(codes) >= 10
    assert not [c for c in codes if c not in documented]


CODE = re.compile(r"^(?=.{4})[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$")  # COVERAGE, GPU_TAIL_LOST


def _strings(node: ast.AST) -> list[str]:
    """String constants an expression can take: a literal, either branch of ``a if c else b``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _strings(node.body) + _strings(node.orelse)
    return []


def diagnostic_codes() -> set[str]:
    """Codes of every diagnostic the package can emit, read from its source: the second argument of each call
    of ``Diagnostic`` or a helper whose name ends in ``diag`` (or ``code=``), and the codes of mappings of
    ``(CODE, message)`` pairs (the read warnings)."""
    codes = set()
    for f in sorted((ROOT / "analyze").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                fn = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if fn == "Diagnostic" or fn.lower().endswith("diag"):
                    args = node.args[1:2] + [k.value for k in node.keywords if k.arg == "code"]
                    codes |= {s for a in args for s in _strings(a)}
            elif isinstance(node, ast.Tuple) and len(node.elts) == 2:
                first = _strings(node.elts[0])
                if first and CODE.match(first[0]) and _strings(node.elts[1]):
                    codes.add(first[0])
    return {c for c in codes if CODE.match(c)}


def test_diagnostic_codes_are_found():
    codes = diagnostic_codes()
    # one of each way they are made: a literal, a conditional level, a helper (comm), the read-warnings table
    assert {"INCOMPLETE_COLLECTION", "COVERAGE", "COMM_NONE", "NON_UTF8_STRINGS", "GPU_TAIL_LOST"} <= codes
    assert len(codes) >= 30


def test_every_diagnostic_code_is_documented(documented):
    assert not sorted(c for c in diagnostic_codes() if c not in documented)


# ---- JSON keys ---------------------------------------------------------------------------------------------


def _keys(doc, out: set[str]) -> set[str]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.add(k)
            _keys(v, out)
    elif isinstance(doc, list):
        for v in doc:
            _keys(v, out)
    return out


def _json(*argv: str) -> dict:
    """The JSON document of ``spectrace ARGV --format json``, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*argv, "--format", "json"])
    assert rc == 0, err.getvalue()
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def json_docs() -> dict[str, dict]:
    node, base = str(samples.path("tp1_node")), str(samples.path("tp1_baseline"))  # with their manifests
    tp2, tp2_graph = str(samples.path("tp2_s3_node")), str(samples.path("tp2_s3_graph"))
    return {
        "analyze": _json("analyze", node, "-q"),
        "analyze --timing (two ranks)": _json("analyze", tp2, "--timing", tp2_graph, "-q"),
        "comm (two ranks)": _json("comm", tp2, "-q"),
        "compare": _json("compare", base, node),
        "whatif": _json("whatif", node),
    }


def test_every_json_key_is_documented(json_docs, documented):
    # keys that are data, not names: phase and seam names used as keys (whatif's cost_ns, seams_ns)
    names = {r["phase"] for d in json_docs.values() for r in d.get("phases", []) if isinstance(r, dict)}
    assert {"draft", "verify"} <= names
    missing = {}
    for verb, doc in json_docs.items():
        keys = {k for k in _keys(doc, set()) if re.fullmatch(r"[a-z][a-z0-9_]*", k) and k not in names}
        assert len(keys) > 10
        if miss := sorted(keys - documented):
            missing[verb] = miss
    assert not missing, f"JSON keys named in no page of docs/: {missing}"


# ---- the site ----------------------------------------------------------------------------------------------


def nav_pages() -> list[str]:
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:"):]
    return re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?([\w./-]+\.md)\s*(?:#.*)?$", nav, re.M)


def test_every_page_is_in_the_nav():
    listed = nav_pages()
    assert "index.md" in listed and "glossary.md" in listed
    assert not [p for p in listed if not (DOCS / p).is_file()]
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert not [p for p in on_disk if p not in listed], "a page under docs/ missing from mkdocs.yml's nav"


def _hook():
    spec = importlib.util.spec_from_file_location("cli_reference", HOOK)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli_reference_has_every_verb_and_flag():
    hook = _hook()
    assert hook.MARKER in (DOCS / hook.PAGE).read_text(encoding="utf-8")
    text = hook.render()
    for command, p in VERBS:
        assert f"`spectrace {' '.join(command)}`" in text
        for f in flags(p):
            assert re.search(rf"[` ]{re.escape(f)}[ ,`]", text), (command, f)


def test_api_page_has_every_public_name():
    import analyze

    api = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    targets = {t.rsplit(".", 1)[-1] for t in re.findall(r"^::: ([\w.]+)", api, re.M)}
    assert not [n for n in analyze.__all__ if n not in targets]


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200
    head = "\n".join(lines[:6])
    assert "make demo" in head and "make test" in head
