"""The plot extra: matplotlib is optional for the package, and the README's commands (a) and (b) install it."""
import os
import re

import setuptools  # noqa: F401  (first: `distutils` is then setuptools' own, on every Python version)
from distutils.core import run_setup  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_matplotlib_is_the_plot_extra_not_a_requirement():
    dist = run_setup(os.path.join(ROOT, "setup.py"), stop_after="init")
    assert dist.extras_require["plot"] == ["matplotlib"]
    assert "matplotlib" in dist.extras_require["test"]
    assert not any(r.startswith("matplotlib") for r in dist.install_requires)


def test_readme_commands_install_matplotlib():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    install_and_demo, tests = re.findall(r"```bash\n(.+?)\n```", readme.split("## Everyday use")[0], re.S)
    requirements = [ln.split("#")[0].strip() for ln in open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8")]
    assert "matplotlib" in requirements
    for command in (install_and_demo, tests):
        assert command.startswith("pip install -r requirements.txt "), command

