"""The metric types ``LLM.get_metrics()`` returns, with vLLM's names and attributes
(vLLM's ``vllm.v1.metrics.reader``): ``Counter`` / ``Gauge`` (``.value``), ``Vector``
(``.values``, one per draft position), ``Histogram`` (``.count``, ``.sum``, ``.buckets``);
all have ``.name`` and ``.labels``.

    from eagle_zoo.metrics import Counter, Gauge, Histogram, Vector
"""
from .engine.metrics import Counter, Gauge, Histogram, Metric, Vector

__all__ = ["Counter", "Gauge", "Histogram", "Metric", "Vector"]
