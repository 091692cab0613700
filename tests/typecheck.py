"""mypy over the checkout, each module under the name it installs as: `python -m tests.typecheck`
(`make lint` runs it), with mypy's options after it if any.

mypy names a file after its folders, and reads no import hook, so it finds neither the rooms under
`hotswap` in the checkout (no folder hotswap/executor/) nor through an editable install (setuptools
maps them with an import hook). This gives mypy every module of the rooms as a source under its
installed name (tests/layout.py), beside what `[tool.mypy] files` names; the options and the config
are mypy's own. Its cache is kept apart from plain `mypy`'s, which cannot find the rooms: a module
cached by that run as unresolved would not be checked again here.
"""

from __future__ import annotations

import os
import sys
import time

from mypy import defaults, util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

from tests.layout import REPO, modules


def main(args: list[str]) -> int:
    began = time.time()
    fscache = FileSystemCache()
    sources, options = process_options(args, fscache=fscache)
    if options.cache_dir == defaults.CACHE_DIR:
        options.cache_dir = os.path.join(defaults.CACHE_DIR, "checkout")
    named = {source.module for source in sources}
    sources += [
        BuildSource(str(path), module, None, str(REPO)) for module, path in modules().items() if module not in named
    ]
    _, messages, blockers = run_build(sources, options, fscache, began, sys.stdout, sys.stderr)
    # What mypy's own main prints at the end, and its exit codes.
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    errors, notes, files = util.count_stats(messages)
    if errors:
        print(formatter.format_error(errors, files, len(sources), blockers=blockers, use_color=options.color_output))
    elif notes == len(messages):
        print(formatter.format_success(len(sources), options.color_output))
    if messages and notes < len(messages):
        return 2 if blockers else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
