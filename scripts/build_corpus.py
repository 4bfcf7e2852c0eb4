"""Build the bundled demo corpus from the prose that ships with CPython itself.

    python scripts/build_corpus.py payload/data/corpus.txt.gz

The text is the standard library's docstrings, the pydoc topic pages and IDLE's text files (PSF License, free to
redistribute). Interactive examples and code-only lines are dropped so that what is left reads as
prose. Documents are separated by blank lines; output is deterministic for a given CPython.
"""

from __future__ import annotations

import ast
import gzip
import pathlib
import re
import sys
import sysconfig

_CODE_LINE = re.compile(r"^\s*(>>>|\.\.\.|[$%]|[\w.]+\(.*\)\s*$|[{}\[\]()<>=#|+*-]+\s*$)")


def _prose(text: str) -> str:
    lines = [line.rstrip() for line in text.splitlines() if not _CODE_LINE.match(line)]
    paragraphs = re.split(r"\n\s*\n", "\n".join(lines))
    # One document per docstring; a paragraph inside is joined into one line so the file works
    # both as blank-line separated documents and, line by line, as paragraphs.
    joined = [" ".join(p.split()) for p in paragraphs]
    return "\n".join(p for p in joined if len(p) >= 40)


def docstrings(stdlib: pathlib.Path):
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    yield doc


def topics():
    from pydoc_data.topics import topics as pages

    for key in sorted(pages):
        yield pages[key]


def text_files(stdlib: pathlib.Path):
    # IDLE's help and news files are plain prose, paragraph per blank line.
    for path in sorted((stdlib / "idlelib").glob("*.txt")):
        yield from re.split(r"\n\s*\n\s*\n", path.read_text(encoding="utf-8", errors="replace"))


def main(out: str) -> None:
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    seen: set[str] = set()
    documents = []
    for text in (*docstrings(stdlib), *topics(), *text_files(stdlib)):
        doc = _prose(text)
        if len(doc) >= 80 and doc not in seen:
            seen.add(doc)
            documents.append(doc)
    data = "\n\n".join(documents) + "\n"
    with gzip.GzipFile(out, "wb", mtime=0) as f:
        f.write(data.encode("utf-8"))
    print(f"{len(documents)} documents, {len(data) / 1e6:.2f} MB -> {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "payload/data/corpus.txt.gz")
