"""fleetscope: correct fleet statistics for vLLM inference engines."""

__version__ = "0.1.0"
