"""The command line's context and shared options: which checkout, line and work tree a command
works on (`--root`, `--line`, `--tree`, `-v`, accepted before or after the command name).

Part of the click layer (smla.cli): parses and holds, calls nothing.
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path

import click

from smla.project import LINE_ENV, TREE_ENV, Project


class Ctx:
    def __init__(self, root: Path | None, tree: Path | None, verbose: int, line: str | None = None):
        self._root = root
        self._tree = tree
        self._line = line
        self.verbose = verbose

    @functools.cached_property
    def project(self) -> Project:
        return Project.discover(self._root, self._line)

    @property
    def given_line(self) -> str | None:
        """The line `--line` named (None: $SMLA_LINE or the newest, as for a bare `smla`)."""
        return self._line

    @property
    def explicit_tree(self) -> Path | None:
        return self._tree.absolute() if self._tree else None

    @property
    def tree(self) -> Path:
        return (self._tree or self.project.default_tree).absolute()


pass_ctx = click.make_pass_decorator(Ctx)
tree_help = f"vLLM work tree (default: ${TREE_ENV}, else <root>/work/<line>/vllm)."
line_help = f"Release line to work on: lines/<RELEASE>/ (default: ${LINE_ENV}, else the newest line)."
root_help = "Toolkit checkout (default: $SMLA_ROOT, else found from the current directory)."
verbose_help = "Log every git/subprocess command (-v) and debug detail (-vv)."


def log_level(verbose: int) -> int:
    return logging.WARNING if not verbose else logging.INFO if verbose == 1 else logging.DEBUG


def _set_root(ctx, _param, value):
    if value is not None:
        ctx.ensure_object(Ctx)._root = value


def _set_line(ctx, _param, value):
    if value is not None:
        ctx.ensure_object(Ctx)._line = value


def _set_tree(ctx, _param, value):
    if value is not None:
        ctx.ensure_object(Ctx)._tree = value


def _add_verbose(ctx, _param, value):
    if value:
        c = ctx.ensure_object(Ctx)
        c.verbose += value
        logging.getLogger().setLevel(log_level(c.verbose))


def global_options(*, tree: bool = True):
    """--root, --line, --tree and -v on a subcommand too: `smla status --tree X` = `smla --tree X status`."""
    opts = [
        click.option("--root", type=click.Path(file_okay=False, path_type=Path), expose_value=False,
                     callback=_set_root, help=root_help),
        click.option("--line", metavar="RELEASE", expose_value=False, callback=_set_line, help=line_help),
        click.option("-v", "--verbose", count=True, expose_value=False, callback=_add_verbose, help=verbose_help),
    ]
    if tree:
        opts.append(click.option("--tree", type=click.Path(file_okay=False, path_type=Path), expose_value=False,
                                 callback=_set_tree, help=tree_help))

    def deco(fn):
        for opt in opts:
            fn = opt(fn)
        return fn

    return deco
