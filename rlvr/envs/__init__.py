"""Multi-turn environments and tool use (docs/multi-turn.md).

Layers (no import cycle): base (protocol, registry) <- tool_calls (call format) <- tools (tool set) <-
tool_process (tool set in a child process) and tool_env (the tool-calling environment) <- builtin (registered
environments). The token-exact loop: turns (observation tokenization) <- episode (the loop) <- engine_turns
(engine adapter, Episode -> Sample). tasks (the lookup dataset) depends on nothing here. jobs (staged steps: tool
calls and answer checks handed out to run elsewhere, e.g. the verifier pool) sits between tools and tool_env;
settings (the `env` config section: routing, limits, start-up checks) on top.
"""
