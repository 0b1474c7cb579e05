"""Trace-driven discrete-event simulator of asynchronous agentic RL (virtual clock)."""
