"""pegaflow-router's own behaviour (unit tier): the prefill server gets the request with one
token and no streaming, the decode server the original, whose answer (streamed or not) is
relayed; keys, caps and failures. The upstreams here are small aiohttp servers that record what
they were sent (the real P/D flow with vLLM engines is tests/test_pd.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

aiohttp = pytest.importorskip("aiohttp")
from aiohttp import web  # noqa: E402
from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from pegaflow.router import build_app  # noqa: E402


def _upstream(name: str, seen: list, fail: bool = False) -> web.Application:
    async def complete(request):
        body = await request.json()
        seen.append((name, request.path, body, request.headers.get("Authorization")))
        if fail:
            return web.json_response({"error": "down"}, status=500)
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(3):
                await resp.write(f"data: {{\"n\": {i}}}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        return web.json_response({"from": name, "max_tokens": body.get("max_tokens")})

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    return app


def _run(check, fail_prefill=False, api_key=None, cap=1 << 20):
    async def go():
        seen: list = []
        p, d = TestServer(_upstream("p", seen, fail_prefill)), TestServer(_upstream("d", seen))
        await p.start_server()
        await d.start_server()
        router = TestClient(TestServer(build_app([str(p.make_url("")).rstrip("/")], [str(d.make_url("")).rstrip("/")],
                                                 api_key, cap)))
        await router.start_server()
        try:
            await check(router, seen)
        finally:
            await router.close()
            await p.close()
            await d.close()

    asyncio.run(go())


def test_prefill_gets_one_token_decode_gets_the_original_and_answers():
    async def check(router, seen):
        r = await router.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 16, "stream": False})
        assert r.status == 200 and await r.json() == {"from": "d", "max_tokens": 16}
        assert [(n, b["max_tokens"], b["stream"]) for n, _, b, _ in seen] == [("p", 1, False), ("d", 16, False)]
        h = await (await router.get("/health")).json()
        assert h["requests"] == 1 and h["prefill_failures"] == 0

    _run(check)


def test_a_streamed_chat_answer_is_relayed_as_it_comes_and_the_prefill_is_not_streamed():
    async def check(router, seen):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9,
                "stream": True, "stream_options": {"include_usage": True}}
        r = await router.post("/v1/chat/completions", json=body)
        text = (await r.read()).decode()
        assert r.status == 200 and text.count("data:") == 4 and text.endswith("data: [DONE]\n\n")
        p, d = seen
        assert p[2]["max_completion_tokens"] == 1 and p[2]["stream"] is False and "stream_options" not in p[2]
        assert d[2] == body

    _run(check)


def test_a_failed_prefill_still_gets_an_answer_from_decode_and_is_counted():
    async def check(router, seen):
        r = await router.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 4})
        assert r.status == 200 and (await r.json())["from"] == "d"
        assert (await (await router.get("/health")).json())["prefill_failures"] == 1

    _run(check, fail_prefill=True)


def test_keys_bodies_and_caps_are_checked_before_anything_is_sent():
    async def check(router, seen):
        assert (await router.post("/v1/completions", json={"prompt": "x"})).status == 401
        ok = {"Authorization": "Bearer a-router-key-of-16+"}
        assert (await router.post("/v1/completions", data=b"not json", headers=ok)).status == 400
        assert (await router.post("/v1/completions", json=[1, 2], headers=ok)).status == 400
        assert (await router.post("/v1/completions", data=json.dumps({"p": "x" * 5000}), headers=ok)).status == 413
        assert seen == [], "nothing reached the upstream servers"
        r = await router.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=ok)
        assert r.status == 200 and [s[3] for s in seen] == ["Bearer a-router-key-of-16+"] * 2  # the key goes along

    _run(check, api_key="a-router-key-of-16+", cap=4096)
