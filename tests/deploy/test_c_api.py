"""deploy/c builds against a real Paddle Inference C library when one is given by
PADDLE_INFERENCE_C_DIR (not installable here: skipped otherwise, never stubbed)."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIB_DIR = os.environ.get("PADDLE_INFERENCE_C_DIR", "")
HEADER = os.path.join(LIB_DIR, "paddle", "include", "pd_inference_api.h")


@pytest.mark.skipif(not os.path.isfile(HEADER), reason="set PADDLE_INFERENCE_C_DIR to an unpacked Paddle "
                                                      "Inference C library (deploy/c/README.md)")
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_c_program_builds_against_the_c_library(tmp_path):
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", os.path.join(ROOT, "deploy", "c"), "-B", str(build),
                    f"-DPADDLE_INFERENCE_C_DIR={LIB_DIR}"], check=True, capture_output=True, timeout=300)
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True, timeout=300)
    assert (build / "ppdlx_infer").is_file()
