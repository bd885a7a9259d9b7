"""mkdocs hook: the CLI reference (docs/reference/cli.md), generated from ``spectrace``'s argparse parser.

Generated at build time rather than committed: the page can never be stale, and engineers adding flags on
parallel branches do not collide in a generated file. The page's ``<!-- cli-reference -->`` line is replaced
by one section per verb (sub-verbs too): its usage, description and every option with its help and default.
"""

from __future__ import annotations

import argparse
import functools
import html
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- cli-reference -->"
PAGE = "reference/cli.md"


def _parser() -> argparse.ArgumentParser:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from analyze.cli import build_parser

    return build_parser()


def _subcommands(p: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each sub-command of ``p``, in the order they were added."""
    out = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            out += [(name, helps.get(name, ""), sp) for name, sp in action.choices.items()]
    return out


def _text(s: str) -> str:
    """Help text as Markdown: HTML-special characters and ``*`` escaped (intraword ``_`` is literal), `code` kept."""
    return html.escape(" ".join(s.split()), quote=False).replace("*", r"\*")


def _help(action: argparse.Action, prog: str) -> str:
    h = action.help or ""
    if "%" in h:
        params = dict(vars(action), prog=prog)
        if params.get("choices") is not None:
            params["choices"] = ", ".join(map(str, params["choices"]))
        h = h % params
    return h


def _option(action: argparse.Action, prog: str) -> str:
    if action.option_strings:
        shown = ", ".join(action.option_strings)
        if action.nargs != 0:
            if action.choices is not None:
                shown += " {" + ",".join(map(str, action.choices)) + "}"
            else:
                shown += f" {action.metavar or action.dest.upper()}"
    else:
        shown = action.metavar or action.dest
    line = f"- `{shown}`"
    help_text = _help(action, prog)
    if help_text:
        line += f": {_text(help_text)}"
    if action.required:
        line += " (required)"
    if (action.option_strings and action.default not in (None, False, argparse.SUPPRESS, [])
            and action.nargs != 0 and "default" not in help_text):
        line += f" (default: `{action.default}`)"
    return line


def _section(path: list[str], p: argparse.ArgumentParser, one_line: str, level: int) -> list[str]:
    p.formatter_class = functools.partial(argparse.HelpFormatter, width=100)
    out = [f"{'#' * level} `{' '.join(path)}`", ""]
    if one_line:
        out += [_text(one_line).rstrip(".") + ".", ""]
    out += ["```text", p.format_usage().strip(), "```", ""]
    if p.description and p.description != one_line:
        out += [_text(p.description), ""]
    actions = [a for a in p._actions
               if not isinstance(a, argparse._SubParsersAction | argparse._HelpAction) and a.help != argparse.SUPPRESS]
    if actions:
        out += [_option(a, p.prog) for a in actions] + [""]
    for name, help_text, sp in _subcommands(p):
        out += _section([*path, name], sp, help_text, min(level + 1, 6))
    return out


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The reference of every verb of ``parser`` (default: ``spectrace``'s) as Markdown."""
    parser = parser or _parser()
    out = []
    for name, help_text, sp in _subcommands(parser):
        out += _section([parser.prog, name], sp, help_text, 2)
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:  # the mkdocs hook
    if page.file.src_uri == PAGE:
        if MARKER not in markdown:
            raise ValueError(f"{PAGE} has lost its {MARKER} line: the generated reference has nowhere to go")
        return markdown.replace(MARKER, render())
    return markdown
