import os
import sys

os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
