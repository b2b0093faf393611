"""The `smla` command line: parse arguments, call the library, print.

Errors are caught once, here: an SmlaError prints `error:` and `hint:` and
exits with its own code (see tools.errors).
"""
from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path

import click

from tools import apply as apply_mod
from tools import export as export_mod
from tools import report, series, source
from tools import status as status_mod
from tools.errors import SmlaError
from tools.project import Project


def _handle_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SmlaError as exc:
            click.secho(f"error: {exc.message}", fg="red", err=True)
            if exc.hint:
                click.echo(f"hint: {exc.hint}", err=True)
            sys.exit(exc.exit_code)

    return wrapper


class Ctx:
    def __init__(self, root: Path | None, tree: Path | None):
        self._root = root
        self._tree = tree

    @functools.cached_property
    def project(self) -> Project:
        return Project.discover(self._root)

    @property
    def tree(self) -> Path:
        return (self._tree or self.project.default_tree).absolute()


pass_ctx = click.make_pass_decorator(Ctx)
tree_help = "vLLM work tree (default: <root>/work/vllm, or $SMLA_TREE)."


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), help="Toolkit checkout (default: found from cwd).")
@click.option("--tree", type=click.Path(file_okay=False, path_type=Path), help=tree_help)
@click.option("-v", "--verbose", count=True, help="Log every git/subprocess command (-v) and debug detail (-vv).")
@click.version_option(package_name="vllm-sparse-mla")
@click.pass_context
def main(ctx, root, tree, verbose):
    """Keep the sparse-MLA patch series for vLLM applied, exported and rebased.

    Typical use: `smla patch` (fetch the pinned vLLM and apply patches/series),
    edit and commit in the work tree, `smla export`, `smla status`.
    Cache: $SMLA_CACHE_DIR (default ~/.cache/vllm-sparse-mla).
    """
    level = logging.WARNING if not verbose else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    ctx.obj = Ctx(root, tree)


@main.command()
@click.option("--source", "source_", default="auto", show_default=True, metavar="auto|git|sdist|PATH",
              help="Where vLLM comes from: the pin's git repo, the PyPI sdist of the pinned release, "
                   "a local checkout/mirror, or a local sdist file. `auto` tries git, then the sdist.")
@click.option("--force", is_flag=True, help="Replace an existing work tree that is at another commit.")
@pass_ctx
@_handle_errors
def fetch(c: Ctx, source_, force):
    """Make a git work tree of vLLM at the pinned commit (tag smla-base)."""
    source.fetch(c.project.pin(), c.tree, source_, force=force, echo=click.echo)


@main.command("apply")
@click.option("--force", is_flag=True, help="Apply even though the tree has uncommitted changes.")
@click.option("--fuzz", type=click.IntRange(0, 2), default=0, show_default=True,
              help="Context lines per hunk edge allowed to differ.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
@pass_ctx
@_handle_errors
def apply_cmd(c: Ctx, force, fuzz, as_json):
    """Apply patches/series to the work tree: all or nothing, one commit per patch.

    Rerunning is a no-op; patches whose change is already in the source are
    reported as `upstream` and skipped.
    """
    s = series.load(c.project.patches_dir)
    echo = (lambda *_: None) if as_json else click.echo
    result = apply_mod.apply_series(s, c.tree, force=force, fuzz=fuzz, echo=echo)
    if as_json:
        click.echo(report.to_json(result.to_dict()), nl=False)
    elif result.changed:
        click.echo(f"patched tree: {c.tree}")


@main.command()
@click.option("--source", "source_", default="auto", show_default=True, metavar="auto|git|sdist|PATH",
              help="As for `fetch`.")
@pass_ctx
@_handle_errors
def patch(c: Ctx, source_):
    """fetch + apply: the pinned vLLM with the series applied (what `make patch` runs)."""
    s = series.load(c.project.patches_dir)
    source.fetch(c.project.pin(), c.tree, source_, echo=click.echo)
    apply_mod.apply_series(s, c.tree, echo=click.echo)
    click.echo(f"patched tree: {c.tree}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@_handle_errors
def status(c: Ctx, as_json):
    """Base commit, applied patches, and local edits not yet exported."""
    s = series.load(c.project.patches_dir, allow_empty=True)
    data = status_mod.status(c.project.pin(), c.tree, s)
    click.echo(report.to_json(data) if as_json else report.status_text(data), nl=False)


@main.command()
@click.option("--allow-dirty", is_flag=True, help="Export even though uncommitted changes exist (they are not exported).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
@_handle_errors
def export(c: Ctx, allow_dirty, as_json):
    """Regenerate patches/*.patch and patches/series from the commits above the base."""
    result = export_mod.export(c.tree, c.project.patches_dir, allow_dirty=allow_dirty)
    data = result.to_dict()
    click.echo(report.to_json(data) if as_json else report.export_text(data), nl=False)


if __name__ == "__main__":  # pragma: no cover
    main()
