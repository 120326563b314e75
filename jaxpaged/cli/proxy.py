"""Disaggregation proxy: one OpenAI endpoint over prefill and decode engines (docs/disaggregation.md).

    jaxpaged serve --model=tiny --port=8100 --kv_role=prefill --kv_listen=tcp://127.0.0.1:5600
    jaxpaged serve --model=tiny --port=8200 --kv_role=decode --kv_peers=tcp://127.0.0.1:5600
    jaxpaged proxy --prefill=http://127.0.0.1:8100 --decode=http://127.0.0.1:8200 --port=8000
"""

from __future__ import annotations

import uvicorn

from jaxpaged.cli.flagset import FlagSet

FLAGS = FlagSet()
PREFILL = FLAGS.DEFINE_list("prefill", None, "base URLs of the prefill engines (comma-separated)")
DECODE = FLAGS.DEFINE_list("decode", None, "base URLs of the decode engines (comma-separated)")
HOST = FLAGS.DEFINE_string("host", "127.0.0.1", "address to listen on")
PORT = FLAGS.DEFINE_integer("port", 8000, "port to listen on", lower_bound=1, upper_bound=65535)


def main(argv) -> None:
    """Serve the proxy until interrupted."""
    from jaxpaged.server.disagg_proxy import build_proxy_app
    if not PREFILL.value or not DECODE.value:
        raise SystemExit("--prefill and --decode are both needed")
    uvicorn.run(build_proxy_app(PREFILL.value, DECODE.value), host=HOST.value, port=PORT.value,
                log_level="warning")
