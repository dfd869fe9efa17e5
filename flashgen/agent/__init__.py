"""The agent: providers, the generate loop and its CLI (docs/agent.md)."""

from flashgen.agent.loop import Budget, LoopConfig, LoopResult, resume_loop, run_loop
from flashgen.agent.providers import (
    AnthropicProvider,
    ModelReply,
    ModelRequest,
    OpenAIProvider,
    Provider,
    ProviderError,
    ScriptedProvider,
    make_provider,
)

__all__ = [
    "AnthropicProvider",
    "Budget",
    "LoopConfig",
    "LoopResult",
    "ModelReply",
    "ModelRequest",
    "OpenAIProvider",
    "Provider",
    "ProviderError",
    "ScriptedProvider",
    "make_provider",
    "resume_loop",
    "run_loop",
]
