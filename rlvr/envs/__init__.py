"""Multi-turn environments and tool use (docs/multi-turn.md).

Layers (no import cycle): base (protocol, registry) <- tool_calls (call format) <- tools (tool set) <- tool_env
(the tool-calling environment) <- builtin (registered environments); episode (the token-exact loop) depends
only on base; tasks (dataset generator) depends on nothing here.
"""
