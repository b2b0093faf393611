"""smla: keep a sparse-MLA patch series alive on top of a pinned vLLM.

One module per concern: pin, proc (every subprocess/git call), cache
(downloads), source (fetch), series (patch files), treestate (does the tree
equal the series?), lock (one writer per tree), apply, export, status,
rebase, wheel, explain, report; cli only parses arguments.

`__version__` is the toolkit's one version number: pyproject.toml reads it
(dynamic version) and `smla --version` prints it.
"""

__version__ = "0.2.0"
