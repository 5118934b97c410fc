"""Training backends behind one interface, and the registry of their names."""

from strategies.base import RunContext, Strategy, StrategyError
from strategies.memory import MemoryBreakdown
from strategies.registry import StrategyRegistry, default_registry

__all__ = ["MemoryBreakdown", "RunContext", "Strategy", "StrategyError", "StrategyRegistry", "default_registry"]
