"""smla: keep a sparse-MLA patch series alive on top of a pinned vLLM.

One module per concern: pin, proc (every subprocess/git call), cache
(downloads), source (fetch), series (patch files), apply, export, status,
rebase, wheel, explain, report; cli only parses arguments.
"""

__version__ = "0.1.0"
