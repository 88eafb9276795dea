"""What the command lines here share: ppdlx_triton (next to this file) and ppdlx_deploy (deploy/python)
on sys.path from any working directory, and a DeployError printed as one line (``error: ...``) with its
exit code instead of a traceback."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.join(os.path.dirname(HERE), "python"), HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

from ppdlx_deploy.errors import DeployError  # noqa: E402


def run(main) -> None:
    try:
        code = main()
    except DeployError as err:
        print(f"error: {err}", file=sys.stderr)
        code = err.exit_code
    sys.exit(code)
