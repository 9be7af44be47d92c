"""A sidecar's ``/metrics`` endpoint read over HTTP: ``scrape(port)`` returns
every sample by name and labels, so a test can compare two scrapes."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from .config import table


def metrics_config(port: int) -> str:
    """The ``[metrics]`` table of a sidecar serving /metrics on 127.0.0.1:``port``."""
    return table("metrics", listen=f"127.0.0.1:{port}")


class Samples(dict):
    """(sample name, frozenset of label items) -> value."""

    def value(self, name: str, **labels: str) -> float:
        """One sample (0 when the endpoint has none with these labels)."""
        return self.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum over every sample of ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.items() if n == name and want <= ls)

    def labels(self, name: str) -> list[dict[str, str]]:
        return [dict(ls) for (n, ls) in self if n == name]

    def since(self, before: "Samples", name: str, **labels: str) -> float:
        """How much one sample grew since ``before``."""
        return self.value(name, **labels) - before.value(name, **labels)


def scrape(port: int, path: str = "/metrics") -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out = Samples()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out
