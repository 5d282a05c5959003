#!/usr/bin/env python3
"""A Stele producer in plain Python (standard library only).

Appends records through a gateway's HTTP API (`stele gateway`) in batches,
each batch under its own idempotency key, retrying what may succeed later
(a full gateway, an unavailable cell, a dropped connection) with the same
key, so a retried batch is applied once whichever gateway takes it. Then
it reads the namespace back page by page.

    python3 examples/python/producer.py --gateway http://127.0.0.1:7460 \
        --namespace acme/orders --count 100

The API is described by the gateway's own /openapi.json; see
docs/OPERATIONS.md "Gateways and the HTTP API".
"""

import argparse
import json
import random
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

RETRYABLE = {429, 502, 503, 504}


class ApiError(Exception):
    """A typed error answer: HTTP status, kind and message."""

    def __init__(self, status, kind, message):
        super().__init__(f"{status} {kind}: {message}")
        self.status = status
        self.kind = kind


def call(method, url, body=None, headers=None, token=None, timeout=10):
    """One HTTP request; returns the decoded JSON answer or raises ApiError."""
    data = None
    hdrs = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        try:
            err = json.loads(e.read())["error"]
            kind, message = err["kind"], err["message"]
        except (ValueError, KeyError, TypeError):
            kind, message = "unknown", str(e)
        api = ApiError(e.code, kind, message)
        api.retry_after = e.headers.get("Retry-After")
        raise api from None


def with_retries(fn, attempts=8, base=0.1, cap=5.0):
    """Calls fn until it succeeds, a refusal comes, or attempts run out.

    Retries connection errors and retryable statuses, waiting Retry-After
    when the gateway gives one, else exponential backoff with jitter.
    """
    for attempt in range(attempts):
        try:
            return fn()
        except ApiError as e:
            if e.status not in RETRYABLE or attempt == attempts - 1:
                raise
            wait = float(getattr(e, "retry_after", None) or 0) or min(cap, base * 2**attempt)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if attempt == attempts - 1:
                raise
            wait = min(cap, base * 2**attempt)
        time.sleep(wait * random.uniform(0.5, 1.0))
    raise AssertionError("unreachable")


def append(gateway, namespace, records, token=None):
    """Appends one batch under a fresh idempotency key, retried with it."""
    key = str(uuid.uuid4())
    url = f"{gateway}/v1/namespaces/{namespace}/records"
    return with_retries(
        lambda: call("POST", url, records, {"Idempotency-Key": key}, token)
    )


def scan(gateway, namespace, token=None, limit=100):
    """Every record of the namespace, following cursors."""
    rows, cursor = [], ""
    while True:
        query = urllib.parse.urlencode({"limit": limit, "cursor": cursor})
        url = f"{gateway}/v1/namespaces/{namespace}/records?{query}"
        page = with_retries(lambda: call("GET", url, token=token))
        rows.extend(page["rows"])
        cursor = page.get("next_cursor")
        if not cursor:
            return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gateway", default="http://127.0.0.1:7460")
    p.add_argument("--namespace", default="example/python")
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--token", help="a namespace token (stele token issue)")
    a = p.parse_args()

    sent = 0
    run = uuid.uuid4().hex[:8]
    while sent < a.count:
        n = min(a.batch, a.count - sent)
        records = [
            {"key": f"order-{run}-{sent + i}", "value": json.dumps({"n": sent + i})}
            for i in range(n)
        ]
        out = append(a.gateway, a.namespace, records, a.token)
        if len(out["positions"]) != n:
            sys.exit(f"a batch of {n} got {len(out['positions'])} positions")
        sent += n
    print(f"appended {sent} records to {a.namespace}")

    mine = [r for r in scan(a.gateway, a.namespace, a.token) if r["key"].startswith(f"order-{run}-")]
    print(f"read back {len(mine)} records")
    if len(mine) != sent:
        sys.exit(f"wrote {sent}, read back {len(mine)}")


if __name__ == "__main__":
    main()
