"""``pegaflow-router``: prefill/decode disaggregation in front of OpenAI-compatible vLLM servers
(docs/cluster.md, "P/D"). Each completion goes first to a prefill server (``kv_producer``)
with ``max_tokens=1``, which computes the prompt's KV and saves it into PegaFlow, then to a
decode server (``kv_consumer``), whose connector waits for the prompt's blocks (fetched from the
prefill host's pool when it is another host) and decodes from them; the decode server's answer,
streamed or not, is the router's. Servers are taken round robin. A prefill that fails is logged
and counted; the decode server then computes the prompt itself (same answer, slower).

Built on aiohttp (server and client). Every request may be required to carry
``Authorization: Bearer <key>`` (``--api-key-file``); bodies are capped before they are read.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import itertools
import json
import logging
import sys
from pathlib import Path

log = logging.getLogger("pegaflow.router")

ROUTES = ("/v1/completions", "/v1/chat/completions")


def build_app(prefill: list[str], decode: list[str], api_key: str | None = None, max_request_bytes: int = 16 << 20,
              timeout_s: float = 600.0):
    from aiohttp import ClientSession, ClientTimeout, web

    session_key = web.AppKey("pegaflow_router_session", ClientSession)
    prefills = itertools.cycle(prefill)
    decodes = itertools.cycle(decode)
    stats = {"requests": 0, "prefill_failures": 0, "decode_failures": 0}

    def authorized(request) -> bool:
        if api_key is None:
            return True
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode())

    async def on_startup(app):
        app[session_key] = ClientSession(timeout=ClientTimeout(total=timeout_s))

    async def on_cleanup(app):
        await app[session_key].close()

    async def disaggregate(request):
        if not authorized(request):
            return web.json_response({"error": "missing or wrong API key"}, status=401)
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"error": "the body is not JSON"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": f"the body is a JSON {type(body).__name__}; expected an object"}, status=400)
        stats["requests"] += 1
        session = request.app[session_key]
        path = request.path
        forward = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        # 1. prefill: the prompt's KV computed and saved; one token, never streamed
        first = dict(body, max_tokens=1, stream=False)
        first.pop("stream_options", None)
        if "max_completion_tokens" in first:
            first["max_completion_tokens"] = 1
        p = next(prefills)
        try:
            async with session.post(p + path, json=first, headers=forward) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}")
        except Exception as e:  # noqa: BLE001 - any failure: the decode server computes the prompt itself
            stats["prefill_failures"] += 1
            log.warning("prefill at %s failed (%s); the decode server computes the prompt", p, e)
        # 2. decode: the original request, its answer relayed as it comes
        d = next(decodes)
        try:
            async with session.post(d + path, json=body, headers=forward) as r:
                out = web.StreamResponse(status=r.status, headers={"Content-Type": r.headers.get("Content-Type",
                                                                                                  "application/json")})
                await out.prepare(request)
                async for chunk in r.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
        except Exception as e:  # noqa: BLE001
            stats["decode_failures"] += 1
            log.warning("decode at %s failed: %s", d, e)
            return web.json_response({"error": f"decode server {d} failed: {e}"}, status=502)

    async def models(request):
        if not authorized(request):
            return web.json_response({"error": "missing or wrong API key"}, status=401)
        async with request.app[session_key].get(decode[0] + "/v1/models") as r:
            return web.Response(status=r.status, body=await r.read(), content_type="application/json")

    async def health(request):
        return web.json_response({"status": "ok", "prefill": prefill, "decode": decode, **stats})

    app = web.Application(client_max_size=max_request_bytes)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    for route in ROUTES:
        app.router.add_post(route, disaggregate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pegaflow-router", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: loopback)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--prefill", nargs="+", required=True, help="prefill servers' base URLs (kv_producer)")
    p.add_argument("--decode", nargs="+", required=True, help="decode servers' base URLs (kv_consumer)")
    p.add_argument("--api-key-file", type=Path, help="file holding the key every request must carry as a Bearer token")
    p.add_argument("--max-request-bytes", type=int, default=16 << 20)
    p.add_argument("--timeout-secs", type=float, default=600.0)
    a = p.parse_args(argv)
    try:
        from aiohttp import web
    except ImportError:
        print("pegaflow-router needs aiohttp: pip install 'pegaflow-jvm[router]'", file=sys.stderr)
        return 2
    for url in a.prefill + a.decode:
        if not url.startswith(("http://", "https://")):
            print(f"pegaflow-router: server URL {url!r}; expected http://HOST:PORT", file=sys.stderr)
            return 2
    key = a.api_key_file.read_text().strip() if a.api_key_file else None
    if key is not None and len(key) < 16:
        print(f"pegaflow-router: --api-key-file {a.api_key_file} holds {len(key)} characters; expected >= 16", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    app = build_app([u.rstrip("/") for u in a.prefill], [u.rstrip("/") for u in a.decode], key, a.max_request_bytes,
                    a.timeout_secs)
    print(f"pegaflow-router ready http://{a.host}:{a.port} prefill={a.prefill} decode={a.decode}", flush=True)
    web.run_app(app, host=a.host, port=a.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
