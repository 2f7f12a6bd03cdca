"""A local S3 endpoint for trying the S3 lake without AWS: moto's server on 127.0.0.1.

    python infra/local_s3.py [--port 9000] [--bucket rhymerl]

Prints the environment to point RhymeRL (s3fs, boto3) at it, then serves until Ctrl-C. moto keeps
objects in memory: this is for trying things and for checks, not for keeping data.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--bucket", default="rhymerl", help="bucket to create at start")
    args = p.parse_args(argv)

    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address=args.host, port=args.port, verbose=False)
    server.start()
    url = f"http://{args.host}:{args.port}"
    boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=args.bucket)
    print(f"S3 endpoint {url}, bucket {args.bucket}. In another shell:\n"
          f"  export AWS_ENDPOINT_URL={url} AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing "
          f"AWS_DEFAULT_REGION=us-east-1\n"
          f"  rhymerl run --lake s3://{args.bucket}/lake\n"
          f"  rhymerl lake summary --lake s3://{args.bucket}/lake\n"
          "Ctrl-C stops it (objects live in memory only).", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
