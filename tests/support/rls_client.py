"""A gRPC client of Envoy's rate limit service that is not tollgate's: Python
grpcio, with stubs generated from tests/support/rls.proto at start.

usage: rls_client.py HOST:PORT < requests.jsonl > answers.jsonl

Each input line is a call: {"domain": D, "hits_addend": N, "descriptors":
[{"entries": [[K, V], ...], "hits_addend": N, "limit": [RPU, UNIT]}]}; each
output line its answer: {"overall": CODE, "statuses": [{"code", "remaining",
"limit": [RPU, UNIT, NAME] or null, "reset": S or null}], "headers": {...}},
or {"error": GRPC_CODE} when the call failed.
"""
import json
import os
import sys
import tempfile

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


def main():
    channel = grpc.insecure_channel(sys.argv[1])
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    for line in sys.stdin:
        if not line.strip():
            continue
        call = json.loads(line)
        try:
            resp = stub.ShouldRateLimit(request(call), timeout=10)
            print(json.dumps(answer(resp)), flush=True)
        except grpc.RpcError as e:
            print(json.dumps({"error": e.code().name}), flush=True)


main()
