#!/usr/bin/env python3
"""Send image files to a served ppdlx model and print its answers as deploy/python/infer.py prints them:

    python deploy/triton/ask.py --url 127.0.0.1:8001 --protocol grpc --model resnet50 --input photos/
"""
import argparse

from _cli import run  # first: puts ppdlx_triton and ppdlx_deploy on sys.path
from ppdlx_deploy import list_images
from ppdlx_deploy.postprocess import result_text
from ppdlx_triton.client import PROTOCOLS, ask


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="HOST:PORT of the server's HTTP or gRPC endpoint")
    p.add_argument("--protocol", choices=PROTOCOLS, default="http")
    p.add_argument("--model", required=True)
    p.add_argument("--input", required=True, help="an image or a directory of images")
    p.add_argument("--topk", type=int, help="classification: at most this many classes per image")
    args = p.parse_args(argv)
    family, answers = ask(args.url, args.protocol, args.model, list_images(args.input), args.topk)
    for path, result in answers:
        print(result_text({"model": {"family": family}}, path, result))
    return 0


if __name__ == "__main__":
    run(main)
