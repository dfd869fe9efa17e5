"""Model providers: one small interface, `complete(ModelRequest) -> ModelReply`.

Implementations: OpenAI and Anthropic through their official SDKs, any OpenAI-compatible endpoint
(vLLM, llama.cpp server, ollama) by base URL, the offline rule-based `expert` (flashgen.agent.expert)
and a deterministic `ScriptedProvider` for tests. The SDKs are optional (extra `llm`) and imported
lazily. Retries (429, 5xx, timeouts) are ours, not the SDKs', so that the backoff honours
Retry-After and every attempt is accounted for the same way whatever the vendor; each request's
timeout and the backoffs end by the call's deadline (RetryPolicy.deadline_s, or the run's --max-wall).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterable

from pydantic import BaseModel, Field

from flashgen.agent.messages import ChatMessage as ChatMessage
from flashgen.agent.messages import DeadlineExceeded, ModelReply, ModelRequest, Provider, ProviderError, Usage
from flashgen.agent.messages import Stage as Stage
from flashgen.agent.messages import Task as Task
from flashgen.errors import UsageError

# USD per million tokens (input, output), from the vendors' public price pages
# (openai.com/api/pricing, anthropic.com/pricing) as listed in 2025. Matched by longest prefix so
# that dated snapshots (gpt-4o-2024-08-06, claude-sonnet-4-5-20250929) find their family.
PRICES_PER_MTOK: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-5-nano": (0.05, 0.40),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5": (1.25, 10.00),
    "o4-mini": (1.10, 4.40),
    "o3-mini": (1.10, 4.40),
    "o3": (2.00, 8.00),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-haiku-4-5": (1.00, 5.00),
    "claude-3-5-sonnet": (3.00, 15.00),
    "claude-3-7-sonnet": (3.00, 15.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-opus-4-5": (5.00, 25.00),
    "claude-opus-4": (15.00, 75.00),
}


def price_of(model: str) -> tuple[float, float] | None:
    matches = [key for key in PRICES_PER_MTOK if model.startswith(key)]
    return PRICES_PER_MTOK[max(matches, key=len)] if matches else None


def cost_of(model: str, usage: Usage) -> float | None:
    price = price_of(model)
    if price is None:
        return None
    return (usage.input_tokens * price[0] + usage.output_tokens * price[1]) / 1e6


# ---------------------------------------------------------------------------------------------
# Retries


class RetryPolicy(BaseModel):
    max_attempts: int = Field(default=6, ge=1, le=100, description="attempts per model call (--retries + 1)")
    base_delay_s: float = Field(default=1.0, ge=0)
    max_delay_s: float = Field(default=60.0, ge=0)
    timeout_s: float = Field(default=300.0, gt=0, le=3600, description="per HTTP request (--request-timeout)")
    deadline_s: float = Field(default=900.0, gt=0, description="one model call, every attempt and backoff included; "
                              "the run's --max-wall shortens it")


RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
# connection errors that no retry can cure: the URL itself is unusable
_PERMANENT_TRANSPORT = frozenset({"UnsupportedProtocol", "InvalidURL", "LocalProtocolError"})


def check_base_url(url: str, flag: str = "--base-url") -> str:
    """Refuse a URL no request can reach (no http(s) scheme, no host, a bad port, spaces) in one line."""
    from urllib.parse import urlsplit

    problem = None
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError as exc:
        problem, parts, port = str(exc), None, None
    if problem is None:
        if parts.scheme not in ("http", "https"):
            problem = "the scheme must be http:// or https://"
        elif not parts.hostname:
            problem = "no host name"
        elif any(c.isspace() for c in url) or any(ord(c) < 32 for c in url):
            problem = "it contains spaces or control characters"
        elif port == 0:
            problem = "port 0"
    if problem is not None:
        raise UsageError(f"{flag} {url!r}: not a usable URL ({problem}); expected e.g. http://localhost:8000/v1")
    return url


def _retry_after_seconds(headers) -> float | None:
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return float(ms) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def _classify(exc: Exception) -> tuple[bool, str, float | None]:
    """(retryable, label, retry-after seconds) for an SDK exception, duck-typed so that both SDKs (and httpx
    underneath) are handled by one rule. A reply that is not valid JSON (a proxy's error page, a cut-off body) is
    transient: the same request usually succeeds the next time."""
    import json

    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    name = type(exc).__name__
    if isinstance(exc, json.JSONDecodeError) or name == "APIResponseValidationError":
        return True, "invalid JSON in the reply", None
    if status is not None:
        return status in RETRYABLE_STATUS, f"HTTP {status}", _retry_after_seconds(headers)
    cause = exc.__cause__ or exc.__context__
    if cause is not None and type(cause).__name__ in _PERMANENT_TRANSPORT:
        return False, f"{name}: {type(cause).__name__}", None
    # APIConnectionError / APITimeoutError (both SDKs), httpx transport errors
    transient = name in {"APIConnectionError", "APITimeoutError"} or "Timeout" in name or "Connect" in name
    return transient, name, None


def call_with_retries(call: Callable[[float], ModelReply], policy: RetryPolicy, what: str,
                      sleep: Callable[[float], None] = time.sleep, deadline: float | None = None) -> ModelReply:
    """`call(timeout_s)` with exponential backoff and full jitter; a server's Retry-After wins when it asks for
    longer. Every attempt's timeout and every wait ends by the call's deadline: the policy's total (deadline_s) or
    `deadline` (time.monotonic(), the run's --max-wall), whichever comes first; then DeadlineExceeded."""
    end = time.monotonic() + policy.deadline_s
    if deadline is not None:
        end = min(end, deadline)
    label = "none"
    for attempt in range(1, policy.max_attempts + 1):
        left = end - time.monotonic()
        if left <= 0:
            break
        try:
            reply = call(min(policy.timeout_s, left))
            reply.attempts = attempt
            return reply
        except ProviderError:
            raise
        except Exception as exc:
            retryable, label, retry_after = _classify(exc)
            if not retryable:
                raise ProviderError(f"{what}: request refused ({label}): {redact(_short(exc))}") from None
            if attempt == policy.max_attempts:
                plural = "s" if attempt > 1 else ""
                raise ProviderError(f"{what}: gave up after {attempt} attempt{plural} (last: {label})",
                                    transient=True) from None
            backoff = min(policy.max_delay_s, policy.base_delay_s * 2 ** (attempt - 1)) * random.random()
            wait = min(policy.max_delay_s, max(backoff, retry_after or 0.0))
            if time.monotonic() + wait >= end:
                break
            sleep(wait)
    spent = policy.deadline_s if deadline is None or end < deadline else None
    why = (f"the retry budget's {spent:g} s" if spent is not None else "the run's wall-time budget (--max-wall)")
    raise DeadlineExceeded(f"{what}: no answer within {why} (last: {label})", wall=spent is None)


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text[:300]


# ---------------------------------------------------------------------------------------------
# Secrets: every string that leaves a provider for the store or a file goes through redact().

SECRET_ENV_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_COMPATIBLE_API_KEY")
_extra_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    if value and len(value) >= 8:
        _extra_secrets.add(value)


def _secrets() -> Iterable[str]:
    for var in SECRET_ENV_VARS:
        value = os.environ.get(var)
        if value and len(value) >= 8:
            yield value
    yield from _extra_secrets


def redact(text: str) -> str:
    import re

    for secret in _secrets():
        text = text.replace(secret, "[REDACTED]")
    # key-shaped tokens that came from elsewhere (a pasted key in a prompt, an error echoing a header)
    return re.sub(r"\b(sk-(?:ant-)?[A-Za-z0-9_\-]{12,})", "[REDACTED]", text)


# ---------------------------------------------------------------------------------------------
# SDK-backed providers


def _import_sdk(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ProviderError(f"the {module!r} package is not installed: pip install 'flashgen[llm]'") from None


class OpenAIProvider:
    """OpenAI chat completions; with `base_url`, any OpenAI-compatible server."""

    def __init__(self, model: str = "gpt-4.1", *, base_url: str | None = None, api_key: str | None = None,
                 key_env: str = "OPENAI_API_KEY", key_required: bool = True, name: str = "openai",
                 retry: RetryPolicy | None = None, max_output_tokens: int = 8192, temperature: float | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        # temperature None leaves the server's default (reasoning models refuse any other value)
        if base_url is not None:
            check_base_url(base_url)
        sdk = _import_sdk("openai")
        key = api_key or os.environ.get(key_env)
        if not key:
            if key_required:
                raise ProviderError(f"{name}: no API key: set {key_env}")
            key = "not-needed"  # local servers ignore it; the SDK insists on a value
        register_secret(key)
        self.name, self.model = name, model
        self.retry = retry or RetryPolicy()
        self.max_output_tokens, self.temperature, self._sleep = max_output_tokens, temperature, sleep
        self._client = sdk.OpenAI(api_key=key, base_url=base_url, max_retries=0, timeout=self.retry.timeout_s)

    def complete(self, request: ModelRequest) -> ModelReply:
        messages = [{"role": m.role, "content": m.content} for m in request.messages]

        def call(timeout_s: float) -> ModelReply:
            extra = {} if self.temperature is None else {"temperature": self.temperature}
            response = self._client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=self.max_output_tokens, timeout=timeout_s, **extra)
            choice = response.choices[0] if response.choices else None
            text = (choice.message.content or "") if choice else ""
            usage = Usage(input_tokens=getattr(response.usage, "prompt_tokens", 0) or 0,
                          output_tokens=getattr(response.usage, "completion_tokens", 0) or 0)
            note = "truncated at max_tokens" if choice is not None and choice.finish_reason == "length" else ""
            return _priced(response.model or self.model, usage, text, note)

        return call_with_retries(call, self.retry, f"{self.name} ({self.model})", self._sleep, request.deadline)


class AnthropicProvider:
    def __init__(self, model: str = "claude-sonnet-4-6", *, base_url: str | None = None, api_key: str | None = None,
                 retry: RetryPolicy | None = None, max_output_tokens: int = 8192, temperature: float | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        if base_url is not None:
            check_base_url(base_url)
        sdk = _import_sdk("anthropic")
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ProviderError("anthropic: no API key: set ANTHROPIC_API_KEY")
        register_secret(key)
        self.name, self.model = "anthropic", model
        self.retry = retry or RetryPolicy()
        self.max_output_tokens, self.temperature, self._sleep = max_output_tokens, temperature, sleep
        self._client = sdk.Anthropic(api_key=key, base_url=base_url, max_retries=0, timeout=self.retry.timeout_s)

    def complete(self, request: ModelRequest) -> ModelReply:
        system = "\n\n".join(m.content for m in request.messages if m.role == "system")
        messages = [{"role": m.role, "content": m.content} for m in request.messages if m.role != "system"]

        def call(timeout_s: float) -> ModelReply:
            # through extra_body: SDK releases differ in whether `temperature` is a named argument
            extra = {} if self.temperature is None else {"extra_body": {"temperature": self.temperature}}
            if system:
                extra["system"] = system
            response = self._client.messages.create(
                model=self.model, messages=messages, max_tokens=self.max_output_tokens, timeout=timeout_s, **extra)
            text = "".join(getattr(block, "text", "") for block in response.content)
            usage = Usage(input_tokens=response.usage.input_tokens or 0, output_tokens=response.usage.output_tokens or 0)
            note = "truncated at max_tokens" if response.stop_reason == "max_tokens" else ""
            return _priced(response.model or self.model, usage, text, note)

        return call_with_retries(call, self.retry, f"anthropic ({self.model})", self._sleep, request.deadline)


def _priced(model: str, usage: Usage, text: str, note: str) -> ModelReply:
    cost = cost_of(model, usage)
    if cost is None:
        note = "; ".join(filter(None, [note, f"no price known for model {model!r}: cost not counted"]))
    return ModelReply(text=text, usage=usage, cost_usd=cost, model=model, note=note)


class ScriptedProvider:
    """Replays fixed replies in order (tests). An entry may be a string or a function of the request."""

    def __init__(self, replies: list[str | Callable[[ModelRequest], str]], model: str = "scripted",
                 tokens_per_reply: int = 100, cost_per_reply: float | None = 0.0):
        self.name, self.model = "scripted", model
        self._replies = list(replies)
        self.requests: list[ModelRequest] = []
        self._tokens, self._cost = tokens_per_reply, cost_per_reply

    def complete(self, request: ModelRequest) -> ModelReply:
        self.requests.append(request)
        if not self._replies:
            raise ProviderError("scripted provider: no reply left in the script")
        entry = self._replies.pop(0)
        text = entry(request) if callable(entry) else entry
        return ModelReply(text=text, usage=Usage(input_tokens=self._tokens, output_tokens=self._tokens),
                          cost_usd=self._cost, model=self.model)


PROVIDER_NAMES = ("expert", "openai", "anthropic", "openai-compatible")


def make_provider(name: str, model: str | None = None, base_url: str | None = None, **kwargs) -> Provider:
    if name == "expert":
        from flashgen.agent.expert import ExpertProvider

        return ExpertProvider()
    if name == "openai":
        return OpenAIProvider(model or "gpt-4.1", base_url=base_url, **kwargs)
    if name == "anthropic":
        return AnthropicProvider(model or "claude-sonnet-4-6", base_url=base_url, **kwargs)
    if name == "openai-compatible":
        flag = "--base-url" if base_url else "OPENAI_COMPATIBLE_BASE_URL"
        base_url = base_url or os.environ.get("OPENAI_COMPATIBLE_BASE_URL")
        if not base_url:
            raise UsageError("--provider openai-compatible needs --base-url (e.g. http://localhost:8000/v1)")
        check_base_url(base_url, flag)
        if not model:
            raise UsageError("--provider openai-compatible needs --model (the name the server serves)")
        return OpenAIProvider(model, base_url=base_url, key_env="OPENAI_COMPATIBLE_API_KEY", key_required=False,
                              name="openai-compatible", **kwargs)
    raise UsageError(f"unknown provider {name!r}; choose one of {', '.join(PROVIDER_NAMES)}")
