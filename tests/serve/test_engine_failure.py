"""An engine exception fails the requests in flight with a 500 (not a hang), and the server goes on."""

from __future__ import annotations

import httpx
from serve_helpers import scrape


class BreaksOnce:
    """The real engine, except that one step raises."""

    def __init__(self, engine):
        self._engine, self.broken = engine, False

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def step(self, batch):
        if not self.broken:
            self.broken = True
            raise RuntimeError("simulated device fault")
        return self._engine.step(batch)


def test_engine_error_fails_in_flight_requests_then_recovers(inprocess):
    with inprocess(wrap=BreaksOnce) as srv:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "a", "max_tokens": 8}, timeout=60)
        assert r.status_code == 500
        assert "simulated device fault" in r.json()["error"]["message"]
        assert r.json()["error"]["type"] == "server_error"
        ok = httpx.post(srv.url + "/v1/completions", json={"prompt": "a", "max_tokens": 8, "temperature": 0},
                        timeout=60)
        assert ok.status_code == 200
        m = scrape(srv.url)
        assert m['eyas:requests_total{outcome="error"}'] == 1
        assert srv.app.state.eyas.scheduler.counts() == (0, 0)
        assert srv.app.state.eyas.scheduler._inflight == 0
