"""smla: keep a sparse-MLA patch series alive on top of a pinned vLLM.

One module per concern. The library: project (where the files are: the
release lines lines/<release>/ and their work trees), pin (a line's
vllm-pin.txt), ids (commit ids and checksums), series (patches/), treeinfo
(facts about a work tree), treestate (does the tree equal the series?),
source (vLLM's sources: git, sdist, a mirror), cache (downloads), gitapply
(what `git apply` says), proc (every subprocess, git included), lock (one
writer per tree), fsutil, errors, report (JSON and tables), selection and
its child-process side (_selection_worker, _selection_standins: vLLM's own
backend selection; _import_worker: importing a tree's modules, for the
rebase's semantic check). The commands, which use the library and never
each other: fetch, apply, export, status, clean, lines, rebase/ (newline:
opening a line; verify: the semantic check), wheel/, explain (and its
output: explain_text, explain_dsv4). cli (with cli_options: the context
and shared options) only parses arguments and calls them.

`__version__` is the toolkit's one version number: pyproject.toml reads it
(dynamic version) and `smla --version` prints it.
"""

__version__ = "0.2.0"
