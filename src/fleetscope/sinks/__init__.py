"""Sinks: W&B, JSONL, terminal, TensorBoard, MLflow. Optional ones import lazily."""

from fleetscope.sinks.base import Sink, SinkBase, Value

__all__ = ["Sink", "SinkBase", "Value"]
