"""Prometheus metrics of one server, in its own registry (two apps in one process
never share counters).

Server side (counted by the HTTP handlers, one per prompt/choice):
  eagle_zoo:request_success_total{finished_reason}   finished requests
  eagle_zoo:request_failure_total{reason}            bad_request | aborted | error
  eagle_zoo:server_prompt_tokens_total, eagle_zoo:server_generation_tokens_total
  eagle_zoo:time_to_first_token_seconds, eagle_zoo:e2e_request_latency_seconds
Engine side (read from the engine thread's snapshot at scrape time):
  eagle_zoo:num_requests_running, eagle_zoo:num_requests_waiting
  every counter of SpecDecodingMetrics.get_metrics() (spec_decode_num_drafts,
  _num_draft_tokens, _num_accepted_tokens, _num_accepted_tokens_per_pos{position}, ...)
  eagle_zoo:spec_decode_mean_acceptance_length = 1 + accepted / drafts
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine_loop):
        r = self.registry = CollectorRegistry()
        self.success = Counter("eagle_zoo:request_success", "Finished requests, by finish reason",
                               ["finished_reason"], registry=r)
        self.failure = Counter("eagle_zoo:request_failure", "Requests that did not finish: bad_request "
                               "(400), aborted (client gone), error (failed inside)", ["reason"], registry=r)
        self.prompt_tokens = Counter("eagle_zoo:server_prompt_tokens", "Prompt tokens of finished requests",
                                     registry=r)
        self.generation_tokens = Counter("eagle_zoo:server_generation_tokens",
                                         "Generated tokens of finished requests", registry=r)
        self.ttft = Histogram("eagle_zoo:time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("eagle_zoo:e2e_request_latency_seconds", "Request latency, arrival to finish",
                             buckets=_LATENCY_BUCKETS, registry=r)
        r.register(_EngineCollector(engine_loop))

    def finished(self, reason: str, prompt_tokens: int, generation_tokens: int, latency_s: float) -> None:
        self.success.labels(finished_reason=reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generation_tokens)
        self.e2e.observe(latency_s)

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
        for key in ("running", "waiting"):
            yield GaugeMetricFamily(f"eagle_zoo:num_requests_{key}", f"Requests {key} in the engine",
                                    value=snap[key])
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for m in snap["spec"] or ():
            if m.name not in families:
                cls = GaugeMetricFamily if m.kind == "gauge" else CounterMetricFamily
                families[m.name] = cls(m.name, f"engine metric {m.name}", labels=sorted(m.labels))
            families[m.name].add_metric([m.labels[k] for k in sorted(m.labels)], m.value)
        yield from families.values()
        mal = snap.get("mean_acceptance_length")
        if mal is not None:
            yield GaugeMetricFamily("eagle_zoo:spec_decode_mean_acceptance_length",
                                    "Tokens per verification step: 1 + accepted / drafts (NaN before any)",
                                    value=mal)
