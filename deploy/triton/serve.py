#!/usr/bin/env python3
"""Serve a model repository (deploy/triton/make_repo.py) with the tritonserver that the nvidia-pytriton
wheel bundles (CPU, Python backend), on 127.0.0.1, until Ctrl-C:

    pip install --no-deps nvidia-pytriton==0.7.0 && pip install 'tritonclient[http,grpc]'
    python deploy/triton/serve.py --repository REPO [--http-port 8000] [--grpc-port 8001]

How the bundled server is started (stub, libpython, PYTHONPATH) is in ppdlx_triton/server.py. On a GPU
host use NVIDIA's server image instead (deploy/README.md, "Triton").
"""
import argparse
import signal
import threading

from _cli import run  # first: puts ppdlx_triton and ppdlx_deploy on sys.path
from ppdlx_deploy.errors import DeployError
from ppdlx_triton.server import TritonServer


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repository", required=True)
    p.add_argument("--http-port", type=int, help="default: a free port")
    p.add_argument("--grpc-port", type=int, help="default: a free port")
    p.add_argument("--verbose", action="store_true", help="Triton's verbose log")
    args = p.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with TritonServer(args.repository, http_port=args.http_port, grpc_port=args.grpc_port,
                      verbose=args.verbose) as server:
        print(f"serving {args.repository}: HTTP {server.http_url}, gRPC {server.grpc_url} (log {server.log_path}); "
              f"Ctrl-C stops it", flush=True)
        while not stop.wait(1.0):
            if not server.alive():
                raise DeployError(f"tritonserver exited with code {server.process.returncode}: {server.log_tail()}")
    return 0


if __name__ == "__main__":
    run(main)
