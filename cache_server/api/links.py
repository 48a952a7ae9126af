"""OpenAPI links: which answer's field names the resource another operation takes.

A client generator (and a stateful fuzzer) follows them: the record an upload made can be read
back, the job a claim leased can be heartbeaten, completed or failed, the token made can be
revoked. Operation ids are FastAPI's, from the route functions' names.
"""

from __future__ import annotations

from typing import Any

# (path, method, status, link name, target operation id, {parameter: runtime expression})
LINKS: tuple[tuple[str, str, str, str, str, dict[str, str]], ...] = (
    ("/v1/records", "post", "201", "GetRecord", "get_record_v1_records__record_id__get",
     {"record_id": "$response.body#/record_id"}),
    ("/v1/jobs", "post", "201", "GetJob", "get_job_v1_jobs__job_id__get",
     {"job_id": "$response.body#/job/id"}),
    ("/v1/misses", "post", "202", "GetJob", "get_job_v1_jobs__job_id__get",
     {"job_id": "$response.body#/job/id"}),
    ("/v1/jobs/claim", "post", "200", "Heartbeat", "heartbeat_v1_jobs__job_id__heartbeat_post",
     {"job_id": "$response.body#/id"}),
    ("/v1/jobs/claim", "post", "200", "Complete", "complete_v1_jobs__job_id__complete_post",
     {"job_id": "$response.body#/id"}),
    ("/v1/jobs/claim", "post", "200", "Fail", "fail_v1_jobs__job_id__fail_post",
     {"job_id": "$response.body#/id"}),
    ("/v1/tokens", "post", "201", "Revoke", "revoke_token_v1_tokens__token_id__delete",
     {"token_id": "$response.body#/info/id"}),
)  # fmt: skip


def add_links(schema: dict[str, Any]) -> None:
    """Adds :data:`LINKS` to an OpenAPI document (those whose operations it has)."""
    ids = {op.get("operationId") for ops in schema.get("paths", {}).values() for op in ops.values()}
    for path, method, status, name, target, parameters in LINKS:
        operation = schema.get("paths", {}).get(path, {}).get(method)
        if operation is None or target not in ids or status not in operation["responses"]:
            continue
        links = operation["responses"][status].setdefault("links", {})
        links[name] = {"operationId": target, "parameters": parameters}
