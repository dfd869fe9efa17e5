import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from loopback.server import LoopbackServer, Scripted

from flashgen.agent import providers
from flashgen.agent.providers import (
    AnthropicProvider,
    ChatMessage,
    ModelRequest,
    OpenAIProvider,
    ProviderError,
    RetryPolicy,
    Task,
    Usage,
    cost_of,
    make_provider,
    redact,
)
from flashgen.errors import UsageError
from flashgen.variant import DType, Variant

TASK = Task(variant=Variant(), target="a100", arch="sm_80", dtype=DType.fp16, head_dim=64)
FAST = RetryPolicy(max_attempts=4, base_delay_s=0.0, timeout_s=10)


def request(text="hi"):
    return ModelRequest(stage="sketch", phase="sketch", task=TASK,
                        messages=[ChatMessage(role="system", content="sys"), ChatMessage(role="user", content=text)])


def test_openai_429_with_retry_after_then_success(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-openai-0123456789")
    slept: list[float] = []
    with LoopbackServer() as server:
        server.push(Scripted(status=429, headers={"Retry-After": "3"}), Scripted(text="hello", input_tokens=1000,
                                                                                 output_tokens=500))
        provider = OpenAIProvider("gpt-4o", base_url=server.openai_base_url, retry=FAST, sleep=slept.append)
        reply = provider.complete(request())
    assert reply.text == "hello" and reply.attempts == 2
    assert slept and slept[0] >= 3.0  # the server's Retry-After wins over the (zero) backoff
    assert reply.usage == Usage(input_tokens=1000, output_tokens=500)
    assert reply.cost_usd == pytest.approx((1000 * 2.5 + 500 * 10.0) / 1e6)
    seen = server.seen[-1]
    assert seen.path == "/v1/chat/completions" and seen.headers["authorization"] == "Bearer sk-test-openai-0123456789"
    assert [m["role"] for m in seen.body["messages"]] == ["system", "user"]


def test_anthropic_500_then_success_system_prompt_separate(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789")
    slept: list[float] = []
    with LoopbackServer() as server:
        server.push(Scripted(status=500), Scripted(status=503), Scripted(text="```tl\nx\n```"))
        provider = AnthropicProvider("claude-sonnet-4-6", base_url=server.anthropic_base_url, retry=FAST,
                                     sleep=slept.append)
        reply = provider.complete(request())
    assert reply.attempts == 3 and len(slept) == 2 and reply.text == "```tl\nx\n```"
    seen = server.seen[-1]
    assert seen.path == "/v1/messages"
    # SDK releases send the key as x-api-key or as a bearer token
    assert "sk-ant-test-0123456789" in (seen.headers.get("x-api-key", "") + seen.headers.get("authorization", ""))
    assert seen.body["system"] == "sys" and [m["role"] for m in seen.body["messages"]] == ["user"]
    assert reply.cost_usd == pytest.approx((11 * 3 + 7 * 15) / 1e6)


def test_retries_exhausted_and_non_retryable(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-openai-0123456789")
    with LoopbackServer() as server:
        server.push(*[Scripted(status=429)] * 4)
        provider = OpenAIProvider("gpt-4o", base_url=server.openai_base_url, retry=FAST, sleep=lambda s: None)
        with pytest.raises(ProviderError, match="gave up after 4 attempts"):
            provider.complete(request())
        server.push(Scripted(status=400))
        with pytest.raises(ProviderError, match="HTTP 400"):
            provider.complete(request())
        assert len(server.seen) == 5  # a 400 is not retried


def test_openai_compatible_needs_no_key_and_unknown_model_costs_none(monkeypatch):
    monkeypatch.delenv("OPENAI_COMPATIBLE_API_KEY", raising=False)
    with LoopbackServer() as server:
        server.push("ok")
        provider = make_provider("openai-compatible", "my-local-llama", server.openai_base_url, retry=FAST)
        reply = provider.complete(request())
    assert reply.text == "ok" and reply.cost_usd is None and "no price known" in reply.note
    with pytest.raises(UsageError, match="--base-url"):
        make_provider("openai-compatible", "m", None)
    with pytest.raises(UsageError, match="unknown provider"):
        make_provider("gemini")


def test_missing_key_and_missing_sdk(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ProviderError, match="ANTHROPIC_API_KEY"):
        AnthropicProvider()
    real_import = importlib.import_module

    def no_openai(name, *a, **k):
        if name == "openai":
            raise ImportError("No module named 'openai'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(importlib, "import_module", no_openai)
    with pytest.raises(ProviderError, match=r"pip install 'flashgen\[llm\]'"):
        OpenAIProvider(api_key="sk-whatever-0123456789")


def test_prices_and_redaction(monkeypatch):
    assert cost_of("gpt-4o-mini-2024-07-18", Usage(input_tokens=10**6)) == pytest.approx(0.15)  # longest prefix
    assert cost_of("claude-opus-4-1-20250805", Usage(output_tokens=10**6)) == pytest.approx(75.0)
    assert cost_of("mystery-model", Usage(input_tokens=5)) is None
    monkeypatch.setenv("OPENAI_API_KEY", "plain-secret-value-42")
    text = redact("key plain-secret-value-42 and sk-ant-abcdefghijklmnop1234 and sk-proj-ABCDEFGHIJKLMNOP")
    assert "plain-secret-value-42" not in text and "sk-ant-abc" not in text and "sk-proj-ABC" not in text
    assert providers.PRICES_PER_MTOK  # the table is there for the docs to cite
