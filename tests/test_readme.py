import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_commands():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    return re.findall(r"```bash\n(.+?)\n```", text.split("## Everyday use")[0], re.S)


def test_ci_runs_exactly_the_readme_test_command():
    install_and_demo, tests = readme_commands()
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read().strip().splitlines()[-1]
    assert ci == tests
    assert "tools/train.py -c configs/demo/rn50_demo.yaml" in install_and_demo
    assert "tools/eval.py" in install_and_demo
