"""Tools from plain functions: `@tool` reads the name, the description and the arguments'
schema from the function itself.

    @tool
    def add(a: int, b: Annotated[int, Field(description="The second term.")]) -> int:
        \"\"\"Add two integers.\"\"\"
        return a + b

The name is the function's, the description its docstring, and the arguments its
parameters: their type hints (with `Annotated[..., Field(...)]` descriptions and
constraints) and defaults make a pydantic model, whose JSON schema the model is offered. A
parameter annotated `ToolContext` receives the call's context instead (workspace,
idempotency key, ledger). Sync and async functions both work; a result that is not text is
sent to the model as JSON.

The Tool `@tool` gives is still the function: `add(2, 3)` returns 5 (and an async tool's
call is awaited as before), so a unit test calls it as itself.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar, Generic, ParamSpec, TypeVar, overload

from pydantic import BaseModel, create_model
from pydantic_core import to_json

from waystation.activities.tools import Tool, ToolContext, ToolDefinitionError
from waystation.vocabulary import ApprovalRule

_NOT_ARGUMENTS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class FunctionTool(Tool[BaseModel], Generic[P, R]):
    """A Tool made by `@tool`, callable as the function it was made from."""

    wrapped: Callable[P, R] = field(kw_only=True, repr=False, compare=False)
    __name__: ClassVar[str]  # the function's, as __qualname__, __doc__ and __module__

    def __post_init__(self) -> None:
        super().__post_init__()
        # What inspect, pytest and help() read from a function, read from this one.
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            if hasattr(self.wrapped, attribute):
                object.__setattr__(self, attribute, getattr(self.wrapped, attribute))
        object.__setattr__(self, "__wrapped__", self.wrapped)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.wrapped(*args, **kwargs)


@overload
def tool(
    function: Callable[P, R],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    approval: ApprovalRule = "never",
    retry_safe: bool = False,
    timeout: float | timedelta = 60.0,
    local: bool = False,
) -> FunctionTool[P, R]: ...


@overload
def tool(
    function: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    approval: ApprovalRule = "never",
    retry_safe: bool = False,
    timeout: float | timedelta = 60.0,
    local: bool = False,
) -> Callable[[Callable[P, R]], FunctionTool[P, R]]: ...


def tool(
    function: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    approval: ApprovalRule = "never",
    retry_safe: bool = False,
    timeout: float | timedelta = 60.0,
    local: bool = False,
) -> FunctionTool[P, R] | Callable[[Callable[P, R]], FunctionTool[P, R]]:
    """A Tool made from `function` (`@tool`, `@tool(...)` or `tool(function, ...)`), which
    is still `function` when called (`add(2, 3)`).

    `approval`: "never", "always" or "outside_scratch" (a `path` argument outside the
    workspace's scratch/ folder). `retry_safe`: a retry cannot repeat the call's effect (it
    is pure, or guarded by the ledger); by default a call runs at most once and an attempt
    lost with its worker is reported to the model. `timeout`: how long one call may take.
    `local`: pure and fast, run inside the workflow task (retry-safe tools only).
    A definition that cannot work raises ToolDefinitionError with a sentence.
    """

    def make(function: Callable[P, R]) -> FunctionTool[P, R]:
        tool_name = name or str(getattr(function, "__name__", ""))
        arguments, context_parameter = _arguments_model(function, tool_name)
        text = description if description is not None else inspect.getdoc(function)
        if not text:
            raise ToolDefinitionError(
                f"tool {tool_name!r} has no docstring: it is the description the model reads "
                "to choose the tool (or pass description=)"
            )
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        return FunctionTool(
            name=tool_name,
            description=text,
            arguments=arguments,
            function=_calling(function, list(arguments.model_fields), context_parameter),
            approval=approval,
            retry_safe=retry_safe,
            timeout_seconds=seconds,
            local=local,
            wrapped=function,
        )

    return make if function is None else make(function)


def _arguments_model(
    function: Callable[..., Any], tool_name: str
) -> tuple[type[BaseModel], str | None]:
    """The pydantic model of the function's arguments, and the parameter (if any) that
    receives the ToolContext."""
    try:
        signature = inspect.signature(function)
        hints = typing.get_type_hints(function, include_extras=True)
    except (NameError, TypeError, ValueError) as err:
        raise ToolDefinitionError(
            f"tool {tool_name!r}: its type hints cannot be read ({err}); define the types "
            "they name at module level"
        ) from err
    fields: dict[str, Any] = {}
    context_parameter: str | None = None
    for parameter in signature.parameters.values():
        where = f"tool {tool_name!r}: parameter {parameter.name!r}"
        if parameter.kind in _NOT_ARGUMENTS or parameter.kind == parameter.POSITIONAL_ONLY:
            raise ToolDefinitionError(
                f"{where} is not a named argument: the model passes arguments by name"
            )
        hint = hints.get(parameter.name, inspect.Parameter.empty)
        if hint is ToolContext:
            if context_parameter is not None:
                raise ToolDefinitionError(f"{where} asks for the ToolContext a second time")
            context_parameter = parameter.name
            continue
        if hint is inspect.Parameter.empty:
            raise ToolDefinitionError(
                f"{where} has no type hint: the model's schema for it comes from one"
            )
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        fields[parameter.name] = (hint, default)
    model_name = "".join(part.title() for part in tool_name.split("_")) + "Arguments"
    try:
        model = create_model(model_name, **fields)
        model.model_json_schema()
    except Exception as err:  # pydantic's schema errors, raised for the first bad type
        culprit = _unschematic(fields)
        what = (
            f"parameter {culprit!r} has type {_type_name(fields[culprit][0])}, which"
            if culprit is not None
            else f"its arguments ({str(err).splitlines()[0]}), which"
        )
        raise ToolDefinitionError(
            f"tool {tool_name!r}: {what} pydantic cannot describe as JSON schema; use standard "
            "types, pydantic models or dataclasses"
        ) from err
    return model, context_parameter


def _unschematic(fields: dict[str, Any]) -> str | None:
    """The first field whose type alone has no JSON schema."""
    for field_name, (hint, default) in fields.items():
        try:
            create_model("Probe", value=(hint, default)).model_json_schema()
        except Exception:  # any schema error marks the culprit
            return field_name
    return None


def _type_name(hint: Any) -> str:
    return hint.__qualname__ if isinstance(hint, type) else repr(hint)


def _calling(
    function: Callable[..., Any], names: list[str], context_parameter: str | None
) -> Callable[[BaseModel, ToolContext], Awaitable[str]] | Callable[[BaseModel, ToolContext], str]:
    """`function` as a Tool calls it: validated arguments by name, the context if asked."""

    def keywords(arguments: BaseModel, context: ToolContext) -> dict[str, Any]:
        given = {field: getattr(arguments, field) for field in names}
        if context_parameter is not None:
            given[context_parameter] = context
        return given

    if inspect.iscoroutinefunction(function):

        async def call_async(arguments: BaseModel, context: ToolContext) -> str:
            return as_text(await function(**keywords(arguments, context)))

        return call_async

    def call(arguments: BaseModel, context: ToolContext) -> str:
        return as_text(function(**keywords(arguments, context)))

    return call


def as_text(result: object) -> str:
    """What the model is told a call gave: text as it is, anything else as JSON."""
    if isinstance(result, str):
        return result
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    return to_json(result).decode()
