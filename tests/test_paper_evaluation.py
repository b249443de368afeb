"""benchmarks/paper_evaluation.py never overwrites the shipped results unless asked, and draws
its figures beside its tables (issue 31)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "paper_evaluation.py"
SHIPPED = SCRIPT.parent / "results" / "paper_evaluation.json"


def _script():
    spec = importlib.util.spec_from_file_location("paper_evaluation", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shipped_results_need_force_and_out_is_required(capsys):
    ev = _script()
    before = SHIPPED.read_bytes()
    for argv in ([], ["--out", str(SHIPPED), "--markdown-only"]):
        with pytest.raises(SystemExit) as exc:
            ev.main(argv)
        assert exc.value.code == 2
    assert "pass --force" in capsys.readouterr().err
    assert SHIPPED.read_bytes() == before


def test_markdown_only_writes_tables_and_figures_beside_out(tmp_path):
    pytest.importorskip("matplotlib")
    ev = _script()
    out = tmp_path / "paper.json"
    shutil.copy(SHIPPED, out)
    assert ev.main(["--out", str(out), "--markdown-only"]) == 0
    assert out.with_suffix(".md").read_text().startswith("#")
    figures = sorted(p.name for p in tmp_path.glob("paper_*.svg"))
    assert "paper_gemma-3-27b_h100+a100.svg" in figures and len(figures) >= 2
