"""Every `Note [Title]` the tree names is written once (as in PyTorch's c10,
a tricky invariant carries a named note, referenced from every place that
depends on it). A reference to a note nobody wrote, or two notes under one
title, fails here, naming the files.

What counts as a note's definition: its title alone on a comment's (or a
docstring's) line, the note's text starting a sentence on the lines below,
the form to use:

    // Note [Resolve once, call resolved]
    // Dispatcher::resolve does ...

or its title opening a paragraph, followed by a colon and the text
(`// Note [Pool ids]: PyTorch's ...`).
A title has one definition: one heading, or, with no heading anywhere, one
paragraph that opens with it and a colon. With a heading, such a paragraph
elsewhere is a reference that restates the part its place depends on.
Every other mention is a reference: in any tracked text file, docs
included (docs refer to notes, they do not define them), wrapped over
lines or not; `Note [A directory may hold ...]` names the one title that
starts so.

Pure Python: no torch, no npubridge (run it with `--noconftest` to skip
tests/python/conftest.py, which imports both):

    python3 -m pytest -q -p no:cacheprovider --noconftest tests/python/test_notes.py
"""
import collections
import io
import os
import re
import subprocess
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Where a note may be written; references are read from these and from the docs.
SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".h", ".hpp", ".py", ".cmake", ".sh", "CMakeLists.txt")
DOC_SUFFIXES = (".md", ".txt")
SKIP_DIRS = {".git", "build", "__pycache__", ".venv"}

TITLE = re.compile(r"Note \[([^\]]+)\]")
# A comment line's leading marker: // or the * of a /* */ block in C and
# C++, # in Python, shell and CMake.
C_COMMENT = re.compile(r"^\s*(?://+|/?\*+(?!/))\s?")
HASH_COMMENT = re.compile(r"^\s*#+\s?")
# A line that opens with a note's title (after a comment marker, a
# docstring's quotes or a list's dash): (dash, title, colon, what follows).
OPENING = re.compile(r"^\s*(?://+|#+|/?\*+|[rRbBuU]?(?:\"\"\"|\'\'\'))?\s*(- )?Note \[([^\]]+)\](:?)\s*(\S?)")


def _files():
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        paths = out.split("\n")
    except (OSError, subprocess.CalledProcessError):  # not a checkout: every file below the root
        paths = []
        for top, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build-")]
            paths += [os.path.relpath(os.path.join(top, n), ROOT) for n in names]
    this_file = os.path.relpath(os.path.abspath(__file__), ROOT)  # its examples are no notes
    return [p for p in paths if p.endswith(SOURCE_SUFFIXES + DOC_SUFFIXES) and p != this_file]


def _docstring_lines(text):
    """The line numbers (0-based) inside Python string literals that span
    lines (docstrings): prose, as comments are."""
    lines = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                lines.update(range(tok.start[0] - 1, tok.end[0]))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return lines


class _Prose:
    """Which lines of one file are prose (comment or docstring text)."""

    def __init__(self, path, lines):
        self.lines = lines
        self.comment = HASH_COMMENT if path.endswith((".py", ".sh", ".cmake", ".txt")) else C_COMMENT
        self.docstring = _docstring_lines("\n".join(lines)) if path.endswith(".py") else set()

    def strip(self, line):
        return self.comment.sub("", line, count=1)

    def is_text(self, i):
        """Whether line i holds prose: a paragraph's line, not a blank one."""
        if i < 0 or i >= len(self.lines):
            return False
        line = self.lines[i]
        if i in self.docstring and not line.lstrip().startswith("#"):
            return bool(line.strip().strip("\"'"))
        m = self.comment.match(line)
        return bool(m) and bool(line[m.end():].strip().strip("/*"))

    def is_heading(self, i):
        """Whether line i, a title alone, heads the text below it rather than
        being a title a sentence wrapped onto a line of its own: the next line
        starts a sentence ("~~~" underlines a heading), and either the line
        above is no prose or that sentence starts with a capital."""
        if not self.is_text(i + 1):
            return False
        first = self.strip(self.lines[i + 1]).strip().lstrip("\"'")[:1]
        if first in "(),.;:]":
            return False
        return not self.is_text(i - 1) or first.isupper() or first.isdigit() or first in "`~"


def scan(files, read):
    """(definitions, references): title -> [(kind, "path:line")], kind
    "heading" or "colon"; title -> [path] for every mention."""
    definitions, references = collections.defaultdict(list), collections.defaultdict(list)
    for path in files:
        text = read(path)
        if text is None or "Note [" not in text:
            continue
        lines = text.split("\n")
        prose = _Prose(path, lines)
        if path.endswith(SOURCE_SUFFIXES):  # docs only refer to notes
            for i, line in enumerate(lines):
                m = OPENING.match(line)
                if not m:
                    continue
                dash, title, colon, rest = m.groups()
                if colon and (dash or not prose.is_text(i - 1)):
                    definitions[title].append(("colon", f"{path}:{i + 1}"))
                elif not colon and not rest and prose.is_heading(i):
                    definitions[title].append(("heading", f"{path}:{i + 1}"))
        joined = " ".join(prose.strip(line).strip() for line in lines)
        for m in TITLE.finditer(joined):
            references[" ".join(m.group(1).split())].append(path)
    return definitions, references


def problems(definitions, references):
    found = []
    defined = {}
    for title, places in sorted(definitions.items()):
        headings = [p for kind, p in places if kind == "heading"]
        if len(headings) > 1:
            found.append(f"Note [{title}] is written {len(headings)} times: {', '.join(headings)}")
        elif not headings and len(places) > 1:
            found.append(f"Note [{title}] opens {len(places)} paragraphs and none is its heading (write the "
                         f"note under a line of its own, `Note [{title}]`, and the others refer to it): "
                         + ", ".join(p for _, p in places))
        defined[title] = places
    for title, paths in sorted(references.items()):
        if title.endswith("..."):
            starts = [t for t in defined if t.startswith(title[:-3].rstrip())]
            if len(starts) != 1:
                found.append(f"Note [{title}] ({', '.join(sorted(set(paths)))}) must name the start of one "
                             f"note's title, found {len(starts)}: {starts}")
        elif title not in defined:
            found.append(f"Note [{title}] is named ({', '.join(sorted(set(paths)))}) but written nowhere")
    return found


def _read(path):
    try:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def test_every_note_named_is_written_once():
    definitions, references = scan(_files(), _read)
    assert len(definitions) > 50, "the scan found almost no notes: is ROOT the tree's root?"
    found = problems(definitions, references)
    assert not found, "\n".join(found)


def _check(files):
    definitions, references = scan(list(files), files.get)
    return problems(definitions, references)


def test_the_check_tells_a_definition_from_a_reference():
    files = {
        "a.cpp": "int x;\n\n// Note [Heading form]\n// The body, then a reference to Note [Colon form].\n"
                 "int f();  // Note [Heading form]\n",
        "b.h": "// Some text that names\n// Note [Heading form]\n// (a.cpp) in passing.\n\n"
               "// Note [Colon form]: the body.\n",
        "c.py": '"""Module.\n\nNote [Docstring heading]\nIts body.\n"""\n\n\ndef f():\n'
                '    """Note [Colon form]: a gloss; the note is in b.h."""\n',
        "d.md": "Note [Heading form]: a document restates it.\n\nSee Note [Wrapped\ntitle].\n",
        "e.cpp": "/*\n * Note [Wrapped title]\n * A C block comment.\n */\n"
                 "// Note [Heading\n// form] wraps in a reference.\n",
    }
    # c.py's docstring opens with the colon form too: Colon form has two
    # such paragraphs and no heading.
    assert _check(files) == ["Note [Colon form] opens 2 paragraphs and none is its heading (write the note "
                             "under a line of its own, `Note [Colon form]`, and the others refer to it): "
                             "b.h:5, c.py:9"]
    files["b.h"] = files["b.h"].replace("// Note [Colon form]: the body.", "// Note [Colon form]\n// The body.")
    assert _check(files) == []


def test_the_check_reports_a_missing_note_a_second_one_and_a_bad_abbreviation():
    files = {
        "a.cpp": "// Note [Twice]\n// One.\n\n// Note [Twice]\n// Two.\n\n// see Note [Nowhere]\n",
        "b.md": "Note [Tw ...] and Note [Nowhere ...]\n",
    }
    assert _check(files) == [
        "Note [Twice] is written 2 times: a.cpp:1, a.cpp:4",
        "Note [Nowhere] is named (a.cpp) but written nowhere",
        "Note [Nowhere ...] (b.md) must name the start of one note's title, found 0: []",
    ]
    files["a.cpp"] = files["a.cpp"].replace("// Note [Twice]\n// Two.", "// Note [Nowhere]\n// Two.")
    assert _check(files) == []
