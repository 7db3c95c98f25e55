"""Generated Markdown blocks: a table that a module makes from code or committed data, kept
between two markers of a committed file (the README's headline table, CONTRACTS.md's column
table), so the file can be rewritten (`--write`) or checked in a test (`--check`)."""
from __future__ import annotations

import sys
from pathlib import Path


def replace_block(text: str, start: str, end: str, block: str, path: str) -> str:
    """`text` with what lies between the markers replaced by `block` (a ValueError naming the
    file and the markers when they are missing)."""
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"{path}: no generated-block markers ({start} ... {end})")
    return text[:i] + start + "\n" + block + text[j:]


def write_or_check(path: str, start: str, end: str, block: str, prog: str, check: bool) -> int:
    """Rewrite the block of `path` (check False) or compare it (check True: exit 1 if stale,
    naming the command that fixes it); exit 2 with one line for an unreadable file or missing
    markers."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        new = replace_block(text, start, end, block, path)
    except (OSError, ValueError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if check:
        if new != text:
            print(f"{path}: the generated block is stale; run python -m {prog} --write {path}", file=sys.stderr)
            return 1
        return 0
    if new != text:
        p.write_text(new, encoding="utf-8")
    return 0
