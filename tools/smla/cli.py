"""The `smla` command line: parse arguments, call the library, print.

Errors are caught once, here (`_Group.main` for click's usage errors,
`_handle_errors` inside each command): an SmlaError prints `error:` and
`hint:` on stderr, or one JSON object on stdout under --json, and exits with
its own code (see smla.errors). Click's usage errors become UsageError (2),
Ctrl-C and SIGTERM become Interrupted (130 / 143, after the scratch files
are removed), and an OSError nothing else caught becomes FilesystemError (15).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import re
import shlex
import signal
import sys
from pathlib import Path

import click

from smla import __version__, cache, lock, nospace, report, series
from smla import apply as apply_mod
from smla import clean as clean_mod
from smla import export as export_mod
from smla import fetch as fetch_mod
from smla import lines as lines_mod
from smla import status as status_mod
from smla.errors import FilesystemError, Interrupted, NotInSync, SmlaError, UsageError, cmd
from smla.cli_options import Ctx, global_options, line_help, log_level, pass_ctx, root_help, tree_help, verbose_help

# The signal that stopped the run (SIGINT for Ctrl-C, SIGTERM): its exit code is 128 + it.
_stopped_by = [signal.SIGINT]


def _on_sigterm(signum, _frame):
    _stopped_by[0] = signum
    raise KeyboardInterrupt  # unwinds like Ctrl-C: every `finally` (scratch worktrees, temp dirs) runs


def _emit(exc: SmlaError, as_json: bool) -> None:
    exc.hint = _on_the_given_line(exc.hint)
    if as_json:
        if not getattr(exc, "reported", False):
            click.echo(report.to_json(exc.to_dict()), nl=False)
        return
    click.secho(f"error: {exc.message}", fg="red", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)


def _on_the_given_line(hint: str | None) -> str | None:
    """A hint's `smla ...` commands on the line `--line` picked (make passes it; a bare `smla` works on
    $SMLA_LINE, else the newest line): `smla --line X ...`, unless the command names a line itself."""
    ctx = click.get_current_context(silent=True)
    c = ctx.find_object(Ctx) if ctx is not None else None
    if not hint or c is None or not c.given_line:
        return hint
    return re.sub(r"`smla (?!--line )", lambda _: f"`smla --line {shlex.quote(c.given_line)} ", hint)


def _as_smla_error(exc: BaseException) -> SmlaError:
    """What the edge reports for anything that is not an SmlaError yet."""
    if isinstance(exc, KeyboardInterrupt):
        sig = _stopped_by[0]
        err = Interrupted(f"interrupted ({signal.Signals(sig).name})", hint=getattr(exc, "hint", None))
        err.exit_code = 128 + int(sig)
        return err
    if isinstance(exc, OSError):
        return nospace.describe(exc)
    raise exc


def _handle_errors(fn):
    """Catch errors once: `error:` + `hint:` on stderr (or one JSON object on stdout under --json),
    exit with the error's code. Download progress is off under --json."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        as_json = bool(kwargs.get("as_json"))
        try:
            with cache.no_progress() if as_json else contextlib.nullcontext():
                return fn(*args, **kwargs)
        except SmlaError as exc:
            err = exc
        except (KeyboardInterrupt, OSError) as exc:
            err = _as_smla_error(exc)
        _emit(err, as_json)
        sys.exit(err.exit_code)

    return wrapper


class _Group(click.Group):
    """The top-level group: click's own usage errors (unknown options, bad values) go through the
    same edge as SmlaError, as JSON when --json was given; SIGTERM unwinds like Ctrl-C."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        argv = list(sys.argv[1:] if args is None else args)
        as_json = "--json" in argv
        try:
            before = signal.signal(signal.SIGTERM, _on_sigterm)
        except ValueError:  # not the main thread
            before = None
        try:
            rv = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
            if not standalone_mode:
                return rv
            sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)  # --help / --version: 0
        except click.exceptions.NoArgsIsHelpError as exc:  # bare `smla`: the help, as click prints it
            exc.show()
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            words = ["smla", *exc.ctx.command_path.split()[1:]] if getattr(exc, "ctx", None) else ["smla"]
            err: SmlaError = UsageError(exc.format_message(), hint=f"{cmd(*words, '--help')} lists the options")
        except click.exceptions.Abort:
            err = _as_smla_error(KeyboardInterrupt())
        except KeyboardInterrupt as exc:
            err = _as_smla_error(exc)
        finally:
            if before is not None:
                signal.signal(signal.SIGTERM, before)
        _emit(err, as_json)
        sys.exit(err.exit_code)


def _locked(fn):
    """Run the command holding the work tree's lock (smla.lock)."""
    @functools.wraps(fn)
    def wrapper(c, *args, **kwargs):
        with lock.hold(c.tree):
            return fn(c, *args, **kwargs)

    return wrapper


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), help=root_help)
@click.option("--line", metavar="RELEASE", help=line_help)
@click.option("--tree", type=click.Path(file_okay=False, path_type=Path), help=tree_help)
@click.option("-v", "--verbose", count=True, help=verbose_help)
@click.version_option(__version__, prog_name="smla")
@click.pass_context
def main(ctx, root, line, tree, verbose):
    """Keep the sparse-MLA patch series for vLLM applied, exported and rebased.

    Typical use: `smla patch` (fetch the line's pinned vLLM and apply its series),
    edit and commit in the work tree, `smla export`, `smla status`. Each release
    line lives in lines/<release>/ (pin + patches/); --line picks one (default:
    $SMLA_LINE, else the newest); `smla lines` lists them.
    --root, --line, --tree and -v go before or after the command name
    (`explain --tree` is explain's own option: give the work tree before `explain`).
    Cache: $SMLA_CACHE_DIR (default ~/.cache/vllm-sparse-mla).
    """
    logging.basicConfig(level=log_level(verbose), format="%(message)s", stream=sys.stderr)
    ctx.obj = Ctx(root, tree, verbose, line)


def _series(c: Ctx, *, allow_empty: bool = False) -> series.Series:
    return series.load(c.project.patches_dir, allow_empty=allow_empty)


@main.command()
@click.option("--source", "source_", default="auto", show_default=True, metavar="auto|git|sdist|PATH",
              help="Where vLLM comes from: the pin's git repo, the PyPI sdist of the pinned release, "
                   "a local checkout/mirror, or a local sdist file. `auto` tries git, then the sdist.")
@click.option("--force", is_flag=True,
              help="Replace an existing work tree (refused while it holds work not in patches/).")
@click.option("--discard", is_flag=True, help="With --force: replace it even if that loses unexported work.")
@global_options()
@pass_ctx
@_handle_errors
@_locked
def fetch(c: Ctx, source_, force, discard):
    """Make a git work tree of vLLM at the pinned commit (tag smla-base)."""
    fetch_mod.fetch(c.project, c.tree, source_, force=force, discard=discard, echo=click.echo)


@main.command("apply")
@click.option("--force", is_flag=True, help="Apply even though the tree has uncommitted changes.")
@click.option("--fuzz", type=click.IntRange(0, 2), default=0, show_default=True,
              help="Context lines per hunk edge allowed to differ.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
@global_options()
@pass_ctx
@_handle_errors
@_locked
def apply_cmd(c: Ctx, force, fuzz, as_json):
    """Apply patches/series to the work tree: all or nothing, one commit per patch.

    Rerunning is a no-op; patches whose change is already in the source are
    reported as `upstream` and skipped. When patches/ changed since the tree
    was built (and the tree holds no unexported commits), the patch commits
    are rebuilt from the base and the changed patches are named.
    """
    pin = c.project.pin()  # a broken pin is an error for every command, not only for fetch
    s = _series(c)
    echo = (lambda *_: None) if as_json else click.echo
    result = apply_mod.apply_series(s, c.tree, force=force, fuzz=fuzz, echo=echo, pin=pin)
    if as_json:
        click.echo(report.to_json(result.to_dict()), nl=False)
    elif result.changed:
        click.echo(f"patched tree: {c.tree}")


@main.command()
@click.option("--source", "source_", default="auto", show_default=True, metavar="auto|git|sdist|PATH",
              help="As for `fetch`.")
@click.option("--force", is_flag=True,
              help="As for `apply`: apply even though the tree has uncommitted changes (make patch ARGS=--force).")
@global_options()
@pass_ctx
@_handle_errors
@_locked
def patch(c: Ctx, source_, force):
    """fetch + apply: the pinned vLLM with the series applied (what `make patch` runs)."""
    s = _series(c)
    fetch_mod.fetch(c.project, c.tree, source_, echo=click.echo)
    apply_mod.apply_series(s, c.tree, force=force, echo=click.echo)
    click.echo(f"patched tree: {c.tree}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--check", is_flag=True,
              help=f"Exit {NotInSync.exit_code} unless the tree is at the pin and equals patches/ (for CI).")
@global_options()
@pass_ctx
@_handle_errors
def status(c: Ctx, as_json, check):
    """Base commit, per-patch state, local edits, and what to run next.

    Tells "patches/ is newer than the tree" (run `smla apply`) from "the tree
    has edits not yet exported" (run `smla export`) and from both.
    Exit 0; with --check, exit 7 unless tree and series agree.
    """
    s = _series(c, allow_empty=True)
    data = status_mod.status(c.project.pin(), c.tree, s)
    data["hint"] = _on_the_given_line(data.get("hint"))
    click.echo(report.to_json(data) if as_json else status_mod.text(data), nl=False)
    if check:
        status_mod.check(data)


@main.command()
@click.option("--allow-dirty", is_flag=True, help="Export even though uncommitted changes exist (they are not exported).")
@click.option("--prune", is_flag=True,
              help="Drop listed patches that no commit carries (e.g. merged upstream); refused otherwise.")
@click.option("--force", is_flag=True,
              help="Write the tree's commits even over patches changed in patches/ since the tree was built.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@global_options()
@pass_ctx
@_handle_errors
@_locked
def export(c: Ctx, allow_dirty, prune, force, as_json):
    """Regenerate patches/*.patch and patches/series from the commits above the base."""
    result = export_mod.export(c.tree, c.project.patches_dir, allow_dirty=allow_dirty, prune=prune, force=force,
                               pin=c.project.pin())
    data = result.to_dict()
    click.echo(report.to_json(data) if as_json else report.export_text(data), nl=False)


@main.command()
@click.option("--discard", is_flag=True, help="Remove it even if it holds work not in patches/.")
@global_options()
@pass_ctx
@_handle_errors
@_locked
def clean(c: Ctx, discard):
    """Remove the work tree (what `make clean` runs); refused while it holds work not in patches/."""
    removed = clean_mod.clean(c.project, c.tree, discard=discard)
    click.echo(f"removed {c.tree}" if removed else f"no work tree at {c.tree}; nothing to remove")


@main.command("build-wheel")
@click.option("--base-wheel", type=click.Path(dir_okay=False, path_type=Path),
              help="Official vLLM wheel of the pinned release to start from (default: from PyPI, cached).")
@click.option("--from-source", is_flag=True,
              help="Build through vLLM's setup.py (python-only: precompiled binaries from the official wheel).")
@click.option("--full-cuda-build", is_flag=True, help="With --from-source: compile csrc/ too (needs nvcc).")
@click.option("--python", "python", type=click.Path(dir_okay=False, path_type=Path),
              help="Interpreter for --from-source: an env with the pinned vLLM's torch (CUDA) and its build "
                   "requirements (default: this one).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Output directory (default: <root>/dist).")
@click.option("--allow-unexported", is_flag=True,
              help="Build even though the tree's commits differ from patches/ (the label may then lie).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@global_options()
@pass_ctx
@_handle_errors
@_locked
def build_wheel(c: Ctx, base_wheel, from_source, full_cuda_build, python, out_dir, allow_unexported, as_json):
    """A vLLM wheel with the series in it, version <release>+sparsemla.g<base commit>.<series hash>.

    Default: the official wheel with the changed vllm/ files swapped in
    (refused when the series touches csrc/ or build files: use --from-source).
    """
    from smla import wheel as wheel_mod

    s = series.load(c.project.patches_dir, allow_empty=True)
    echo = (lambda *_: None) if as_json else click.echo
    result = wheel_mod.build(c.project.pin(), s, c.tree, out_dir or c.project.dist_dir, from_source=from_source,
                             full_cuda=full_cuda_build, python=python, base_wheel=base_wheel,
                             allow_unexported=allow_unexported, quiet=as_json, echo=echo)
    data = result.to_dict()
    click.echo(report.to_json(data) if as_json else wheel_mod.summary_text(data), nl=False)


@main.command()
@click.option("--onto", metavar="COMMIT|VERSION",
              help="New base: an upstream commit id (fetched from the pin's repo or --source) "
                   "or a release version such as 0.17.0 (its PyPI sdist).")
@click.option("--continue", "continue_", is_flag=True, help="Resume after resolving a conflict.")
@click.option("--abort", is_flag=True, help="Undo a stopped rebase: tree, pin file and patches/ as before.")
@click.option("--source", "source_", default="auto", show_default=True, metavar="auto|git|sdist|PATH",
              help="Where commits come from (the pin's repo, or a local mirror PATH); also used to fetch "
                   "the pinned tree when it is missing.")
@click.option("--upstream-commit", metavar="SHA",
              help="Full commit id of a version target, when neither the sdist nor a mirror gives it.")
@click.option("--test/--no-test", "run_tests", default=True, show_default=True,
              help="After replaying, run the line's CPU tests against the rebased tree (the import and "
                   "selector checks always run).")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report.")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write <name>.{json,md,txt} there (remembered: --continue/--abort report there too).")
@click.option("--report-name", metavar="NAME",
              help="Report file name without suffix (default rebase-report; `auto`: rebase-<old>-to-<new>).")
@global_options()
@pass_ctx
@_handle_errors
@_locked
def rebase(c: Ctx, onto, continue_, abort, source_, upstream_commit, run_tests, as_json, report_dir, report_name):
    """Open a new release line from this one on a newer vLLM (three-way), or move this line to a commit.

    --onto VERSION opens lines/VERSION/ (pin + patches/) with its own tree
    work/VERSION/vllm and leaves this line untouched; --onto COMMIT keeps the
    release and rebases this line in place. After replaying, the result is
    checked semantically (imports, selector, the line's CPU tests).
    Exit 0: rebased and checked; 11: stopped on a conflict (resolve, then
    --continue, or --abort); 13: replayed but semantically broken; others:
    errors. See docs/rebase.md.
    """
    from smla import rebase as rebase_mod

    echo = (lambda *_: None) if as_json else click.echo
    result, written = rebase_mod.run(c.project, c.explicit_tree, onto=onto, continue_=continue_, abort=abort,
                                     source_spec=source_, upstream_commit=upstream_commit, run_tests=run_tests,
                                     report_dir=report_dir, report_name=report_name, echo=echo)
    if written and not as_json:
        click.echo(f"report: {', '.join(str(p) for p in written)}", err=True)
    err = result.error()  # a stop on a conflict, a failed --test
    if as_json:  # one JSON object: the report, with the error's `error` key when there is one
        data = result.to_dict()
        if err is not None:
            data.update(err.to_dict())
            err.reported = True
        click.echo(report.to_json(data), nl=False)
    else:
        click.echo(rebase_mod.text(result), nl=False)
    if err is not None:
        raise err


@main.command("lines")
@click.option("--diff", "show_diff", is_flag=True, help="Print the differences of the files the lines' series add.")
@click.option("--check", is_flag=True,
              help="Exit 6 when a file two lines add differs without a reason in lines/DIVERGENCE.")
@click.option("--newer-releases", is_flag=True,
              help="Only list the vLLM releases on the package index newer than every line, one a line.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@global_options(tree=False)
@pass_ctx
@_handle_errors
def lines_cmd(c: Ctx, show_diff, check, newer_releases, as_json):
    """The release lines (lines/<release>/): pin, series, work tree, whether it is in sync; and whether
    the files the series add are the same on every line (lines/DIVERGENCE allows, with reasons)."""
    if newer_releases:
        found = lines_mod.newer_releases(c.project)
        click.echo(report.to_json({"newer_releases": found}) if as_json else "".join(f"{v}\n" for v in found),
                   nl=False)
        return
    rows = lines_mod.overview(c.project)
    cmp = lines_mod.compare(c.project, with_diff=show_diff)
    if as_json:
        click.echo(report.to_json({"lines": rows, "added_files": cmp.to_dict()}), nl=False)
    else:
        click.echo(lines_mod.text(rows, cmp, show_diff=show_diff), nl=False)
    if check:
        lines_mod.check(c.project)


@main.command()
@click.option("--model", required=True, metavar="PRESET|CONFIG.json",
              help="A preset (glm-5, glm-5.3-flash, deepseek-v3.2, deepseek-v4) or a HuggingFace config.json.")
@click.option("--capability", default=None, metavar="MAJOR.MINOR|auto",
              help="CUDA compute capability, e.g. 12.0, 9.0, 8.6; auto = this machine's GPU.")
@click.option("--dtype", default="auto", show_default=True, type=click.Choice(["auto", "float16", "bfloat16"]),
              help="Model dtype; auto = the config's torch_dtype, as vLLM resolves it.")
@click.option("--kv-cache-dtype", default="auto", show_default=True,
              help="As vLLM's --kv-cache-dtype (auto, bfloat16, float16, fp8, fp8_e4m3, fp8_ds_mla, ...).")
@click.option("--heads", type=int, default=None, metavar="N",
              help="Attention heads per GPU (default: the config's num_attention_heads / --tp).")
@click.option("--tp", type=int, default=1, show_default=True, metavar="N",
              help="Tensor-parallel size: heads per GPU = num_attention_heads / N.")
@click.option("--tree", "tree_spec", default="patched", show_default=True, metavar="patched|pristine|PATH",
              help="patched: the work tree; pristine: its base (smla-base), exported to the cache; "
                   "PATH: any vLLM source tree.")
@click.option("--backend", default=None, metavar="NAME", help="Explicit backend, as vLLM's --attention-backend.")
@click.option("--matrix", is_flag=True,
              help="Instead of one case: every capability x dtype x KV-cache dtype x heads per GPU, as a table.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@global_options(tree=False)
@pass_ctx
@_handle_errors
def explain(c: Ctx, model, capability, dtype, kv_cache_dtype, heads, tp, tree_spec, backend, matrix, as_json):
    """Which attention backend vLLM picks for a sparse-MLA model, and why.

    Runs the tree's own selection code (mocked CUDA capability, stand-ins for
    compiled modules): every backend of the CUDA priority list, valid or not
    with vLLM's reasons, then the auto-selection or vLLM's error. DeepSeek-V4
    picks its kernels itself: its attention class, mHC, o_proj and CuTe DSL
    routes per value of the series' switch (VLLM_DSV4_PORTABLE on 0.26.0,
    --kernel-config deepseek_v4_kernels on 0.33.0). The selection runs in the
    line's Python (.venv-<release> where the line has one). See docs/explain.md.
    """
    from smla import explain as explain_mod

    c.project.pin()
    click.echo(explain_mod.run(c.tree, model, capability=capability, dtype=dtype, kv_cache_dtype=kv_cache_dtype,
                               heads=heads, tp=tp, tree_spec=tree_spec, backend=backend, matrix=matrix,
                               as_json=as_json, python=explain_mod.line_python(c.project)), nl=False)


if __name__ == "__main__":  # pragma: no cover
    main()
