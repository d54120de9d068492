"""Tool calls written as text: what small models really write, and prose that must stay prose.

The samples are the shapes seen from real models (Qwen2.5-Coder 0.5B/1.5B served by
llama.cpp with templates that do not parse tool calls, Llama 3.x, Mistral, Hermes-style
fine-tunes) and answers that mention JSON without calling anything.
"""

from __future__ import annotations

import json

import pytest

from waystation.activities.text_tool_calls import RecoveredToolCall, recover_tool_calls

TOOLS = {"calculator", "write_file", "read_file", "list_files", "run_shell"}


def calls(text: str, tools: set[str] = TOOLS) -> list[tuple[str, dict[str, object], str]]:
    return [(c.name, json.loads(c.arguments), c.form) for c in recover_tool_calls(text, tools)]


# Each sample: what the model wrote, the calls it means (name, arguments, form).
CALL_SAMPLES: list[tuple[str, list[tuple[str, dict[str, object], str]]]] = [
    # Qwen2.5-Coder-1.5B with its stock template: doubled braces, one extra closing brace.
    (
        '{{"name": "calculator", "arguments": {"expression": "(12 + 30) * 7"}}}',
        [("calculator", {"expression": "(12 + 30) * 7"}, "bare")],
    ),
    # Every brace doubled, as a template's escaping would leave it.
    (
        '{{"name": "calculator", "arguments": {{"expression": "2^10"}}}}',
        [("calculator", {"expression": "2^10"}, "bare")],
    ),
    # The plain object, alone.
    (
        '{"name": "write_file", "arguments": {"path": "scratch/answer.txt", "content": "294"}}',
        [("write_file", {"path": "scratch/answer.txt", "content": "294"}, "bare")],
    ),
    # A ```json block after a sentence (Qwen2.5-Coder-0.5B).
    (
        "To find the result, I will use the calculator.\n\n```json\n"
        '{\n  "name": "calculator",\n  "arguments": {\n    "expression": "(12 + 30) * 7"\n  }\n}'
        "\n```",
        [("calculator", {"expression": "(12 + 30) * 7"}, "fenced")],
    ),
    # A fence without a language, holding a list of two calls.
    (
        "```\n"
        '[{"name": "calculator", "arguments": {"expression": "(12 + 30) * 7"}},\n'
        ' {"name": "calculator", "arguments": {"expression": "2**10"}}]\n'
        "```",
        [
            ("calculator", {"expression": "(12 + 30) * 7"}, "fenced"),
            ("calculator", {"expression": "2**10"}, "fenced"),
        ],
    ),
    # Qwen/Hermes tags, two calls.
    (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "(12 + 30) * 7"}}\n'
        "</tool_call>\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "2 ** 10"}}\n</tool_call>',
        [
            ("calculator", {"expression": "(12 + 30) * 7"}, "tagged"),
            ("calculator", {"expression": "2 ** 10"}, "tagged"),
        ],
    ),
    # A tag the model never closed (it stopped at its end-of-turn token).
    (
        '<tool_call>\n{"name": "run_shell", "arguments": {"command": "echo hello"}}',
        [("run_shell", {"command": "echo hello"}, "tagged")],
    ),
    # Prose inside and around the tags; a fenced block inside a tag.
    (
        "Let me list the files first.\n<tool_call>\n```json\n"
        '{"name": "list_files", "arguments": {"path": "."}}\n```\n</tool_call>',
        [("list_files", {"path": "."}, "tagged")],
    ),
    # Arguments as a JSON string, as the OpenAI wire format carries them.
    (
        '{"name": "calculator", "arguments": "{\\"expression\\": \\"6 * 7\\"}"}',
        [("calculator", {"expression": "6 * 7"}, "bare")],
    ),
    # `tool` and `parameters`, Llama 3.x style with "type".
    (
        '{"type": "function", "tool": "read_file", "parameters": {"path": "notes.txt"}}',
        [("read_file", {"path": "notes.txt"}, "bare")],
    ),
    (
        '{"type": "function", "name": "calculator", "parameters": {"expression": "1+1"}}',
        [("calculator", {"expression": "1+1"}, "bare")],
    ),
    # The OpenAI message shapes, copied from examples the model saw.
    (
        '{"type": "function", "function": {"name": "calculator", '
        '"arguments": "{\\"expression\\": \\"3*3\\"}"}}',
        [("calculator", {"expression": "3*3"}, "bare")],
    ),
    (
        '```json\n{"tool_calls": [{"id": "call_1", "type": "function", "function": '
        '{"name": "list_files", "arguments": "{}"}}]}\n```',
        [("list_files", {}, "fenced")],
    ),
    # Mistral's marker before a list.
    (
        '[TOOL_CALLS] [{"name": "calculator", "arguments": {"expression": "2^10"}}]',
        [("calculator", {"expression": "2^10"}, "bare")],
    ),
    # A ReAct-style label, then the call on its line.
    (
        "Thought: I need to compute the product.\n"
        'Action: {"name": "calculator", "arguments": {"expression": "42 * 7"}}',
        [("calculator", {"expression": "42 * 7"}, "bare")],
    ),
    # A sentence, then the call on its own line, then a full stop.
    (
        "I'll write the results now.\n"
        '{"name": "write_file", "arguments": {"path": "scratch/answer.txt", '
        '"content": "294\\n1024\\n"}}.',
        [("write_file", {"path": "scratch/answer.txt", "content": "294\n1024\n"}, "bare")],
    ),
    # Two bare calls on two lines.
    (
        '{"name": "calculator", "arguments": {"expression": "(12 + 30) * 7"}}\n'
        '{"name": "calculator", "arguments": {"expression": "2^10"}}',
        [
            ("calculator", {"expression": "(12 + 30) * 7"}, "bare"),
            ("calculator", {"expression": "2^10"}, "bare"),
        ],
    ),
    # A call with no arguments at all, and one with null arguments.
    ('{"name": "list_files"}', [("list_files", {}, "bare")]),
    ('{"name": "list_files", "arguments": null}', [("list_files", {}, "bare")]),
    # Pretty-printed over several lines, with indentation.
    (
        '    {\n      "name": "run_shell",\n      "arguments": {"command": "echo hello"}\n    }',
        [("run_shell", {"command": "echo hello"}, "bare")],
    ),
    # Reasoning first, then the call: only the call outside <think> counts.
    (
        '<think>Maybe {"name": "run_shell", "arguments": {"command": "rm -rf /"}}? No.</think>\n'
        '{"name": "list_files", "arguments": {"path": "."}}',
        [("list_files", {"path": "."}, "bare")],
    ),
    # Non-ASCII arguments survive as they are.
    (
        '{"name": "write_file", "arguments": {"path": "scratch/grüße.txt", "content": "héllo ✓"}}',
        [("write_file", {"path": "scratch/grüße.txt", "content": "héllo ✓"}, "bare")],
    ),
    # Mixed forms in one message keep text order.
    (
        '```json\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n```\n'
        "and then\n"
        '<tool_call>{"name": "write_file", "arguments": {"path": "scratch/a", "content": "3"}}'
        "</tool_call>",
        [
            ("calculator", {"expression": "1+2"}, "fenced"),
            ("write_file", {"path": "scratch/a", "content": "3"}, "tagged"),
        ],
    ),
    # Qwen2.5-Coder-0.5B: a ```json block, then the same call bare: one call, not two.
    (
        '```json\n{"name": "calculator", "arguments": {"expression": "2^10"}}\n```\n'
        'So the call is:\n{"name": "calculator", "arguments": {"expression": "2^10"}}',
        [("calculator", {"expression": "2^10"}, "fenced")],
    ),
    # The same call twice in any forms, its keys in another order: one call.
    (
        '<tool_call>{"name": "write_file", "arguments": {"path": "a", "content": "3"}}'
        "</tool_call>\n"
        '{"arguments": {"content": "3", "path": "a"}, "name": "write_file"}\n'
        '{"name": "write_file", "arguments": {"path": "a", "content": "4"}}',
        [
            ("write_file", {"path": "a", "content": "3"}, "tagged"),
            ("write_file", {"path": "a", "content": "4"}, "bare"),
        ],
    ),
]


@pytest.mark.parametrize(("text", "expected"), CALL_SAMPLES)
def test_calls_written_as_text_are_recovered(
    text: str, expected: list[tuple[str, dict[str, object], str]]
) -> None:
    assert calls(text) == expected


# Each sample: text that must not become a call.
PROSE_SAMPLES: list[str] = [
    # Plain answers.
    "(12 + 30) * 7 = 294 and 2^10 = 1024. I wrote both to scratch/answer.txt.",
    "The calculator says 294.",
    # JSON mentioned inside a sentence or an inline code span.
    'To call the calculator you would send {"name": "calculator", "arguments": {}} to it.',
    'Use `{"name": "calculator", "arguments": {"expression": "1+1"}}` as the format.',
    # JSON that is not a call: no offered tool named.
    '{"name": "Alice", "arguments": {"age": 3}}',
    '```json\n{"result": 294, "power": 1024}\n```',
    '{"answer": "294"}',
    # A tool that was not offered.
    '{"name": "delete_everything", "arguments": {}}',
    '<tool_call>{"name": "browser", "arguments": {"url": "http://example.com"}}</tool_call>',
    # A past call narrated with its result: an account, not a request.
    '{"name": "calculator", "arguments": {"expression": "6*7"}, "result": 42}',
    # Arguments that are not an object.
    '{"name": "calculator", "arguments": "6*7"}',
    '{"name": "calculator", "arguments": ["6*7"]}',
    # Two argument keys: ambiguous.
    '{"name": "calculator", "arguments": {"expression": "1"}, "parameters": {"expression": "2"}}',
    # A fence that holds a call and more.
    '```json\n{"name": "calculator", "arguments": {"expression": "1"}}\n{"note": "x"}\n```',
    # Code in another language that happens to contain a call-shaped dict.
    '```python\ncall = {"name": "calculator", "arguments": {"expression": "1+1"}}\n```',
    # A call-shaped object followed by more prose on its line.
    '{"name": "calculator", "arguments": {"expression": "1+1"}} is what I would send.',
    # Broken JSON.
    '{"name": "calculator", "arguments": {"expression": "1+1"}',
    "{name: calculator, arguments: {expression: 1+1}}",
    # A list of calls with one stranger in it.
    '[{"name": "calculator", "arguments": {}}, {"name": "other", "arguments": {}}]',
    # Only inside reasoning.
    '<think>{"name": "run_shell", "arguments": {"command": "ls"}}</think>\nNothing to do.',
    # Markdown that uses brackets and braces.
    "See [the docs](https://example.com/calculator) and {this} for details.",
    "",
]


@pytest.mark.parametrize("text", PROSE_SAMPLES)
def test_prose_and_other_json_are_not_calls(text: str) -> None:
    assert recover_tool_calls(text, TOOLS) == []


def test_only_offered_tools_count() -> None:
    text = '{"name": "run_shell", "arguments": {"command": "echo hi"}}'
    assert recover_tool_calls(text, {"calculator"}) == []
    assert recover_tool_calls(text, set()) == []
    assert recover_tool_calls(text, ["run_shell"]) == [
        RecoveredToolCall("run_shell", '{"command": "echo hi"}', "bare")
    ]


def test_arguments_come_back_as_json_object_text() -> None:
    text = '{"name": "calculator", "arguments": {"expression": "6*7"}}'
    (call,) = recover_tool_calls(text, TOOLS)
    assert json.loads(call.arguments) == {"expression": "6*7"}
    assert isinstance(call.arguments, str)


def test_deeply_nested_or_unclosed_brackets_are_not_an_error() -> None:
    for text in ("[" * 50_000 + " calculator", "{" * 50_000 + " calculator", "[1, " * 3_000):
        assert recover_tool_calls(text + " calculator", TOOLS) == []
