"""matplotlib is optional (ppdlx[plot]): without it every report is still computed and written, figures are
skipped with one line, and drawing one on purpose says how to install it."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")
# an interpreter in which `import matplotlib` fails, as on an install without the plot extra
NO_MATPLOTLIB = "import sys; sys.modules['matplotlib'] = None\n"


def run_python(code, cwd):
    return subprocess.run([sys.executable, "-c", NO_MATPLOTLIB + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=600, cwd=str(cwd))


def test_analysis_without_matplotlib(tiny_tree, tmp_path):
    proc = run_python(f"""
        sys.path.insert(0, {ROOT!r})
        import ppdlx.analysis as analysis
        from ppdlx.analysis.figures import new_figure
        from ppdlx.errors import UnsupportedError
        print("available", analysis.plotting_available())
        result = analysis.classification_analysis([0, 1, 1], [[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]], None,
                                                  ["a", "b"], "cls")
        print("classification", sorted(result["files"]), result["errors"])
        print("curves", analysis.write_run_figures("."))
        try:
            new_figure(100, 100)
        except UnsupportedError as err:
            print("figure", err)
        print("loaded", "matplotlib" in sys.modules and sys.modules["matplotlib"] is not None)
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines == ["available False", "classification ['analysis.md'] 1", "curves []",
                     "figure figures need matplotlib, which is not installed: pip install 'ppdlx[plot]'",
                     "loaded False"]
    assert "| b | 1.0000 | 0.5000 | 0.6667 | 2 | a (1) |" in (tmp_path / "cls" / "analysis.md").read_text()


def test_check_data_tool_without_matplotlib(tiny_tree, tmp_path):
    argv = [os.path.join(ROOT, "tools", "check_data.py"), "-c", CONFIG, "--out", str(tmp_path / "out"), "-o",
            f"data.root={tiny_tree}", "data.backend=paddle", "model.num_classes=4"]
    proc = run_python(f"""
        import os, runpy
        sys.argv = {argv!r}
        sys.path.insert(0, os.path.dirname(sys.argv[0]))  # what `python tools/check_data.py` does
        runpy.run_path(sys.argv[0], run_name="__main__")
    """, ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "data_samples.png not drawn: matplotlib is not installed (pip install 'ppdlx[plot]')" in proc.stdout
    assert sorted(os.listdir(tmp_path / "out")) == ["data_report.md"]
    assert "| train | 64 | 4 | 16/16/16 | 1.0000 | 0 | 0 | 32x32 (most 32x32: 64) |" in \
        (tmp_path / "out" / "data_report.md").read_text()
