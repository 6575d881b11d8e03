"""POST once through urllib3 with a Retry policy; print the outcome as JSON.

usage: urllib3_post.py URL KEY BODY READ_TIMEOUT_SECONDS
"""
import json
import sys

import urllib3
from urllib3.util.retry import Retry

url, key, body, read_timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
retry = Retry(
    total=5,
    allowed_methods=None,  # every method, POST included
    status_forcelist=[409, 429, 500, 502, 503],
    backoff_factor=0.2,
    raise_on_status=False,
)
http = urllib3.PoolManager()
out = {"urllib3": urllib3.__version__}
try:
    r = http.request(
        "POST",
        url,
        body=body.encode(),
        headers={
            "Idempotency-Key": key,
            "Authorization": "Bearer interop-python",
            "Content-Type": "application/json",
        },
        retries=retry,
        timeout=urllib3.Timeout(connect=2.0, read=read_timeout),
    )
    out.update(
        status=r.status,
        body=r.data.decode(errors="replace"),
        replayed=r.headers.get("Idempotent-Replayed", ""),
        history=[
            {"status": h.status, "error": repr(h.error) if h.error else ""}
            for h in (r.retries.history if r.retries else ())
        ],
    )
except Exception as e:  # retries exhausted
    out["error"] = repr(e)
print(json.dumps(out))
