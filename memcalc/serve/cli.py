"""`memcalc serve [--port N]`: the page on http://127.0.0.1:N/ until interrupted."""
from __future__ import annotations

import argparse
import signal
import sys
import threading


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `serve` subcommand."""
    p = sub.add_parser("serve", help="a local web page: pick a model, GPU and step; see what fits")
    p.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (default 8765; 0: a free one)")
    p.add_argument("--no-warm", action="store_true", help="do not simulate neighbouring steps while idle")
    p.add_argument("--verbose", action="store_true", help="log each request")
    p.set_defaults(json=False)


def cmd_serve(args: argparse.Namespace) -> dict:
    """Serve until Ctrl-C; prints the URL on its first line."""
    from memcalc.core.errors import SpecError
    from memcalc.serve.server import start

    if not 0 <= args.port <= 65535:
        raise SpecError("port", f"{args.port} is not a port", "pass 0..65535 (0: a free port)")
    try:
        server = start(args.port, warm=not args.no_warm, quiet=not args.verbose)
    except OSError as err:
        raise SpecError("port", f"cannot listen on 127.0.0.1:{args.port} ({err.strerror})",
                        "pass another --port, or --port 0 for a free one") from None
    print(f"memcalc serve: http://127.0.0.1:{server.server_port}/ (Ctrl-C stops)", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())  # `kill PID` stops it as Ctrl-C does
    try:
        done.wait()
        print("memcalc serve: stopped", file=sys.stderr)
    except KeyboardInterrupt:
        print("memcalc serve: stopped", file=sys.stderr)
    finally:
        server.shutdown()
        server.server_close()
    return {}
