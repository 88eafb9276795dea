"""The fault battery (tools/fault_battery.py) judges by explicit checks: each verdict is reached by a real
subprocess doing exactly that, a few real cases keep their verdicts, and the report carries the counts."""
import json
import os
import sys

import pytest

from tools.reliability import all_cases
from tools.reliability.battery import DATA_LOSS, GOOD, SILENT, WEAK, Case, Run, counts, run_battery
from tools.reliability.report import write_reports
from tools.reliability.workspace import Fixtures, case_context_factory

QUIET = lambda line: None  # noqa: E731


def _synthetic(name, code, expect="error", check=None, mentions=("thing.bin",), protect=False, timeout=60):
    """A case whose 'tool' is ``python -c code`` (``{target}``: a file the case wrote, optionally protected)."""
    def prepare(ctx):
        target = ctx.path("thing.bin")
        with open(target, "w") as f:
            f.write("good\n")
        return Run([sys.executable, "-c", code.format(target=target)], mentions=list(mentions),
                   protect=[target] if protect else [])
    return Case(name, "test", "python -c", "synthetic", prepare, expect=expect, check=check, timeout=timeout)


ONE_LINE = "import sys; sys.stderr.write('error: {target}: damaged; replace it\\n'); sys.exit(2)"
SYNTHETIC = [
    (_synthetic("one_line", ONE_LINE), GOOD, "one line naming thing.bin"),
    (_synthetic("traceback", "raise ValueError('{target} is bad; replace it')"), WEAK, "traceback"),
    (_synthetic("unnamed", "import sys; sys.stderr.write('error: it failed; fix it\\n'); sys.exit(2)"), WEAK,
     "the message does not name 'thing.bin'"),
    (_synthetic("no_fix", "import sys; sys.stderr.write('error: {target}: bad\\n'); sys.exit(2)"), WEAK,
     "the message says no fix"),
    (_synthetic("exit_0", "print('all fine')"), SILENT, "exit 0: the fault went unreported"),
    (_synthetic("overwrites", "open('{target}', 'w').write('bad'); " + ONE_LINE, protect=True), DATA_LOSS,
     "thing.bin overwritten (1 protected file(s))"),
    (_synthetic("hangs", "import time; time.sleep(60)", timeout=2), WEAK, "no answer within 2 s"),
    (_synthetic("ok_but_wrong", "print('done')", expect="ok", check=lambda ctx, run, res: (False, "wrong output")),
     SILENT, "wrong output"),
    (_synthetic("ok_and_right", "print('done')", expect="ok", check=lambda ctx, run, res: ("done" in res.stdout,
                                                                                          "checked")), GOOD, "checked"),
    (_synthetic("ok_refused", ONE_LINE, expect="ok", check=lambda ctx, run, res: (True, "")), WEAK,
     "refused (exit 2) where it should succeed"),
]


def test_each_verdict_comes_from_its_check(tmp_path):
    cases = [case for case, _, _ in SYNTHETIC]
    outcomes = run_battery(cases, case_context_factory(Fixtures(str(tmp_path / "base")), str(tmp_path / "cases")),
                           jobs=2, progress=QUIET)
    got = [(o.case.name, o.verdict, o.reason) for o in outcomes]
    assert got == [(case.name, verdict, reason) for case, verdict, reason in SYNTHETIC]
    assert outcomes[0].message.startswith("error: ") and outcomes[0].message.endswith("thing.bin: damaged; "
                                                                                      "replace it")
    assert counts(outcomes) == {GOOD: 2, WEAK: 5, SILENT: 2, DATA_LOSS: 1, "SETUP": 0}


def test_the_battery_covers_issue_15_with_at_least_40_cases():
    names = [case.name for case in all_cases()]
    assert len(names) >= 40 and len(set(names)) == len(names)
    for required in ("kill_during_save_1", "resume_auto_latest_missing", "fresh_start_over_checkpoints",
                     "resume_other_model_without_pdopt", "train_lr_1e6_dynamic", "export_nan_weights",
                     "zero_byte_jpeg_dali_error", "empty_class_folder", "val_missing_class", "val_folder_renamed",
                     "all_images_unreadable_dali", "yaml_duplicate_keys", "coco_no_width_height",
                     "coco_json_truncated", "train_output_dir_unwritable", "two_trainings_one_output_dir",
                     "deploy_truncated_pdiparams", "deploy_truncated_inference_yml", "deploy_truncated_onnx"):
        assert required in names


def test_the_battery_covers_issue_41():
    names = [case.name for case in all_cases()]
    for required in ("coco_file_name_outside_image_folder", "coco_file_name_outside_error",
                     "check_data_coco_file_name_outside", "coco_duplicate_annotation_ids_val",
                     "check_data_coco_area_not_a_number", "infer_classifier_huge_png", "infer_detector_huge_png",
                     "quantize_huge_png_calib_image", "deploy_huge_png", "check_data_huge_png_paddle",
                     "train_huge_png_paddle_workers0", "train_huge_png_paddle_workers1", "train_huge_png_dali",
                     "output_dir_link_to_another_run_resume_never", "output_dir_inside_data_root",
                     "export_after_a_killed_export", "plot_empty_metrics", "plot_binary_metrics",
                     "convert_truncated_torch_zip", "home_is_a_file"):
        assert required in names


# Cheap real cases (no training fixture): what they check is settled behaviour, so their verdicts are fixed.
# The last three (issue 41) were a traceback each before.
REAL = ["override_unknown_key", "config_file_missing", "missing_data_root", "convert_truncated_safetensors",
        "plot_binary_metrics", "convert_truncated_torch_zip", "home_is_a_file"]


@pytest.fixture(scope="module")
def real_outcomes(tmp_path_factory):
    base = tmp_path_factory.mktemp("battery")
    cases = [case for case in all_cases() if case.name in REAL]
    return base, run_battery(cases, case_context_factory(Fixtures(str(base / "base")), str(base / "cases")), jobs=2,
                             progress=QUIET)


def test_real_cases_keep_their_verdicts(real_outcomes):
    _, outcomes = real_outcomes
    assert sorted((o.case.name, o.verdict, o.code) for o in outcomes) == sorted((name, GOOD, 2) for name in REAL)
    by_name = {o.case.name: o for o in outcomes}
    assert by_name["override_unknown_key"].message == ("error: -o: train.epoch: unknown key (value 3); did you mean "
                                                       "'train.epochs'?")
    assert by_name["convert_truncated_safetensors"].message.endswith(
        "model.safetensors: file ends inside tensor 'fc.weight' (truncated download?)")
    assert by_name["plot_binary_metrics"].message.endswith("/run/metrics.jsonl: no metrics record in it (64 bytes, "
                                                           "binary, no line a JSON object with a 'step'); give a run "
                                                           "directory whose training logged a step")
    assert by_name["convert_truncated_torch_zip"].message.endswith(
        "model.pth: a zip archive (PyTorch's checkpoint format) without its end, the zip's central directory: the "
        "file is cut short (an interrupted download or copy?); fetch or copy it again")
    assert by_name["home_is_a_file"].message.endswith(
        "/home is a file, not a directory; Paddle (imported by every tool) and ppdlx keep their caches in "
        "$HOME/.cache: set HOME to a writable directory")


def test_the_report_has_a_row_per_case_and_the_counts(real_outcomes, tmp_path):
    _, outcomes = real_outcomes
    (tmp_path / "reliability.md").write_text("# an older report\n\n| 1 | `x` |\n\n## Security\nby hand\n")
    write_reports(outcomes, str(tmp_path / "reliability.md"), seconds=60.0, jobs=2)
    json_path = write_reports(outcomes, str(tmp_path / "reliability.md"), seconds=60.0, jobs=2)
    text = (tmp_path / "reliability.md").read_text()
    assert text.endswith("|\n\n## Security\nby hand\n") and "older" not in text  # the hand-written part kept
    assert f"**{len(REAL)} cases: GOOD {len(REAL)}, WEAK 0, SILENT 0, DATA-LOSS 0.**" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "| `" in line]
    assert len(rows) == len(REAL) and all("| **GOOD** |" in row for row in rows)
    with open(json_path) as f:
        report = json.load(f)
    assert report["counts"][GOOD] == len(REAL) and [c["name"] for c in report["cases"]] == \
        [o.case.name for o in outcomes]
    assert os.path.basename(json_path) == "reliability.json"
