"""The twin's stand-in for what google_tpu_v2_vm does: create or delete the node through the TPU
API at TPUCTL_TPU_API_ENDPOINT (nothing when it is not set), as the real provider would, and
write what the provider would read back into its state (read_back_file), for main.tf to compare.

    python3 tpu_node.py create '{"project": "p", "zone": "z", "name": "n", ...}'
    python3 tpu_node.py delete '{"project": "p", "zone": "z", "name": "n", ...}'
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request


def call(method: str, url: str, body: dict | None = None) -> dict | None:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        return json.loads(urllib.request.urlopen(request, timeout=30).read() or b"{}")
    except urllib.error.HTTPError as exc:
        if method == "DELETE" and exc.code == 404:
            return None
        sys.exit(f"TPU API {method} {url}: {exc.code} {exc.read().decode()[:300]}")


def wait(endpoint: str, operation: dict | None) -> dict | None:
    """Follow a long-running operation to its end, as the provider does; fail on its error;
    return its response (the node, for a creation)."""
    while operation and not operation.get("done"):
        time.sleep(0.05)
        operation = call("GET", f"{endpoint}/v2/{operation['name']}")
    if operation and "error" in operation:
        error = operation["error"]
        sys.exit(f"Error waiting to create Node: {error.get('status', '')} "
                 f"{error.get('message', '')}")
    return (operation or {}).get("response")


def sent_scheduling(blocks: list[dict]) -> dict | None:
    """The schedulingConfig the provider sends (expandTpuV2VmSchedulingConfig): nothing without
    a block; with one, preemptible and reserved as they are and spot only when true."""
    if not blocks:
        return None
    block = blocks[0]
    sent = {"preemptible": bool(block.get("preemptible")), "reserved": bool(block.get("reserved"))}
    if block.get("spot"):
        sent["spot"] = True
    return sent


def api_answer(sent: dict) -> dict:
    """The node as the API answers it: proto3 JSON leaves out fields at their default (false)."""
    answer = dict(sent)
    if "schedulingConfig" in answer:
        answer["schedulingConfig"] = {k: v for k, v in answer["schedulingConfig"].items() if v}
    return answer


def read_back_scheduling(answer: dict | None) -> list[dict]:
    """The provider's flattenTpuV2VmSchedulingConfig: no schedulingConfig, or an empty one (what
    the API answers for an on-demand node: proto3 JSON leaves out false fields), is no block."""
    if not answer:
        return []
    return [{key: bool(answer.get(key)) for key in ("preemptible", "reserved", "spot")}]


def write_read_back(path: str, node: dict) -> None:
    with open(path, "w", encoding="utf-8") as out:
        json.dump({"scheduling_config": read_back_scheduling(node.get("schedulingConfig"))}, out)


def main() -> None:
    endpoint = os.environ.get("TPUCTL_TPU_API_ENDPOINT")
    verb, spec = sys.argv[1], json.loads(sys.argv[2])
    read_back = spec["read_back_file"]
    if verb == "delete":
        if os.path.exists(read_back):
            os.remove(read_back)
        if endpoint:
            nodes = f"{endpoint}/v2/projects/{spec['project']}/locations/{spec['zone']}/nodes"
            wait(endpoint, call("DELETE", f"{nodes}/{spec['name']}"))
        return
    body = {
        "acceleratorType": spec["accelerator_type"],
        "runtimeVersion": spec["runtime_version"],
        "labels": spec["labels"],
        "metadata": {"ssh-keys": spec["ssh_keys"]},
        "networkConfig": {"enableExternalIps": False},
        "serviceAccount": {"email": spec["service_account"]},
        "tags": [spec["network_tag"]],
    }
    scheduling = sent_scheduling(spec["scheduling"])
    if scheduling is not None:
        body["schedulingConfig"] = scheduling
    if not endpoint:
        write_read_back(read_back, api_answer(body))
        return
    nodes = f"{endpoint}/v2/projects/{spec['project']}/locations/{spec['zone']}/nodes"
    node = wait(endpoint, call("POST", f"{nodes}?nodeId={spec['name']}", body))
    write_read_back(read_back, node or call("GET", f"{nodes}/{spec['name']}") or {})


if __name__ == "__main__":
    main()
