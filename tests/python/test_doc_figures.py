"""The benchmark tables of README.md and docs/*.md are the committed results'
(bench/tables.py writes them from bench/results/*.json): a results file
changed without `python3 bench/tables.py`, or a table edited by hand, fails
here, naming the table.

Pure Python: no torch, no npubridge (run it with `--noconftest` to skip
tests/python/conftest.py, which imports both):

    python3 -m pytest -q -p no:cacheprovider --noconftest tests/python/test_doc_figures.py
"""
import importlib.util
import io
import json
import os
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tables():
    spec = importlib.util.spec_from_file_location("npub_bench_tables", os.path.join(ROOT, "bench", "tables.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tables = _tables()


def _check(root):
    out, err = io.StringIO(), io.StringIO()
    rc = tables.run(root, check=True, out=out, err=err)
    return rc, err.getvalue()


def test_every_benchmark_table_is_the_committed_results():
    rc, err = _check(ROOT)
    assert rc == 0, f"stale or broken benchmark tables (run `python3 bench/tables.py`):\n{err}"


def test_every_results_table_has_a_region_in_the_documents():
    text = "".join(open(p, encoding="utf-8").read() for p in tables.documents(ROOT))
    for name, (src, _) in tables.TABLES.items():
        assert tables.BEGIN.format(name) in text, f"no generated table for {src} in README.md or docs/"


@pytest.fixture
def tree(tmp_path):
    """A copy of the documents and results, to break on purpose."""
    for pattern in tables.DOC_GLOBS + ("bench/results/*.json",):
        for p in tables.glob.glob(os.path.join(ROOT, pattern)):
            dst = tmp_path / os.path.relpath(p, ROOT)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(p, dst)
    return tmp_path


def test_a_changed_result_makes_its_table_stale(tree):
    path = tree / "bench/results/cann.json"
    data = json.loads(path.read_text())
    data["results"][0]["ratio"] += 0.5
    path.write_text(json.dumps(data))
    rc, err = _check(str(tree))
    assert rc == 1
    assert "docs/in-tree-plugins.md: bench-table 'cann' differs from bench/results/cann.json" in err
    assert "'graph'" not in err and "'dist'" not in err
    # Regenerating makes it current again.
    assert tables.run(str(tree), check=False, out=io.StringIO(), err=io.StringIO()) == 0
    assert _check(str(tree)) == (0, "")


def test_a_table_edited_by_hand_is_stale(tree):
    readme = tree / "README.md"
    text = readme.read_text()
    begin = text.index(tables.BEGIN.format("graph"))
    readme.write_text(text[:begin] + text[begin:].replace(" ms |", " ms (faster) |", 1))
    rc, err = _check(str(tree))
    assert rc == 1 and "README.md: bench-table 'graph' differs" in err


def test_a_missing_results_file_or_key_is_named(tree):
    (tree / "bench/results/dist.json").unlink()
    rc, err = _check(str(tree))
    assert rc == 2 and "bench/results/dist.json: missing" in err
    (tree / "bench/results/dist.json").write_text(json.dumps({"allreduce": []}))
    rc, err = _check(str(tree))
    assert rc == 2 and "bench/results/dist.json: no config" in err


def test_broken_markers_are_errors(tree):
    doc = tree / "docs/in-tree-plugins.md"
    text = doc.read_text()
    doc.write_text(text.replace(tables.END.format("cann"), ""))
    rc, err = _check(str(tree))
    assert rc == 2 and "docs/in-tree-plugins.md: bench-table 'cann' has no end marker" in err
    doc.write_text(text + "\n<!-- bench-table:nosuch begin -->\n<!-- bench-table:nosuch end -->\n")
    rc, err = _check(str(tree))
    assert rc == 2 and "unknown bench-table 'nosuch'" in err


def test_no_memory_bound_row_claims_a_share_of_a_ceiling():
    # bench/machine_ceiling.h: the memory probe is no bound on what the
    # kernels reach (the committed run's add/mul reached about twice it).
    data = json.load(open(os.path.join(ROOT, "bench/results/cann.json")))
    text = tables.cann_table(data, "bench/results/cann.json")
    rows = [line for line in text.splitlines() if "GB/s |" in line]
    assert rows and all(line.rstrip().endswith("| n/a |") for line in rows), rows
