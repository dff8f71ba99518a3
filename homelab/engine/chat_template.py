"""Chat templates (Jinja, as shipped in GGUF metadata), compiled and rendered safely.

A chat template is code written by whoever published the model, and it runs on every
request. :class:`ChatTemplate` compiles it once in Jinja's immutable sandbox, with the
helpers Hugging Face templates expect (``raise_exception``, ``strftime_now``, a ``tojson``
that keeps non-ASCII), and bounds what a hostile template can do:

- attribute access outside the sandbox (``__class__``, ``__globals__``...) raises at once
  instead of quietly rendering as empty;
- every ``for`` loop, call, filter and arithmetic operator checks a render deadline;
- operations that can multiply sizes (``*``, ``**``, ``%``, ``replace``, ``join``,
  ``indent``, wide format specs...) are refused *before* they run when their result would
  exceed the output budget, and every produced value is measured afterwards;
- the rendered text is streamed and stops at the output budget.

Any failure becomes an :class:`~homelab.errors.EngineError` that starts with "the model's
chat template failed". The budget guards are defence in depth for resource use, not a
proof: a C-level builtin can still do quadratic work on inputs within the budget.

Parsing what the model writes back (tool calls, reasoning) is the server's business:
:mod:`homelab.server.tools`, :mod:`homelab.server.reasoning`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import wraps
from typing import Any

import jinja2
import jinja2.meta
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.runtime import Context, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from homelab.errors import EngineError

DEFAULT_MAX_OUTPUT_CHARS = 1 << 20
DEFAULT_RENDER_TIMEOUT_S = 2.0
MAX_INT_BITS = 4096  # no chat template needs bigger numbers; 10**10**10 must not run
WIDE_FORMAT_SPEC = re.compile(r"\d{7,}")  # '{:>999999999}' or '%999999999d'
TEMPLATE_FAILED = "the model's chat template failed"
TEMPLATE_HINT = "Use another chat template for this model, or send a raw completion."


class TemplateBudgetError(jinja2.TemplateError):
    """A template went over its time or size budget."""


@dataclass
class _Budget:
    deadline_s: float  # time.monotonic() value
    max_chars: int

    def check_time(self) -> None:
        if time.monotonic() > self.deadline_s:
            raise TemplateBudgetError("rendering took too long (a runaway loop?)")

    def check_size(self, size: int, what: str) -> None:
        if size > self.max_chars:
            raise TemplateBudgetError(f"{what} would exceed {self.max_chars} characters")


_NO_RENDER_BUDGET = _Budget(deadline_s=float("inf"), max_chars=DEFAULT_MAX_OUTPUT_CHARS)
_budget: ContextVar[_Budget] = ContextVar("homelab_chat_template_budget")


def _current_budget() -> _Budget:
    # Compile-time constant folding calls filters outside a render: default limits apply.
    return _budget.get(_NO_RENDER_BUDGET)


def _deep_size(value: object, cap: int) -> int:
    """Characters-ish needed to print ``value``; stops counting once past ``cap``.

    Shared references count each time they appear, since printing repeats them: this is
    what catches ``[[s] * 1000] * 1000``. Cost is O(min(size, cap)).
    """
    total = 0
    stack = [value]
    while stack and total <= cap:
        item = stack.pop()
        if isinstance(item, str | bytes):
            total += len(item) + 1
        elif isinstance(item, bool | float | None):
            total += 1
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 1
        elif isinstance(item, Mapping):
            total += len(item) + 1
            for key, val in item.items():
                stack.extend((key, val))
        elif isinstance(item, list | tuple | set | frozenset):
            total += len(item) + 1
            stack.extend(item)
        else:
            total += 1
    return total


def _guard_value(value: Any, what: str) -> Any:
    budget = _current_budget()
    budget.check_time()
    budget.check_size(_deep_size(value, budget.max_chars), what)
    return value


def _estimate_binop(operator: str, left: Any, right: Any, cap: int) -> int:
    """Size of ``left <operator> right``, estimated before computing it."""
    if operator == "**":
        both_ints = isinstance(left, int) and isinstance(right, int)
        if both_ints and right > 0 and left.bit_length() * right > MAX_INT_BITS:
            raise TemplateBudgetError(f"the number {left}**{right} is too large")
        return 0
    if operator == "*":
        if isinstance(left, int) and isinstance(right, int):
            return (left.bit_length() + right.bit_length()) // 3
        count, seq = (left, right) if isinstance(left, int) else (right, left)
        if isinstance(count, int) and isinstance(seq, str):
            return len(seq) * max(count, 0)
        if isinstance(count, int) and not isinstance(seq, int | float):
            return _deep_size(seq, cap) * max(count, 0)
        return 0
    if operator == "+":
        return _deep_size(left, cap) + _deep_size(right, cap)
    if operator == "%" and isinstance(left, str):
        if WIDE_FORMAT_SPEC.search(left) or _has_huge_int(right):
            raise TemplateBudgetError("a %-format field is too wide")
        return len(left) + _deep_size(right, cap)
    return 0


def _has_huge_int(values: object) -> bool:
    items = values if isinstance(values, tuple | list) else (values,)
    limit = _current_budget().max_chars
    return any(isinstance(item, int) and abs(item) > limit for item in items)


def _estimate_str_method(name: str, text: str, args: Sequence[Any], cap: int) -> int:
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str):
        return len(text) + text.count(args[0]) * len(str(args[1]))
    if name == "join" and args:
        items = args[0]
        return _deep_size(items, cap) + len(text) * (len(items) if hasattr(items, "__len__") else 1)
    if name == "expandtabs":
        tab_size = int(args[0]) if args and isinstance(args[0], int) else 8
        return len(text) + text.count("\t") * tab_size
    if name in ("format", "format_map") and WIDE_FORMAT_SPEC.search(text):
        raise TemplateBudgetError("a format field is too wide")
    return 0


def _estimate_filter(name: str, value: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    cap = _current_budget().max_chars
    if name == "replace" and isinstance(value, str) and len(args) >= 2:
        return _estimate_str_method("replace", value, args, cap)
    if name == "join" and hasattr(value, "__len__"):
        separator = str(args[0] if args else kwargs.get("d", ""))
        return _deep_size(value, cap) + len(separator) * len(value)
    if name == "indent" and isinstance(value, str):
        width = args[0] if args else kwargs.get("width", 4)
        width_chars = len(width) if isinstance(width, str) else int(width)
        return len(value) + (value.count("\n") + 1) * width_chars
    if name == "wordwrap" and isinstance(value, str):
        width = max(int(args[0] if args else kwargs.get("width", 79)), 1)
        wrap = kwargs.get("wrapstring") or (args[2] if len(args) > 2 else None) or "\n"
        return len(value) + (len(value) // width + 1) * len(str(wrap))
    if name == "tojson":
        indent = args[1] if len(args) > 1 else kwargs.get("indent")
        indent_chars = len(indent) if isinstance(indent, str) else int(indent or 0)
        return _deep_size(value, cap) * (2 + indent_chars)
    if name == "format" and isinstance(value, str) and WIDE_FORMAT_SPEC.search(value):
        raise TemplateBudgetError("a format field is too wide")
    if name == "sum" and ("start" in kwargs or len(args) > 1) and hasattr(value, "__len__"):
        return _deep_size(value, cap) * len(value)  # concatenating sequences is quadratic
    return 0


def _guarded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    passes_context = getattr(func, "jinja_pass_arg", None) is not None

    @wraps(func)  # keeps ``jinja_pass_arg`` so Jinja still passes the context first
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = _current_budget()
        budget.check_time()
        value, rest = (args[1], args[2:]) if passes_context else (args[0], args[1:])
        if _has_huge_int(list(rest) + list(kwargs.values())):
            raise TemplateBudgetError(f"an argument of the '{name}' filter is too large")
        budget.check_size(_estimate_filter(name, value, rest, kwargs), f"the '{name}' filter")
        return _guard_value(func(*args, **kwargs), f"the '{name}' filter")

    return guarded


def _guarded_iter(iterable: Iterable[Any]) -> Iterator[Any]:
    budget = _current_budget()
    for item in iterable:
        budget.check_time()
        yield item


_ITER_GUARD = "homelab_guard_iter"
_VALUE_GUARD = "homelab_guard_value"


def _wrap_in_filter(node: nodes.Node, name: str) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


class _GuardInserter(NodeTransformer):
    """Rewrites the parsed template so loops and literals pass through our guards."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _wrap_in_filter(node.iter, _ITER_GUARD)
        return node

    def _guard_expression(self, node: nodes.Node) -> nodes.Node:
        self.generic_visit(node)
        return _wrap_in_filter(node, _VALUE_GUARD)

    visit_Concat = _guard_expression
    visit_List = _guard_expression
    visit_Dict = _guard_expression

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        if node.ctx != "load":  # ``{% for a, b in ... %}`` targets must stay tuples
            return node
        return self._guard_expression(node)


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` (HF's assistant-mask marker) renders its body."""

    tags = {"generation"}  # noqa: RUF012  (Jinja's Extension API is a class attribute)

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _ChatSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%", "//", "/"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> Undefined:
        # Jinja's default renders unsafe access as empty text; a probing template should fail.
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} is unsafe"
        )

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        budget = _current_budget()
        budget.check_time()
        estimate = _estimate_binop(operator, left, right, budget.max_chars)
        budget.check_size(estimate, f"the '{operator}' operation")
        return _guard_value(super().call_binop(context, operator, left, right), operator)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        budget = _current_budget()
        budget.check_time()
        if _has_huge_int(list(args) + list(kwargs.values())):
            raise TemplateBudgetError("a call argument is too large")
        target = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        owner = getattr(target, "__self__", None)
        if isinstance(owner, str):
            estimate = _estimate_str_method(target.__name__, owner, args, budget.max_chars)
            budget.check_size(estimate, f"str.{target.__name__}()")
        result = super().call(__context, __obj, *args, **kwargs)
        return _guard_value(result, "a call")


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(format_string: str) -> str:
    return datetime.now().strftime(format_string)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _make_environment() -> _ChatSandbox:
    env = _ChatSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _GenerationTag],
    )
    env.globals.pop("lipsum", None)  # lipsum(n=10**6) is an easy way to eat memory
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    env.filters["tojson"] = _tojson
    env.filters = {name: _guarded_filter(name, func) for name, func in env.filters.items()}
    env.filters[_ITER_GUARD] = _guarded_iter
    env.filters[_VALUE_GUARD] = lambda value: _guard_value(value, "a value")
    return env


def _template_error(problem: str, exc: BaseException | None = None) -> EngineError:
    detail = f": {exc}" if exc is not None and str(exc) else ""
    message = f"{TEMPLATE_FAILED}: {problem}{detail}".rstrip()
    if not message.endswith((".", "!", "?")):
        message += "."
    return EngineError(message, hint=TEMPLATE_HINT)


class ChatTemplate:
    """A model's chat template, compiled once, rendered safely many times (thread-safe)."""

    def __init__(
        self,
        source: str,
        bos_token: str = "",
        eos_token: str = "",
        *,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        render_timeout_s: float = DEFAULT_RENDER_TIMEOUT_S,
    ) -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.max_output_chars = max_output_chars
        self.render_timeout_s = render_timeout_s
        self._env = _make_environment()
        try:
            tree = self._env.parse(source)
            self._uses_tools = "tools" in jinja2.meta.find_undeclared_variables(tree)
            guarded = _GuardInserter().visit(tree)
            code = self._env.compile(guarded)
            self._template = self._env.template_class.from_code(
                self._env, code, self._env.make_globals(None), None
            )
        except jinja2.TemplateSyntaxError as exc:
            problem = f"it does not compile (line {exc.lineno}: {exc.message})"
            raise _template_error(problem) from exc
        except Exception as exc:
            raise _template_error("it does not compile", exc) from exc

    @property
    def supports_tools(self) -> bool:
        """Whether the template reads the ``tools`` variable (so tools can be offered)."""
        return self._uses_tools

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        variables: dict[str, Any] = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
            "messages": list(messages),
            "tools": list(tools) if tools is not None else None,
            "add_generation_prompt": add_generation_prompt,
        }
        input_chars = _deep_size(variables, cap=1 << 62)
        budget = _Budget(
            deadline_s=time.monotonic() + self.render_timeout_s,
            max_chars=self.max_output_chars + 2 * input_chars,
        )
        token = _budget.set(budget)
        try:
            return self._render_bounded(variables, budget)
        except RecursionError as exc:
            raise _template_error("it recursed too deeply") from exc
        except MemoryError as exc:
            raise _template_error("it ran out of memory") from exc
        except EngineError:
            raise
        except Exception as exc:
            raise _template_error(str(exc) or type(exc).__name__) from exc
        finally:
            _budget.reset(token)

    def _render_bounded(self, variables: Mapping[str, Any], budget: _Budget) -> str:
        pieces: list[str] = []
        total_chars = 0
        for piece in self._template.generate(**variables):
            total_chars += len(piece)
            budget.check_size(total_chars, "the rendered prompt")
            budget.check_time()
            pieces.append(piece)
        return "".join(pieces)
