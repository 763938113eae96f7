"""Tool calls in the model's own text: the convention rollflow reads, and how tools reach the prompt.

What it is. A model served by rollflow produces plain tokens; OpenAI's ``tool_calls`` are read out of
its text with the Hermes convention that Qwen2.5/Qwen3, Hermes and many open chat templates use:

    <tool_call>{"name": "add", "arguments": {"a": 12, "b": 35}}</tool_call>

One block per call, any number of blocks, whitespace around the JSON allowed. ``parse_tool_calls``
returns the text outside the blocks (stripped; ``None`` when empty, as OpenAI does) as ``content``, and
one OpenAI ``tool_call`` per block (``arguments`` re-serialised as a JSON string, ids
``call_{turn}_{i}``). A block whose JSON does not parse, or lacks a string ``name``, is left in the
content as text and counted (``parse_errors``): the agent sees what the model wrote, and the episode
goes on.

Tools reach the prompt through the tokenizer's chat template (``apply_chat_template(..., tools=...)``)
when the template uses ``tools``. A template that does not (the tiny model's ChatML) gets the same
information as a system message, ``tools_system_text``, in the convention above; assistant messages
that carry ``tool_calls`` are rendered back as those blocks (``template_messages``). Either way only
a *new segment* re-renders earlier assistant turns: a continued conversation keeps the exact tokens the
model produced (``rollflow.agents.chat_prompt``).

A second, compact convention, ``pythonic`` (Llama 3.2's, vLLM's ``pythonic`` tool parser), is chosen
per workflow (``AgentWorkflow(tool_format="pythonic")``): the whole reply is a Python list of calls with
keyword arguments whose values are literals, and the tools block is one signature a line::

    [lookup(key='ab')]                                 (the model's reply: one call)
    tools: lookup(key)                                 (the system message of a template without tools)

A reply that is not such a list (free text, positional arguments, a non-literal value) is content, as
OpenAI returns it; one that starts with ``[`` + a name + ``(`` but does not parse is counted as a parse
error. It costs a fifth of Hermes' tokens per call (18 vs 64 characters for ``lookup(key='ab')``), which
is what lets a per-character tiny model learn tool use on CPU (``configs/tiny_agent.yaml``).

What it is not: no tokenization, no HTTP, no execution of tools (the agent runs its tools).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from rollflow.agents.openai_protocol import Message, text_content

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
ToolFormat = Literal["hermes", "pythonic"]
TOOL_FORMATS: tuple[str, ...] = ("hermes", "pythonic")
_PYTHONIC_START = re.compile(r"\s*\[\s*[A-Za-z_][\w.-]*\(")
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


@dataclass
class ParsedReply:
    """The model's text as an OpenAI assistant message."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    parse_errors: int = 0

    def message(self) -> Message:
        msg: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


def parse_tool_calls(text: str, *, turn: int, fmt: ToolFormat = "hermes") -> ParsedReply:
    """Split ``text`` into content and ``<tool_call>{json}</tool_call>`` blocks (module docstring);
    with ``fmt="pythonic"``, read the whole reply as ``[name(k=v, ...), ...]``."""
    if fmt == "pythonic":
        return _parse_pythonic(text, turn=turn)
    calls: list[dict[str, Any]] = []
    errors = 0
    kept: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        call = _call_of(m.group(1))
        if call is None:
            errors += 1
            continue  # stays in the content
        kept.append(text[pos : m.start()])
        pos = m.end()
        name, arguments = call
        calls.append(_openai_call(turn, len(calls), name, arguments))
    if not calls:
        return ParsedReply(content=text, parse_errors=errors)
    kept.append(text[pos:])
    content = "".join(kept).strip()
    return ParsedReply(content=content or None, tool_calls=calls, parse_errors=errors)


def _openai_call(turn: int, i: int, name: str, arguments: Any) -> dict[str, Any]:
    return {
        "id": f"call_{turn}_{i}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _parse_pythonic(text: str, *, turn: int) -> ParsedReply:
    """``[f(a=1), g(b='x')]`` as calls; anything else is content (a parse error if it looked like calls)."""
    if not _PYTHONIC_START.match(text):
        return ParsedReply(content=text)
    try:
        tree = ast.parse(text.strip(), mode="eval").body
        if not isinstance(tree, ast.List) or not tree.elts:
            raise ValueError("not a list of calls")
        calls = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, ast.Name):
                raise ValueError("a call must be name(keyword=literal, ...)")
            if any(kw.arg is None for kw in node.keywords):
                raise ValueError("no **kwargs")
            args = {str(kw.arg): ast.literal_eval(kw.value) for kw in node.keywords}
            json.dumps(args)  # JSON-representable (no tuples of sets, bytes, ...)
            calls.append(_openai_call(turn, len(calls), node.func.id, args))
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return ParsedReply(content=text, parse_errors=1)
    return ParsedReply(content=None, tool_calls=calls)


def _call_of(raw: str) -> tuple[str, Any] | None:
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            return None
    return obj["name"], args


def tool_call_text(name: str, arguments: Any) -> str:
    """One call in the convention, as ``template_messages`` renders it (and as a model should write it)."""
    return f"{TOOL_CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments})}{TOOL_CALL_CLOSE}"


def pythonic_calls_text(calls: list[tuple[str, Any]]) -> str:
    """Calls in the pythonic convention: ``[name(k=v, ...), ...]`` with Python literals (``repr``)."""
    parts = []
    for name, arguments in calls:
        args = arguments if isinstance(arguments, dict) else {}
        parts.append(f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})")
    return "[" + ", ".join(parts) + "]"


def tools_system_text(tools: list[dict[str, Any]], fmt: ToolFormat = "hermes") -> str:
    """The tools block of a template that does not render ``tools`` itself: one JSON signature a line
    (hermes), or ``tools: name(param, ...)`` with the description after `` - `` when given (pythonic)."""
    if fmt == "pythonic":
        sigs = []
        for t in tools:
            fn = t.get("function", t) if isinstance(t, dict) else {}
            fn = fn if isinstance(fn, dict) else {}
            schema = fn.get("parameters")
            props = schema.get("properties") if isinstance(schema, dict) else None
            params = ", ".join(str(p) for p in props) if isinstance(props, dict) else ""  # names only
            desc = f" - {fn['description']}" if fn.get("description") else ""
            sigs.append(f"{fn.get('name', '')}({params}){desc}")
        return "tools: " + "; ".join(sigs)
    lines = [json.dumps(t.get("function", t), separators=(",", ":")) for t in tools]
    return (
        "<tools>\n" + "\n".join(lines) + "\n</tools>\n"
        f'Call a tool with {TOOL_CALL_OPEN}{{"name": ..., "arguments": {{...}}}}{TOOL_CALL_CLOSE}'
    )


def _arguments(raw: Any) -> Any:
    """OpenAI sends ``arguments`` as a JSON string; chat templates expect the object."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, RecursionError):
            return raw
    return raw


def template_messages(
    messages: list[Message],
    tools: list[dict[str, Any]] | None,
    *,
    template_has_tools: bool,
    fmt: ToolFormat = "hermes",
) -> list[Message]:
    """``messages`` in the form a chat template renders.

    Content becomes plain text; ``developer`` becomes ``system``. With a template that renders tools,
    assistant ``tool_calls`` keep their structure with ``arguments`` as objects (Hugging Face's
    convention). Without one, the calls are appended to the assistant's content as ``<tool_call>``
    blocks (``fmt="pythonic"``: as one ``[...]`` list) and ``tools`` become a leading system message
    (merged into the first one if there is one).
    """
    out: list[Message] = []
    for i, m in enumerate(messages):
        role = "system" if m["role"] == "developer" else m["role"]
        msg: Message = {"role": role, "content": text_content(m.get("content"), where=f"messages[{i}]")}
        calls = m.get("tool_calls") or []
        if calls and template_has_tools:
            msg["tool_calls"] = [
                {
                    "id": c.get("id"),
                    "type": "function",
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": _arguments(c["function"].get("arguments")),
                    },
                }
                for c in calls
            ]
        elif calls:
            pairs = [(c["function"]["name"], _arguments(c["function"].get("arguments"))) for c in calls]
            if fmt == "pythonic":
                msg["content"] += pythonic_calls_text(pairs)
            else:
                msg["content"] += "".join(tool_call_text(name, args) for name, args in pairs)
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None:
                msg[key] = m[key]
        out.append(msg)
    if tools and not template_has_tools:
        block = tools_system_text(tools, fmt)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": block + "\n\n" + out[0]["content"]}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def normalized(m: Message) -> tuple[Any, ...]:
    """What must be equal for two messages to be "the same turn": role, text and calls (name + args).

    Tool-call ids and fields the ``openai`` client adds (``refusal``, ``annotations``, ...) do not count.
    """
    calls = tuple(
        (c["function"]["name"], json.dumps(_arguments(c["function"].get("arguments")), sort_keys=True))
        for c in (m.get("tool_calls") or [])
    )
    role = "system" if m.get("role") == "developer" else m.get("role")
    return (role, text_content(m.get("content"), where="message"), calls, m.get("tool_call_id"))
