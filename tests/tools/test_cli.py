"""tools/_cli.py: every tool that takes ``--report`` checks, before any work, that the report can be written (a
report under a regular file was a FileExistsError traceback after the whole evaluation); a report that still
cannot be written at the end is one line too."""
import importlib
import os
import subprocess
import sys

import pytest

from ppdlx.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")
NEVER = "/nonexistent/never_read"  # nothing may be read before the report path is checked

# Each tool with --report, with the arguments it requires (pointing at nothing: the check comes first).
TOOLS = {
    "train.py": ["-c", CONFIG, "-o", f"data.root={NEVER}"],
    "eval.py": ["-c", CONFIG, "-o", f"model.weights={NEVER}"],
    "export_model.py": ["-c", CONFIG, "-o", f"model.weights={NEVER}"],
    "quantize.py": ["-c", CONFIG, "-o", f"model.weights={NEVER}", "--calib-images", NEVER, "--output-dir", NEVER],
    "check_data.py": ["-c", CONFIG, "-o", f"data.root={NEVER}"],
    "model_info.py": ["-c", CONFIG],
    "infer.py": ["--image", NEVER],
    "prune_asp.py": ["--check", NEVER],
    "convert_weights.py": ["--from", "torchvision", NEVER + ".pth", "--model", "resnet50", "--output", NEVER],
    "benchmark.py": ["train", "-c", CONFIG],
}


def run_tool(name, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", name), *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def cli_module():
    tools = os.path.join(ROOT, "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    return importlib.import_module("_cli")


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_report_under_a_regular_file_is_one_line_before_any_work(tool, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory is needed\n")
    report = blocker / "sub" / "report.json"
    proc = run_tool(tool, *TOOLS[tool], "--report", report)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: --report {report}: {blocker} is a file, not a directory; choose another --report path")


def test_a_directory_as_report_is_refused(tmp_path):
    proc = run_tool("eval.py", *TOOLS["eval.py"], "--report", tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: --report {tmp_path}: is a directory; give a file name, e.g. {tmp_path / 'report.json'}")


def test_a_report_that_cannot_be_written_at_the_end_is_one_line(tmp_path):
    _cli = cli_module()
    blocker = tmp_path / "blocker"
    blocker.write_text("appeared while the tool ran\n")
    with pytest.raises(ConfigError) as err:
        _cli.write_report(str(blocker / "report.json"), {"top1": 0.5})
    assert str(err.value) == (f"--report {blocker / 'report.json'}: cannot write it (File exists: {blocker}); the "
                              f"results printed above were not saved: choose a writable --report path")
    assert sorted(os.listdir(tmp_path)) == ["blocker"]  # no temporary file left


def test_a_writable_report_is_written_in_new_folders(tmp_path):
    _cli = cli_module()
    path = tmp_path / "a" / "b" / "report.json"
    _cli.check_output_file("--report", str(path))
    assert not (tmp_path / "a").exists()  # the check creates nothing
    _cli.write_report(str(path), {"top1": 0.5})
    assert path.read_text() == '{\n  "top1": 0.5\n}'


def blocker_file(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("a file where a directory is needed\n")
    return blocker


# Before: each of these was a traceback (FileExistsError / NotADirectoryError) or an error after the whole run
# (evaluation, data scan, prediction), with the result lost; now one line before the config's model or data is read.
def test_an_output_directory_that_is_a_file_is_one_line_before_any_work(tmp_path):
    blocker = blocker_file(tmp_path)
    for tool, option in (("eval.py", "--analysis"), ("check_data.py", "--out")):
        proc = run_tool(tool, *TOOLS[tool], option, blocker)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == (
            f"error: {option} {blocker}: is a file, not a directory; choose a directory that can be written")


def test_an_output_directory_under_a_file_is_one_line_before_any_work(tmp_path):
    blocker = blocker_file(tmp_path)
    for tool, option in (("eval.py", "--analysis"), ("check_data.py", "--out")):
        proc = run_tool(tool, *TOOLS[tool], option, blocker / "sub")
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines()[-1] == (
            f"error: {option} {blocker / 'sub'}: {blocker} is a file, not a directory; choose another {option} path")


def test_a_default_output_directory_under_a_file_is_one_line_before_any_work(tmp_path):
    # eval's bare --analysis and check_data without --out write under global.output_dir
    blocker = blocker_file(tmp_path)
    proc = run_tool("eval.py", *TOOLS["eval.py"], f"global.output_dir={blocker}", "--analysis")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: --analysis {blocker / 'analysis'}: {blocker} is a file, not a directory; choose another --analysis "
        f"path")
    proc = run_tool("check_data.py", *TOOLS["check_data.py"], f"global.output_dir={blocker}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: --out {blocker}: is a file, not a directory; choose a directory that can be written")


def test_an_infer_output_under_a_file_or_a_directory_is_one_line_before_any_work(tmp_path):
    blocker = blocker_file(tmp_path)
    proc = run_tool("infer.py", *TOOLS["infer.py"], "--output", blocker / "x.csv")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: --output {blocker / 'x.csv'}: {blocker} is a file, not a directory; choose another --output path")
    proc = run_tool("infer.py", *TOOLS["infer.py"], "--output", tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: --output {tmp_path}: is a directory; give a file name, e.g. {tmp_path / 'predictions.csv'}")


@pytest.mark.parametrize("tool, option, value, minimum", [("check_data.py", "--samples", -3, 0),
                                                          ("quantize.py", "--num-images", 0, 1),
                                                          ("quantize.py", "--batch-size", -1, 1)])
def test_a_count_out_of_range_is_one_line_at_argument_parsing(tool, option, value, minimum):
    # Before: check_data drew nothing without a word; quantize refused them only after the fp32 export.
    proc = run_tool(tool, *TOOLS[tool], option, value)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == f"error: {option} {value}: must be {minimum} or more"


@pytest.mark.parametrize("tool, args", [("train.py", ["-c", CONFIG]), ("plot.py", [NEVER])])
def test_home_that_is_a_file_is_one_line(tmp_path, tool, args):
    # Before: 'import paddle' creates ~/.cache/paddle/dataset and every tool died in the import with a
    # NotADirectoryError traceback.
    home = tmp_path / "home"
    home.write_text("a file, not a directory\n")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", tool), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=dict(os.environ, HOME=str(home)))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: HOME={home} is a file, not a directory; Paddle (imported by every tool) and ppdlx keep their caches "
        f"in $HOME/.cache: set HOME to a writable directory")
