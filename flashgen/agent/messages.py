"""What the agent and a model provider say to each other: `ModelRequest` in, `ModelReply` out, and the
`Provider` protocol between them. Every provider (flashgen.agent.providers, the offline expert in
flashgen.agent.expert) and the loop build on these; none of them on each other."""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from flashgen.errors import FlashgenError
from flashgen.mods import Mods
from flashgen.variant import DType, Variant

Stage = Literal["sketch", "params", "translate", "repair_syntax", "repair_check", "repair_interpret",
                "repair_compile", "repair_wrong", "repair_slow", "repair_no_code"]


class ProviderError(FlashgenError):
    """A provider could not answer (missing SDK or key, a refused request, retries exhausted). `transient`: the
    same request may succeed later (timeouts, 5xx, invalid JSON: `--resume` can help); otherwise the cause (a key, a
    model name, a URL) must be fixed first."""

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


class DeadlineExceeded(ProviderError):
    """The model did not answer before the call's deadline: the run's `--max-wall` (`wall`), or the retry budget's
    total."""

    def __init__(self, message: str, *, wall: bool = False):
        super().__init__(message, transient=True)
        self.wall = wall


class NoFurtherReply(ProviderError):
    """The provider has nothing to answer this request with (`flashgen build` without a model: the user's program
    was all it had, and it needs repair). The loop ends the run as failed, with this message as the reason; `--resume
    N --provider P --model M` asks a model the request instead."""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class Task(BaseModel):
    """What is being generated: enough for the expert to answer without reading the prose."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    variant: Variant
    target: str = Field(description="canonical target name, e.g. a100")
    arch: str
    dtype: DType
    head_dim: int
    mods: Mods | None = Field(default=None, description="score and mask functions on top of the variant "
                              "(flashgen.mods); None: the variant alone")
    head_dim_v: int | None = Field(default=None, description="V's and O's own head dim (Dv); None: head_dim")

    @model_serializer(mode="wrap")
    def _without_no_mods(self, handler):
        data = handler(self)  # a task without functions or a V head dim of its own is recorded as before they existed
        if isinstance(data, dict):
            for key in ("mods", "head_dim_v"):
                if data.get(key, ...) is None:
                    del data[key]
        return data

    @property
    def dims(self) -> dict[str, int]:
        """The V head dim as keyword arguments of the environment's methods: {} where it is head_dim (so that an
        environment written before head_dim_v existed is called as it always was)."""
        return {"head_dim_v": self.head_dim_v} if self.head_dim_v is not None else {}


class ModelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stage: Stage
    messages: list[ChatMessage]
    task: Task
    phase: Literal["sketch", "params", "translate"] = Field(
        description="the artefact this request asks for: a sketch, a full TL program or CUDA")
    deadline: float | None = Field(default=None, description="time.monotonic() by which the call must end, retries "
                                   "included (the run's --max-wall); None: only the provider's own limits")


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


class ModelReply(BaseModel):
    text: str
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float | None = Field(default=None, description="None when the model's price is unknown")
    model: str
    attempts: int = 1
    note: str = ""


@runtime_checkable
class Provider(Protocol):
    name: str
    model: str

    def complete(self, request: ModelRequest) -> ModelReply: ...
