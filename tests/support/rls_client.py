"""A gRPC client of Envoy's rate limit service that is not tollgate's: Python
grpcio, with stubs generated from tests/support/rls.proto at start.

usage: rls_client.py HOST:PORT [CONCURRENT] < requests.jsonl > answers.jsonl

Each input line is a call: {"domain": D, "hits_addend": N, "descriptors":
[{"entries": [[K, V], ...], "hits_addend": N, "limit": [RPU, UNIT]}]}; each
output line its answer: {"overall": CODE, "statuses": [{"code", "remaining",
"limit": [RPU, UNIT, NAME] or null, "reset": S or null}], "headers": {...}},
or {"error": GRPC_CODE} when the call failed; both with "ms", the time the
call took. With CONCURRENT, that many calls are in flight at once (answers
still in input order).
"""
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

try:
    import grpc
    from grpc_tools import protoc
    import grpc_tools
except ImportError:
    sys.exit("the rls tests need Python's grpcio and grpcio-tools: pip install grpcio grpcio-tools")

here = os.path.dirname(os.path.abspath(__file__))
out = tempfile.mkdtemp(prefix="tollgate-rls-py-")
includes = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
rc = protoc.main(["protoc", f"-I{here}", f"-I{includes}", f"--python_out={out}",
                  f"--grpc_python_out={out}", os.path.join(here, "rls.proto")])
if rc != 0:
    sys.exit("protoc failed on rls.proto")
sys.path.insert(0, out)
import rls_pb2  # noqa: E402
import rls_pb2_grpc  # noqa: E402

Code = rls_pb2.RateLimitResponse.Code


def request(call):
    req = rls_pb2.RateLimitRequest(domain=call.get("domain", ""),
                                   hits_addend=call.get("hits_addend", 0))
    for d in call.get("descriptors", []):
        desc = req.descriptors.add()
        for k, v in d.get("entries", []):
            desc.entries.add(key=k, value=v)
        if "hits_addend" in d:
            desc.hits_addend.value = d["hits_addend"]
        if "limit" in d:
            desc.limit.requests_per_unit = d["limit"][0]
            desc.limit.unit = d["limit"][1]
    return req


def answer(resp):
    statuses = []
    for s in resp.statuses:
        statuses.append({
            "code": Code.Name(s.code),
            "remaining": s.limit_remaining,
            "limit": [s.current_limit.requests_per_unit, s.current_limit.unit,
                      s.current_limit.name] if s.HasField("current_limit") else None,
            "reset": s.duration_until_reset.seconds if s.HasField("duration_until_reset") else None,
        })
    headers = {h.key: h.value for h in resp.response_headers_to_add}
    return {"overall": Code.Name(resp.overall_code), "statuses": statuses, "headers": headers}


def one(stub, call):
    started = time.monotonic()
    try:
        result = answer(stub.ShouldRateLimit(request(call), timeout=10))
    except grpc.RpcError as e:
        result = {"error": e.code().name}
    result["ms"] = round((time.monotonic() - started) * 1000)
    return result


def main():
    channel = grpc.insecure_channel(sys.argv[1])
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    calls = [json.loads(line) for line in sys.stdin if line.strip()]
    concurrent = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    if concurrent > 1:
        grpc.channel_ready_future(channel).result(timeout=10)
        with ThreadPoolExecutor(concurrent) as pool:
            results = list(pool.map(lambda c: one(stub, c), calls))
    else:
        results = (one(stub, c) for c in calls)
    for result in results:
        print(json.dumps(result), flush=True)


main()
