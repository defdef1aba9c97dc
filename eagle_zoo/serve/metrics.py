"""Prometheus metrics of one server, in its own registry (two apps in one process
never share counters). Each is offered under an ``eagle_zoo:`` name and under vLLM's
``vllm:`` name, so dashboards written for vLLM read it unchanged.

Server side (counted by the HTTP handlers, one per prompt/choice):
  eagle_zoo:request_success_total{finished_reason}   vllm:request_success_total{finished_reason}
  eagle_zoo:request_failure_total{reason}            bad_request | aborted | error (eagle_zoo: only)
  eagle_zoo:server_prompt_tokens_total               vllm:prompt_tokens_total
  eagle_zoo:server_generation_tokens_total           vllm:generation_tokens_total
  eagle_zoo:time_to_first_token_seconds              vllm:time_to_first_token_seconds
  eagle_zoo:e2e_request_latency_seconds              vllm:e2e_request_latency_seconds
Engine side (read from the engine thread's snapshot at scrape time), both prefixes:
  num_requests_running, num_requests_waiting (gauges)
  spec_decode_num_drafts_total, spec_decode_num_draft_tokens_total,
  spec_decode_num_accepted_tokens_total, spec_decode_num_accepted_tokens_per_pos_total{position}
  eagle_zoo:spec_decode_mean_acceptance_length = 1 + accepted / drafts
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..engine.metrics import PREFIX, VLLM_PREFIX, Counter as EngineCounter, Gauge as EngineGauge, Vector

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine_loop):
        r = self.registry = CollectorRegistry()
        self.success = [Counter(p + "request_success", "Finished requests, by finish reason",
                                ["finished_reason"], registry=r) for p in (PREFIX, VLLM_PREFIX)]
        self.failure = Counter("eagle_zoo:request_failure", "Requests that did not finish: bad_request "
                               "(400), aborted (client gone), error (failed inside)", ["reason"], registry=r)
        self.prompt_tokens = [Counter(name, "Prompt tokens of finished requests", registry=r)
                              for name in ("eagle_zoo:server_prompt_tokens", "vllm:prompt_tokens")]
        self.generation_tokens = [Counter(name, "Generated tokens of finished requests", registry=r)
                                  for name in ("eagle_zoo:server_generation_tokens", "vllm:generation_tokens")]
        self.ttfts = [Histogram(p + "time_to_first_token_seconds", "Time to first token",
                                buckets=_LATENCY_BUCKETS, registry=r) for p in (PREFIX, VLLM_PREFIX)]
        self.e2e = [Histogram(p + "e2e_request_latency_seconds", "Request latency, arrival to finish",
                              buckets=_LATENCY_BUCKETS, registry=r) for p in (PREFIX, VLLM_PREFIX)]
        r.register(_EngineCollector(engine_loop))

    def finished(self, reason: str, prompt_tokens: int, generation_tokens: int, latency_s: float) -> None:
        for c in self.success:
            c.labels(finished_reason=reason).inc()
        for c in self.prompt_tokens:
            c.inc(prompt_tokens)
        for c in self.generation_tokens:
            c.inc(generation_tokens)
        for h in self.e2e:
            h.observe(latency_s)

    def first_token(self, seconds: float) -> None:
        for h in self.ttfts:
            h.observe(seconds)

    def failed(self, reason: str) -> None:
        self.failure.labels(reason=reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    """Reads the snapshot the engine thread publishes after each step, so a scrape
    never sees one step half counted."""

    def __init__(self, engine_loop):
        self.loop = engine_loop

    def collect(self):
        snap = self.loop.snapshot
        for prefix in (PREFIX, VLLM_PREFIX):
            for key in ("running", "waiting"):
                yield GaugeMetricFamily(f"{prefix}num_requests_{key}", f"Requests {key} in the engine",
                                        value=snap[key])
            # The speculative counters; the engine's request counters are the server's own above.
            for m in snap["spec"] or ():
                if not m.name.startswith("spec_decode_"):
                    continue
                name = prefix + m.name
                if isinstance(m, Vector):
                    family = CounterMetricFamily(name, f"engine metric {name}, by draft position",
                                                 labels=["position"])
                    for i, v in enumerate(m.values):
                        family.add_metric([str(i)], v)
                elif isinstance(m, (EngineCounter, EngineGauge)):
                    cls = GaugeMetricFamily if isinstance(m, EngineGauge) else CounterMetricFamily
                    family = cls(name, f"engine metric {name}", labels=sorted(m.labels))
                    family.add_metric([m.labels[k] for k in sorted(m.labels)], m.value)
                else:
                    continue
                yield family
        mal = snap.get("mean_acceptance_length")
        if mal is not None:
            yield GaugeMetricFamily("eagle_zoo:spec_decode_mean_acceptance_length",
                                    "Tokens per verification step: 1 + accepted / drafts (NaN before any)",
                                    value=mal)
