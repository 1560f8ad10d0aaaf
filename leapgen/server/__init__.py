"""`leapgen serve`: an OpenAI-compatible HTTP server (completions, chat completions, models) over one LLM."""

from leapgen.server.app import build_app, default_model_name

__all__ = ["build_app", "default_model_name"]
