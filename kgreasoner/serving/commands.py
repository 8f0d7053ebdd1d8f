"""`kgreasoner answer | serve | export`: the serving commands."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import socket
import sys

from kgreasoner.config import add_config_arguments, describe, load_config
from kgreasoner.llm.spec import SPEC_FORMS, describe_forms
from kgreasoner.serving import answer, export


def register(subparsers: argparse._SubParsersAction) -> None:
    from kgreasoner.serving.config import ServeConfig

    answer.register(subparsers)
    export.register(subparsers)
    parser = subparsers.add_parser(
        "serve",
        help="HTTP service: /v1/answer, OpenAI-compatible /v1/chat/completions, /health, /metrics",
        description="Serve a checkpoint with its KG search tool over HTTP (FastAPI + uvicorn).\n\n"
        "    kgreasoner serve --llm hf:checkpoints/tiny-cpu/sft/final --kg outputs/demo/data \\\n"
        "        --config configs/tiny-cpu/serve.yaml --port 8080\n\n"
        "Fields of the --config YAML (ServeConfig; nested sections tool, rollout):\n" + describe(ServeConfig),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--llm", help=f"{describe_forms(SPEC_FORMS)} (overrides the config's llm)")
    parser.add_argument("--kg", help="KG spec (overrides the config's kg)")
    parser.add_argument("--host", help="address to bind (default: the config's, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: the config's, 8000; 0 picks a free one)")
    add_config_arguments(parser)
    parser.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from kgreasoner.serving.app import create_app
    from kgreasoner.serving.config import ServeConfig
    from kgreasoner.serving.header_timeout import header_timeout_protocol
    from kgreasoner.serving.metrics import Metrics
    from kgreasoner.serving.service import AnswerService
    from kgreasoner.serving.shutdown import StoppingServer

    config = load_config(ServeConfig, args.config, args.overrides)
    for name in ("llm", "kg", "host", "port"):
        if getattr(args, name) is not None:
            setattr(config, name, getattr(args, name))
    config.__post_init__()  # validate what the flags changed
    if not _is_loopback(config.host):
        print(
            f"kgreasoner serve: warning: binding {config.host} exposes the service beyond this machine",
            file=sys.stderr,
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: one line per model call to an `openai:` backend would drown the log
    logging.getLogger("httpx").setLevel(logging.WARNING)
    metrics = Metrics()
    service = AnswerService.open(config, on_batch=metrics.observe_batch)
    try:
        # Bind first so that port 0 resolves to a real port we can announce before serving.
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((config.host, config.port))
        except OSError as err:
            sock.close()
            raise ValueError(f"cannot listen on {config.host}:{config.port}: {err.strerror or err}") from err
        host, port = sock.getsockname()[:2]
        url_host = f"[{host}]" if family == socket.AF_INET6 else host
        print(
            f"kgreasoner serve: {service.model_name} ({service.kind} backend) on http://{url_host}:{port} "
            f"(POST /v1/answer, /v1/chat/completions; GET /health, /metrics)",
            flush=True,
        )
        server = StoppingServer(
            uvicorn.Config(
                create_app(service, metrics),
                log_level="info",
                access_log=False,
                http=header_timeout_protocol(config.header_timeout),
            ),
            service,
        )
        server.run(sockets=[sock])
    finally:
        service.close()
    return 0


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
