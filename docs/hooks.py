"""MkDocs hook: the site's home page is the repository's README.md.

One text for both (GitHub shows the README, the site shows it as `index.md`), so the two cannot
drift. The README links to `docs/X.md` (right on GitHub); here they become `X.md`, which
`mkdocs build --strict` then checks like every other link. `docs/index.md` holds only a
pointer to this hook, for someone reading the folder.
"""

from __future__ import annotations

import re
from pathlib import Path


def on_page_read_source(page, config):
    if page.file.src_uri != "index.md":
        return None
    readme = Path(config["config_file_path"]).parent / "README.md"
    text = readme.read_text(encoding="utf-8")
    return re.sub(r"\]\(docs/", "](", text)
